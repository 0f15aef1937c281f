"""The ``/ui`` run view in a real browser: headless Chromium (Debian's ``chromium``, driven by
Playwright) on ``bulksync api`` over a real cluster.

The run page follows a ``Send`` fan-out while it runs: the ``square`` node's done count goes
up step by step to all its tasks, the run ends as success and the page shows its output; a
screenshot of it is kept (``BULKSYNC_ARTIFACTS``, by default ``.artifacts/`` at the root).
The runs list shows the run; with API keys set the pages ask for a key and then work.
Without chromium the tests skip here, and fail under ``CI`` (``.ci/services`` installs it).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import require_service
from tests.integration.api.conftest import FANOUT, ROOT, ApiServer, wait_for_http
from tests.integration.private_services import free_port

pytestmark = pytest.mark.integration

ARTIFACTS = Path(os.environ.get("BULKSYNC_ARTIFACTS") or ROOT / ".artifacts")
WAIT_MS = 45_000
ITEMS = list(range(1, 25))

# Every value the square node's data-done attribute takes, in order, recorded as the page
# sets it: a page may set several in one task, so polling alone could miss one.
RECORD_DONE = """
window.__doneSeen = [];
new MutationObserver((records) => {
  for (const record of records) {
    if (record.target.getAttribute("data-node") !== "square") continue;
    window.__doneSeen.push(Number(record.oldValue), Number(record.target.dataset.done));
  }
}).observe(document, {
  subtree: true, attributes: true, attributeFilter: ["data-done"], attributeOldValue: true,
});
"""


def chromium() -> str:
    """Debian's chromium, or a clear failure (skip locally, fail under CI)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")

    def check() -> None:
        if found is None:
            raise FileNotFoundError("no chromium on PATH; apt-get install chromium")
        import playwright.sync_api  # noqa: F401 - the test extra's driver

    require_service("Chromium (Debian's chromium with the playwright package)", check)
    assert found is not None
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium of the module (never Playwright's own download)."""
    executable = chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=executable, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page; a script error on it fails the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 1100})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield opened
    finally:
        context.close()
    assert not errors, f"the page's scripts failed: {errors}"


def start_fanout(server: ApiServer, items: list[int], seconds: float) -> dict[str, Any]:
    """Queue a fan-out in the background; its run record."""
    with server.sdk() as client:
        thread = client.threads.create()
        run: dict[str, Any] = client.runs.create(
            thread["thread_id"],
            FANOUT,
            input={"items": items, "seconds": seconds},
            stream_mode=["values"],
        )
        return run


def save_screenshot(page: Any, tmp_path: Path, name: str) -> Path:
    """The page's screenshot in the test's directory and in the artifacts directory."""
    shot = tmp_path / name
    page.screenshot(path=str(shot), full_page=True)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    kept = ARTIFACTS / name
    shutil.copyfile(shot, kept)
    return kept


def test_run_page_follows_a_fanout_node_by_node(
    api_server: ApiServer, page: Any, tmp_path: Path
) -> None:
    page.add_init_script(RECORD_DONE)
    run = start_fanout(api_server, ITEMS, 0.3)
    page.goto(f"{api_server.url}/ui/runs/{run['run_id']}")

    square = page.locator('[data-node="square"]')
    square.wait_for(timeout=WAIT_MS)  # the graph is drawn
    assert page.locator('[data-node="sum"]').count() == 1
    assert page.locator('.edge.conditional[data-target="square"]').count() == 1
    page.wait_for_function(
        "() => document.getElementById('run-status').dataset.status === 'success'",
        timeout=WAIT_MS,
    )
    page.locator("#run-output:not(.muted)").wait_for(timeout=WAIT_MS)

    seen: list[int] = page.evaluate("window.__doneSeen")
    between = [i for i, done in enumerate(seen) if 0 < done < len(ITEMS)]
    assert between, f"square's done count never showed a run in progress: {seen}"
    assert len(ITEMS) in seen[between[0] :], seen  # ... and later all of its tasks
    assert square.get_attribute("data-done") == str(len(ITEMS))
    assert square.get_attribute("data-failed") == "0"
    assert square.get_attribute("data-running") == "0"
    assert square.get_attribute("data-queued") == "0"
    assert square.get_attribute("data-state") == "done"
    assert page.locator("#run-status").inner_text() == "success"
    assert page.locator('#steps tr[data-step] [data-cell="tasks"]', has_text="24 / 24").count()
    output = page.locator("#run-output").inner_text()
    assert '"total": 4900' in output  # 1² + 2² + ... + 24²
    kept = save_screenshot(page, tmp_path, "ui-run.png")
    assert kept.stat().st_size > 0


def test_runs_page_lists_runs_and_links_to_them(api_server: ApiServer, page: Any) -> None:
    run = start_fanout(api_server, [1, 2, 3], 0.0)
    page.goto(f"{api_server.url}/ui")
    row = page.locator(f'tr[data-run-id="{run["run_id"]}"]')
    row.wait_for(timeout=WAIT_MS)
    assert FANOUT in row.inner_text() and run["thread_id"] in row.inner_text()
    page.wait_for_function(  # the list is read again every 2 s: the run ends in it
        f"() => document.querySelector('tr[data-run-id=\"{run['run_id']}\"]')"
        "?.dataset.status === 'success'",
        timeout=WAIT_MS,
    )
    row.locator("a").click()
    page.wait_for_url(f"**/ui/runs/{run['run_id']}")
    page.wait_for_function(
        "() => document.getElementById('run-status').dataset.status === 'success'",
        timeout=WAIT_MS,
    )
    page.locator("#run-output:not(.muted)").wait_for(timeout=WAIT_MS)  # read after the end
    assert '"total": 14' in page.locator("#run-output").inner_text()


def test_pages_are_open_and_their_data_asks_for_the_key(api_server: ApiServer, page: Any) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    api = api_server.start(
        "api",
        "--graph",
        "tests.integration.api.graphs",
        "--port",
        str(port),
        "--loglevel",
        "WARNING",
        env={"BULKSYNC_API_KEYS": "ui-test-key"},
    )
    try:
        wait_for_http(api, url)
        with httpx.Client(base_url=url, timeout=10) as http:
            assert http.get("/ui").status_code == 200
            assert http.get("/ui/runs/whatever").status_code == 200
            assert http.get("/ui/static/run.js").status_code == 200
            assert http.get("/ui/api/runs").status_code == 401
            assert http.get("/uix").status_code == 401  # only /ui itself and below are open
            keyed = http.get("/ui/api/runs", headers={"x-api-key": "ui-test-key"})
            assert keyed.status_code == 200
            missing = http.get("/ui/api/runs/nope", headers={"x-api-key": "ui-test-key"})
            assert missing.status_code == 404 and "nope" in missing.json()["detail"]
        run = start_fanout(api_server, [2, 3], 0.0)  # on the module's server: same database
        page.goto(f"{url}/ui")
        page.locator("#key-form").wait_for(timeout=WAIT_MS)
        page.fill("#key-input", "ui-test-key")
        page.click("#key-form button")
        page.locator(f'tr[data-run-id="{run["run_id"]}"]').wait_for(timeout=WAIT_MS)
        assert page.evaluate("localStorage.getItem('bulksync.apiKey')") == "ui-test-key"
    finally:
        api.stop()
