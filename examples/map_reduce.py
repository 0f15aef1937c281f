"""Map-reduce fan-out with ``Send``: run it with ``python examples/map_reduce.py [N]``.

The graph lives in :mod:`bulksync.demo` (so ``bulksync demo`` runs the very same one); read it
there. ``split`` picks N subjects, one ``Send("generate", {"subject": …})`` per subject runs
``generate`` N times in one superstep, and ``summarize`` reduces the jokes the ``operator.add``
reducer gathered. This script runs it in-process without a checkpointer and prints each
superstep's updates as they stream out. On a cluster it is ``examples.map_reduce:graph``::

    PYTHONPATH=. bulksync worker --graph examples.map_reduce:graph
    PYTHONPATH=. bulksync coordinator --graph examples.map_reduce:graph
    bulksync submit examples.map_reduce:graph --wait --input '{"topics": ["cats"], "fanout": 6}'
"""

from __future__ import annotations

import sys

from bulksync.demo import build_demo_graph, demo_input

graph = build_demo_graph().compile()


def main(fanout: int = 4) -> None:
    """Stream the demo graph's updates, then print the reduced result."""
    for update in graph.stream(demo_input(fanout), stream_mode="updates"):
        for node, writes in update.items():
            print(f"{node}: {writes}")
    result = graph.invoke(demo_input(fanout))
    print(f"\nbest joke of {len(result['jokes'])}: {result['best_joke']}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
