"""The deployment files: ``compose.yaml``, ``deploy/k8s/*.yaml``, ``deploy/Dockerfile``.

They parse, their parts point at each other (images, ConfigMaps, Secrets, labels, ports), and
every command they run is one the installed programs accept: a ``bulksync …`` command parses
with bulksync's own argument parser and names graph modules that exist, a ``celery … flower``
command uses only options Celery and Flower define. No Docker engine or cluster is needed;
``docker compose config`` is run too when a compose client is installed.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

import bulksync.settings
from bulksync.cli import build_parser
from bulksync.graph.compiled import CompiledStateGraph
from bulksync.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
K8S = ROOT / "deploy" / "k8s"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
ENV_EXAMPLE = ROOT / "deploy" / "env.example"
CI_SCRIPTS = (ROOT / ".ci" / "run", ROOT / ".ci" / "services")
COMPOSE_SERVICES = {"redis", "postgres", "coordinator", "worker", "api", "flower"}
# Services that run the project's image, and the programs they may start.
APP_SERVICES = ("coordinator", "worker", "api", "flower")
APP_PROGRAMS = {"bulksync", "celery"}
FLOWER_PORT = 5555
VARIABLE = re.compile(r"\bBULKSYNC_[A-Z0-9_]+\b")


def load_compose() -> dict[str, Any]:
    """``compose.yaml`` as one mapping."""
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict), f"{COMPOSE} is not a YAML mapping"
    return data


def k8s_files() -> list[Path]:
    """Every manifest under ``deploy/k8s``."""
    return sorted(K8S.glob("*.yaml"))


def load_k8s() -> list[tuple[str, dict[str, Any]]]:
    """Every document of every manifest, each with ``<file>:<kind>/<name>`` to name it."""
    docs = []
    for path in k8s_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None:  # an empty document, e.g. a trailing ---
                continue
            assert isinstance(doc, dict), f"{path.name}: a document is not a mapping"
            name = doc.get("metadata", {}).get("name")
            docs.append((f"{path.name}:{doc.get('kind')}/{name}", doc))
    return docs


def k8s_of_kind(kind: str) -> list[tuple[str, dict[str, Any]]]:
    """The manifests' documents of ``kind``."""
    return [(where, doc) for where, doc in load_k8s() if doc.get("kind") == kind]


def k8s_containers() -> list[tuple[str, dict[str, Any]]]:
    """Every container of every Deployment, named ``<file>:Deployment/<name>/<container>``."""
    found = []
    for where, doc in k8s_of_kind("Deployment"):
        for container in doc["spec"]["template"]["spec"]["containers"]:
            found.append((f"{where}/{container['name']}", container))
    return found


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A compose service's ``environment``, whether written as a mapping or as a list."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.partition("=")[::2] for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def argv_of(command: str | list[str]) -> list[str]:
    """A command as its argument list (compose accepts a string or a list)."""
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def service_commands() -> list[tuple[str, list[str]]]:
    """Every command a compose service or a k8s container runs, named by where it is."""
    commands = [
        (f"compose.yaml:{name}", argv_of(service["command"]))
        for name, service in load_compose()["services"].items()
        if "command" in service
    ]
    for where, container in k8s_containers():
        argv = [*container.get("command", []), *container.get("args", [])]
        if argv:
            commands.append((where, [str(a) for a in argv]))
    return commands


def documented_commands() -> list[tuple[str, list[str]]]:
    """``bulksync …`` commands the files' comments tell a reader to run in a container.

    They follow ``docker compose exec <service>`` or ``kubectl exec <pod> --``.
    """
    found = []
    for path in [COMPOSE, *k8s_files()]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = re.search(r"^\s*#.*\bexec\b.*?\s(bulksync\s.*)$", line)
            if match:
                found.append((f"{path.name} line {number}", shlex.split(match.group(1))))
    return found


def our_containers() -> set[str]:
    """Where the bulksync image runs: the compose app services and every k8s container."""
    return {f"compose.yaml:{name}" for name in APP_SERVICES} | {w for w, _ in k8s_containers()}


# --- compose.yaml -----------------------------------------------------------------------------


def test_compose_has_the_six_services() -> None:
    assert set(load_compose()["services"]) == COMPOSE_SERVICES


def test_compose_workers_can_scale() -> None:
    worker = load_compose()["services"]["worker"]
    # `--scale worker=N` needs N containers with distinct names and no host port clash.
    assert "container_name" not in worker
    assert "ports" not in worker


def test_compose_app_services_build_the_dockerfile() -> None:
    services = load_compose()["services"]
    images = set()
    for name in APP_SERVICES:
        build = services[name]["build"]
        dockerfile = (ROOT / build["context"] / build.get("dockerfile", "Dockerfile")).resolve()
        assert dockerfile == DOCKERFILE, f"compose service {name} builds {dockerfile}"
        images.add(services[name]["image"])
    assert len(images) == 1, f"the app services tag different images: {sorted(images)}"


def test_compose_app_services_get_valid_settings() -> None:
    services = load_compose()["services"]
    for name in APP_SERVICES:
        env = environment(services[name])
        missing = {"BULKSYNC_BROKER_URL", "BULKSYNC_REDIS_URL", "BULKSYNC_DATABASE_URL"} - set(env)
        assert not missing, f"compose service {name} does not set {sorted(missing)}"
        Settings.from_env(env)  # raises, naming the variable, on a URL bulksync cannot use


def test_compose_waits_for_healthy_services() -> None:
    services = load_compose()["services"]
    assert "healthcheck" in services["postgres"]
    for name, service in services.items():
        for dependency, rule in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on unknown service {dependency}"
            if rule.get("condition") == "service_healthy":
                assert "healthcheck" in services[dependency], (
                    f"{name} waits for {dependency} to be healthy, which has no healthcheck"
                )


def test_compose_flower_publishes_its_port_behind_basic_auth() -> None:
    flower = load_compose()["services"]["flower"]
    published = set()
    for port in flower.get("ports", []):
        if isinstance(port, dict):
            published.add(str(port.get("published")))
        else:
            published.add(str(port).split(":")[-2] if ":" in str(port) else str(port))
    assert str(FLOWER_PORT) in published
    auth = environment(flower).get("FLOWER_BASIC_AUTH", "")
    argv = argv_of(flower["command"])
    assert auth or any(re.match(r"--basic[-_]auth=.", a) for a in argv), (
        "Flower in compose.yaml has no basic auth (FLOWER_BASIC_AUTH or --basic-auth=)"
    )


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client installed")
def test_docker_compose_accepts_the_file() -> None:
    # `docker compose config` only parses and validates: no engine needed, but the compose
    # plugin may be missing even where the docker client is installed.
    version = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, text=True, timeout=60, check=False
    )
    if version.returncode != 0:
        pytest.skip("the docker client has no compose plugin")
    result = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


# --- deploy/k8s -------------------------------------------------------------------------------


def test_k8s_manifests_are_named_resources() -> None:
    names = {path.name for path in k8s_files()}
    assert {"config.yaml", "coordinator.yaml", "worker.yaml", "flower.yaml"} <= names
    for where, doc in load_k8s():
        assert doc.get("apiVersion"), f"{where} has no apiVersion"
        assert doc.get("kind"), f"{where} has no kind"
        assert doc.get("metadata", {}).get("name"), f"{where} has no metadata.name"


def test_k8s_deployments_select_their_own_pods() -> None:
    for where, doc in k8s_of_kind("Deployment"):
        wanted = doc["spec"]["selector"]["matchLabels"]
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert wanted.items() <= labels.items(), f"{where}: selector does not match its pods"


def test_k8s_containers_run_one_image_with_the_config() -> None:
    config_maps = {doc["metadata"]["name"] for _, doc in k8s_of_kind("ConfigMap")}
    images = {container["image"] for _, container in k8s_containers()}
    assert images == {load_compose()["services"]["worker"]["image"]}, (
        f"k8s containers run {sorted(images)}, compose builds a different image"
    )
    for where, container in k8s_containers():
        refs = {
            e["configMapRef"]["name"] for e in container.get("envFrom", []) if "configMapRef" in e
        }
        assert refs & config_maps, f"{where} takes no envFrom from a ConfigMap in deploy/k8s"


def test_k8s_config_holds_valid_settings() -> None:
    (where, config), *others = k8s_of_kind("ConfigMap")
    assert not others, "one ConfigMap is expected in deploy/k8s"
    data = config["data"]
    missing = {"BULKSYNC_BROKER_URL", "BULKSYNC_REDIS_URL", "BULKSYNC_DATABASE_URL"} - set(data)
    assert not missing, f"{where} does not set {sorted(missing)}"
    Settings.from_env(data)


def test_k8s_secrets_referenced_exist() -> None:
    secrets = {
        doc["metadata"]["name"]: set(doc.get("stringData", {})) | set(doc.get("data", {}))
        for _, doc in k8s_of_kind("Secret")
    }
    for where, container in k8s_containers():
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                assert source["secretRef"]["name"] in secrets, f"{where}: unknown Secret"
        for variable in container.get("env", []):
            ref = variable.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["key"] in secrets.get(ref["name"], set()), (
                    f"{where}: {variable['name']} reads missing key {ref['name']}/{ref['key']}"
                )


def test_k8s_containers_have_probes_that_bulksync_runs() -> None:
    for where, container in k8s_containers():
        for kind in ("readinessProbe", "livenessProbe"):
            probe = container.get(kind)
            assert probe, f"{where} has no {kind}"
            if "exec" in probe:
                check_bulksync(f"{where} {kind}", [str(a) for a in probe["exec"]["command"]])
            else:
                assert probe["httpGet"]["path"].startswith("/"), f"{where}: {kind} has no path"


def test_dockerfile_checks_the_health_of_what_it_runs() -> None:
    checks = [a for k, a in dockerfile_instructions() if k == "HEALTHCHECK"]
    assert checks, "the Dockerfile has no HEALTHCHECK"
    argv = json.loads(checks[-1].partition("CMD")[2])
    check_bulksync("Dockerfile HEALTHCHECK", argv)


def test_k8s_workers_start_with_two_replicas() -> None:
    (workers,) = [doc for where, doc in k8s_of_kind("Deployment") if where.startswith("worker")]
    assert workers["spec"]["replicas"] == 2


def test_k8s_flower_is_served_on_its_port_behind_basic_auth() -> None:
    (flower,) = [c for where, c in k8s_containers() if where.startswith("flower.yaml")]
    secrets = {doc["metadata"]["name"]: doc for _, doc in k8s_of_kind("Secret")}
    from_secret = any(
        "FLOWER_BASIC_AUTH" in secrets.get(e["secretRef"]["name"], {}).get("stringData", {})
        for e in flower.get("envFrom", [])
        if "secretRef" in e
    )
    assert from_secret or any(v["name"] == "FLOWER_BASIC_AUTH" for v in flower.get("env", []))
    ports = {p.get("name"): p["containerPort"] for p in flower["ports"]}
    assert FLOWER_PORT in ports.values()
    (service,) = [doc for where, doc in k8s_of_kind("Service") if where.startswith("flower")]
    (pod,) = [doc for where, doc in k8s_of_kind("Deployment") if where.startswith("flower")]
    labels = pod["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["port"] == FLOWER_PORT
    assert ports.get(port["targetPort"], port["targetPort"]) == FLOWER_PORT


# --- the commands they run --------------------------------------------------------------------


def check_bulksync(where: str, argv: list[str]) -> None:
    """Fail unless bulksync's parser accepts ``argv`` and its graph references resolve."""
    stderr = io.StringIO()
    exit_code: str | int | None = None
    try:
        with contextlib.redirect_stderr(stderr):
            build_parser().parse_args(argv[1:])
    except SystemExit as exc:  # argparse's way to reject a command line (or to show --help)
        exit_code = exc.code if exc.code is not None else 0
    if exit_code is not None:  # failed outside the handler: no exception chain in the report
        pytest.fail(
            f"{where} runs `{shlex.join(argv)}`, which the bulksync CLI rejects "
            f"(exit {exit_code}): {stderr.getvalue().strip()}",
            pytrace=False,
        )
    for ref in graph_refs(argv):
        check_graph_ref(where, ref)
    if argv[1:2] == ["flower"]:  # the rest goes to Flower unchanged: it must know each option
        check_flower_options(where, argv[2:])


def graph_refs(argv: list[str]) -> list[str]:
    """Graph ids in a bulksync command: ``--graph`` values and ``pkg.module:attr`` arguments."""
    refs = []
    for i, arg in enumerate(argv):
        if arg == "--graph" and i + 1 < len(argv):
            refs.append(argv[i + 1])
        elif arg.startswith("--graph="):
            refs.append(arg.partition("=")[2])
        elif re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", arg):
            refs.append(arg)
    return refs


def check_graph_ref(where: str, ref: str) -> None:
    """Fail unless ``pkg.module[:attr]`` names an installed module holding a compiled graph."""
    module_name, _, attr = ref.partition(":")
    if importlib.util.find_spec(module_name) is None:
        pytest.fail(f"{where} names graph module {module_name}, which is not installed")
    module = importlib.import_module(module_name)
    if attr:
        value = getattr(module, attr, None)
        assert isinstance(value, CompiledStateGraph), (
            f"{where} names graph {ref}, but {module_name}.{attr} is not a compiled graph"
        )
    else:
        graphs = [n for n, v in vars(module).items() if isinstance(v, CompiledStateGraph)]
        assert graphs, f"{where} loads graph module {module_name}, which compiles no graph"


def check_celery_flower(where: str, argv: list[str]) -> None:
    """Fail unless ``celery [opts] flower [opts]`` uses only options Celery and Flower define."""
    from celery.bin.celery import celery

    assert "flower" in argv, f"{where} runs celery but not its flower command: {argv}"
    split = argv.index("flower")
    celery_options = {opt for param in celery.params for opt in param.opts}
    for arg in argv[1:split]:
        if arg.startswith("-"):
            name = arg.partition("=")[0]
            assert name in celery_options, f"{where}: celery has no option {name}"
    check_flower_options(where, argv[split + 1 :])


def check_flower_options(where: str, argv: list[str]) -> None:
    """Fail unless every ``--option`` in ``argv`` is one of Flower's."""
    from flower.options import default_options

    for arg in argv:
        if arg.startswith("--"):
            name = arg[2:].partition("=")[0]
            assert name in default_options, f"{where}: Flower has no option --{name}"


def check_flower_variables(where: str, names: set[str]) -> None:
    """Fail unless every ``FLOWER_*`` variable in ``names`` sets a Flower option."""
    from flower.options import default_options

    for name in names:
        if name.startswith("FLOWER_"):
            option = name.removeprefix("FLOWER_").lower()
            assert option in default_options, f"{where}: Flower has no option for {name}"


@pytest.mark.parametrize(
    ("where", "argv"), [pytest.param(w, a, id=w) for w, a in service_commands()]
)
def test_service_command_exists(where: str, argv: list[str]) -> None:
    program = argv[0]
    if program == "bulksync":
        check_bulksync(where, argv)
    elif program == "celery":
        check_celery_flower(where, argv)
    else:  # third-party images (redis-server, …) run their own programs; ours may not
        assert where not in our_containers(), (
            f"{where} runs {program}; the bulksync image runs only {sorted(APP_PROGRAMS)}"
        )


@pytest.mark.parametrize(
    ("where", "argv"), [pytest.param(w, a, id=w) for w, a in documented_commands()]
)
def test_documented_command_exists(where: str, argv: list[str]) -> None:
    check_bulksync(where, argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["bulksync", "no-such-command"],
        ["bulksync", "demo", "--graph", "bulksync.demo"],  # demo takes no --graph
        ["bulksync", "flower", "--no-such-option=1"],
        ["celery", "--no-such-option=1", "flower"],
        ["celery", "--broker=redis://x", "flower", "--no-such-option=1"],
        ["celery", "--broker=redis://x", "worker"],
    ],
    ids=shlex.join,
)
def test_command_checks_reject_bad_commands(argv: list[str]) -> None:
    # The checks above are only worth something if they can fail.
    check = check_bulksync if argv[0] == "bulksync" else check_celery_flower
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        check("here", argv)


@pytest.mark.parametrize("ref", ["bulksync.no_such_module", "bulksync.demo:nope", "bulksync.ids"])
def test_graph_check_rejects_bad_references(ref: str) -> None:
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        check_graph_ref("here", ref)


def test_flower_variable_check_rejects_unknown_options() -> None:
    with pytest.raises(AssertionError, match="FLOWER_NO_SUCH_OPTION"):
        check_flower_variables("here", {"FLOWER_NO_SUCH_OPTION"})


def test_flower_variables_are_flower_options() -> None:
    for name in APP_SERVICES:
        check_flower_variables(
            f"compose.yaml:{name}", set(environment(load_compose()["services"][name]))
        )
    for where, doc in k8s_of_kind("Secret"):
        check_flower_variables(where, set(doc.get("stringData", {})) | set(doc.get("data", {})))


# --- Dockerfile, variables, CI scripts --------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def test_dockerfile_builds_a_non_root_image_of_the_project() -> None:
    instructions = dockerfile_instructions()
    keywords = [k for k, _ in instructions]
    assert keywords[0] == "FROM", "a Dockerfile starts with FROM"
    assert instructions[0][1].startswith("python:3.11")
    # The project itself, with the extras its services need (`.[api]`).
    assert any(k == "RUN" and re.search(r"pip install '?\.", a) for k, a in instructions)
    users = [a for k, a in instructions if k == "USER"]
    assert users and users[-1] not in ("root", "0"), "the image must not run as root"
    cmd = [a for k, a in instructions if k == "CMD"]
    assert cmd, "the Dockerfile has no CMD"


def test_dockerfile_copies_files_that_exist() -> None:
    # compose.yaml builds with the repository root as the context.
    for keyword, args in dockerfile_instructions():
        if keyword == "COPY":
            *sources, _ = [a for a in args.split() if not a.startswith("--")]
            for source in sources:
                assert (ROOT / source).exists(), f"deploy/Dockerfile copies missing {source}"


def settings_variables() -> set[str]:
    """The variables of the settings declared in ``bulksync/settings.py``."""
    return {declared.env for declared in bulksync.settings.declarations()}


def test_settings_table_is_found() -> None:
    assert {"BULKSYNC_BROKER_URL", "BULKSYNC_REDIS_URL", "BULKSYNC_DATABASE_URL"} <= (
        settings_variables()
    )


@pytest.mark.parametrize(
    "path", [COMPOSE, DOCKERFILE, ENV_EXAMPLE, *k8s_files()], ids=lambda p: p.name
)
def test_variables_used_are_settings(path: Path) -> None:
    unknown = set(VARIABLE.findall(path.read_text())) - settings_variables()
    assert not unknown, f"{path.name} uses {sorted(unknown)}, not in bulksync/settings.py"


def test_env_example_lists_every_setting() -> None:
    listed = set(re.findall(r"^(BULKSYNC_[A-Z0-9_]+)=", ENV_EXAMPLE.read_text(), re.MULTILINE))
    assert settings_variables() <= listed, f"add {sorted(settings_variables() - listed)}"
    assert "FLOWER_BASIC_AUTH=" in ENV_EXAMPLE.read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("script", CI_SCRIPTS, ids=lambda p: p.name)
def test_ci_script_parses(script: Path) -> None:
    result = subprocess.run(
        ["bash", "-n", str(script)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
