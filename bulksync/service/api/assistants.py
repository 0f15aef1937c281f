"""``/assistants``: one assistant per graph the API process loaded (``--graph``).

An assistant is named by its graph id (``pkg.module:attr``) or by its id (uuid5 of the graph
id); both work wherever the Agent Server takes an ``assistant_id``. Assistants are not
created, changed or deleted through the API: they are the graphs loaded.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from bulksync.graph.layout import builder_drawable
from bulksync.service.api import encode
from bulksync.service.api.app import Backend, backend
from bulksync.service.api.bodies import AssistantSearch

router = APIRouter(tags=["assistants"])
Server = Annotated[Backend, Depends(backend)]


def graph_id_of(server: Backend, assistant_id: str) -> str:
    """The graph id an ``assistant_id`` (a graph id or an assistant's uuid) stands for.

    Raises:
        LookupError: no graph loaded here is meant (the loaded ones named).
    """
    if assistant_id in server.registry:
        return assistant_id
    for graph_id in server.registry.ids():
        if encode.assistant_id(graph_id) == assistant_id:
            return graph_id
    loaded = ", ".join(server.registry.ids()) or "none"
    raise LookupError(
        f"no assistant '{assistant_id}': this server loaded the graphs {loaded}; start "
        "`bulksync api` with --graph for another"
    )


def _record(server: Backend, graph_id: str) -> dict[str, Any]:
    return encode.assistant(graph_id, server.started)


def _matching(server: Backend, body: AssistantSearch) -> list[str]:
    found = []
    for graph_id in server.registry.ids():
        if body.graph_id not in (None, graph_id) or body.name not in (None, graph_id):
            continue
        if body.metadata and any(
            {"created_by": "system"}.get(k) != v for k, v in body.metadata.items()
        ):
            continue
        found.append(graph_id)
    return found


@router.post("/assistants/search")
def search(server: Server, body: AssistantSearch) -> list[dict[str, Any]]:
    """The assistants matching every filter given, a page of them."""
    page = _matching(server, body)[body.offset : body.offset + body.limit]
    return [_record(server, graph_id) for graph_id in page]


@router.post("/assistants/count")
def count(server: Server, body: AssistantSearch | None = None) -> int:
    """How many assistants match every filter given."""
    return len(_matching(server, body or AssistantSearch()))


@router.get("/assistants/{assistant_id}")
def get(server: Server, assistant_id: str) -> dict[str, Any]:
    """The assistant."""
    return _record(server, graph_id_of(server, assistant_id))


@router.get("/assistants/{assistant_id}/graph")
def graph(
    server: Server, assistant_id: str, xray: Annotated[str, Query()] = "false"
) -> dict[str, Any]:
    """The graph's drawing (``xray``: true, false or how many subgraph levels to expand)."""
    compiled: Any = server.registry.get(graph_id_of(server, assistant_id))
    depth: bool | int = xray.lower() in ("true", "1") if not xray.isdigit() else int(xray)
    builder = getattr(compiled, "builder", None)
    if builder is None:  # an entrypoint: its own drawing
        return encode.graph(compiled.get_graph(xray=depth))
    return encode.graph(builder_drawable(builder, compiled.spec, xray=depth))


@router.get("/assistants/{assistant_id}/schemas")
def schemas(server: Server, assistant_id: str) -> dict[str, Any]:
    """The JSON schemas of the graph's input, output, state, config and context."""
    graph_id = graph_id_of(server, assistant_id)
    builder = getattr(server.registry.get(graph_id), "builder", None)
    return {"graph_id": graph_id, **_schemas(builder)}


@router.get("/assistants/{assistant_id}/subgraphs")
def subgraphs(server: Server, assistant_id: str) -> dict[str, Any]:
    """The graph's subgraph nodes, each with its schemas, by node name."""
    compiled = server.registry.get(graph_id_of(server, assistant_id))
    found: dict[str, Any] = {}
    for name, node in compiled.spec.nodes.items():
        sub = node.subgraph
        if sub is None:
            continue
        found[name] = {"graph_id": name, **_schemas(getattr(sub, "builder", None))}
    return found


def _schemas(builder: Any) -> dict[str, Any]:
    names = ("input_schema", "output_schema", "state_schema", "context_schema")
    return {
        **{name: json_schema(getattr(builder, name, None)) for name in names},
        "config_schema": None,
    }


def json_schema(schema: Any) -> dict[str, Any] | None:
    """The JSON schema of a TypedDict, dataclass or pydantic model; None for other types, or
    for one whose fields pydantic cannot describe (arbitrary classes in the state)."""
    if schema is None or not isinstance(schema, type):
        return None
    from pydantic import ConfigDict, TypeAdapter, create_model

    try:
        if typing.is_typeddict(schema):
            # pydantic takes only typing_extensions' TypedDict before Python 3.12: describe
            # the same fields as a model (the keys it may lack are optional).
            hints = typing.get_type_hints(schema, include_extras=True)
            required = getattr(schema, "__required_keys__", frozenset(hints))
            fields: dict[str, Any] = {
                name: (hint, ... if name in required else None) for name, hint in hints.items()
            }
            config = ConfigDict(arbitrary_types_allowed=True)
            model = create_model(schema.__name__, __config__=config, **fields)
            produced: dict[str, Any] = model.model_json_schema()
        else:
            produced = TypeAdapter(schema).json_schema()
    except Exception:  # any failure to describe it: no schema rather than no answer
        return None
    return produced
