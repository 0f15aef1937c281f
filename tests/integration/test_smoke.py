from __future__ import annotations

from typing import Any

from bulksync.demo import build_demo_graph, demo_input


def test_demo_runs_on_celery(cluster: Any) -> None:
    graph = build_demo_graph().compile()
    remote = cluster.attach(graph)
    out = remote.invoke(demo_input(20))
    assert out == graph.invoke(demo_input(20))
