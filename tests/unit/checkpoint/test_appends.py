"""A list channel that only grows is stored as what each version appends, on every saver,
and reads back exactly: the head, every checkpoint of the history, forks, later runs."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest

from bulksync.checkpoint.appends import MARK, SNAPSHOT_FROM, Chains, appended, delta
from bulksync.checkpoint.base import CheckpointSaver
from bulksync.checkpoint.memory import InMemorySaver
from bulksync.checkpoint.postgres import PostgresSaver
from bulksync.checkpoint.serde import MsgpackSerde
from bulksync.errors import CheckpointError
from bulksync.graph import END, START, StateGraph

ITEM = "m" * 200  # a chat message's worth of bytes


class Chat(TypedDict):
    log: Annotated[list[str], operator.add]
    turns: int


def chat(saver: CheckpointSaver) -> Any:
    """One node appending a message per step, ``turns`` steps a run."""

    def say(state: Chat) -> dict[str, Any]:
        return {"log": [f"{len(state['log'])}:{ITEM}"]}

    b = StateGraph(Chat)
    b.add_node("say", say)
    b.add_edge(START, "say")
    b.add_conditional_edges(
        "say", lambda s: "say" if len(s["log"]) % s["turns"] else END, ["say", END]
    )
    return b.compile(checkpointer=saver)


def expected(n: int) -> list[str]:
    return [f"{i}:{ITEM}" for i in range(n)]


def stored(saver: Any, thread: str, channel: str = "log") -> dict[int, bytes | None]:
    """Every stored version of the channel (a delta's chain, for the Postgres saver)."""
    if isinstance(saver, PostgresSaver):
        with saver.pool.connection() as conn:
            rows = conn.execute(
                "SELECT version, blob FROM bulksync_checkpoint_blobs WHERE thread_id = %s "
                "AND channel = %s",
                (thread, channel),
            ).fetchall()
        return {int(v): bytes(b) if b is not None else None for v, b in rows}
    return dict(saver._versions(thread, "", channel, 0))


def test_only_a_pure_append_is_a_delta() -> None:
    a, b, c = object(), object(), object()
    assert appended((a, b), [a, b, c]) == [c]
    assert appended((a, b), [a, c, c]) is None  # an item replaced
    assert appended((a, b), [a, b]) is None  # nothing appended
    assert appended((a, b), (a, b, c)) is None  # not a list
    assert appended(None, [a]) is None
    full = [object() for _ in range(SNAPSHOT_FROM)]
    assert appended(tuple(full[:-1]), full) is None  # a power of two from SNAPSHOT_FROM on
    assert appended(tuple(full), [*full, a]) == [a]


def test_deltas_are_written_for_bulksyncs_msgpack_only() -> None:
    assert (delta(MsgpackSerde(), 7, ["x"]) or b"").startswith(MARK)

    class Other:
        def dumps(self, value: Any) -> bytes:
            raise AssertionError("not asked")

        def loads(self, data: bytes) -> Any:
            raise AssertionError("not asked")

    assert delta(Other(), 7, ["x"]) is None  # type: ignore[arg-type]


def test_a_growing_list_stores_its_new_items_and_reads_back_exactly(
    saver: CheckpointSaver,
) -> None:
    graph, config = chat(saver), {"configurable": {"thread_id": "chat"}}
    graph.invoke({"log": [], "turns": 30}, config)
    assert graph.get_state(config).values["log"] == expected(30)
    # Each version after the first holds one message, not the whole log.
    blobs = stored(saver, "chat")
    deltas = [b for b in blobs.values() if b is not None and b.startswith(MARK)]
    assert len(deltas) == 30
    assert max(len(b) for b in deltas) < len(ITEM) + 64
    # Every checkpoint of the history reads its own log.
    for snapshot in graph.get_state_history(config):
        size = len(snapshot.values.get("log", []))
        assert snapshot.values.get("log", []) == expected(size)
    # A later run on the thread goes on from the stored chain.
    graph.invoke({"log": [], "turns": 40}, config)
    assert graph.get_state(config).values["log"] == expected(40)
    assert sum(1 for b in stored(saver, "chat").values() if b and b.startswith(MARK)) == 40


def test_a_fork_appends_to_the_version_it_forks_from(saver: CheckpointSaver) -> None:
    graph, config = chat(saver), {"configurable": {"thread_id": "fork"}}
    graph.invoke({"log": [], "turns": 10}, config)
    middle = next(s for s in graph.get_state_history(config) if len(s.values["log"]) == 4)
    forked = graph.update_state(middle.config, {"log": ["forked"]})
    assert graph.get_state(forked).values["log"] == [*expected(4), "forked"]
    assert graph.get_state(config).values["log"] == [*expected(4), "forked"]  # the new head
    assert graph.get_state(middle.config).values["log"] == expected(4)
    old_head = next(s for s in graph.get_state_history(config) if len(s.values["log"]) == 10)
    assert old_head.values["log"] == expected(10)


def test_a_list_that_shrinks_or_changes_is_stored_whole(saver: CheckpointSaver) -> None:
    class Plain(TypedDict):
        items: list[str]

    b = StateGraph(Plain)
    b.add_node("grow", lambda s: {"items": [*s["items"], "c"]})
    b.add_node("swap", lambda s: {"items": ["x", *s["items"][1:]]})
    b.add_node("cut", lambda s: {"items": s["items"][:1]})
    b.add_edge(START, "grow")
    b.add_edge("grow", "swap")
    b.add_edge("swap", "cut")
    graph, config = b.compile(checkpointer=saver), {"configurable": {"thread_id": "plain"}}
    assert graph.invoke({"items": ["a", "b"]}, config) == {"items": ["x"]}
    history = [s.values.get("items") for s in graph.get_state_history(config)]
    assert history == [["x"], ["x", "b", "c"], ["a", "b", "c"], ["a", "b"], None]


def test_a_long_list_is_stored_whole_again_at_each_power_of_two() -> None:
    saver = InMemorySaver()
    graph, config = chat(saver), {"configurable": {"thread_id": "long"}}
    graph.invoke({"log": expected(SNAPSHOT_FROM - 2), "turns": SNAPSHOT_FROM + 2}, config)
    assert graph.get_state(config).values["log"] == expected(SNAPSHOT_FROM + 2)
    kinds = [b[:1] == MARK for _, b in sorted(stored(saver, "long").items()) if b is not None]
    assert kinds == [False, True, False, True, True]  # input, 1023, 1024 whole, 1025, 1026


def test_a_chain_missing_a_version_is_an_error_naming_the_channel() -> None:
    saver = InMemorySaver()
    graph, config = chat(saver), {"configurable": {"thread_id": "broken"}}
    graph.invoke({"log": [], "turns": 3}, config)
    versions = saver._blobs[("broken", "", "log")]
    first_delta = min(v for v, b in versions.items() if b is not None and b.startswith(MARK))
    del versions[int.from_bytes((versions[first_delta] or b"")[1:9], "big", signed=True)]
    with pytest.raises(
        CheckpointError,
        match=r"channel 'log' at version \d+ extends version \d+, which is not stored",
    ):
        graph.get_state(config)


def test_each_version_is_rebuilt_once_per_read() -> None:
    serde, fetched = MsgpackSerde(), []
    rows = {1: serde.dumps(["a"]), 2: delta(serde, 1, ["b"]), 3: delta(serde, 2, ["c"])}

    def fetch(thread: str, ns: str, channel: str, version: int) -> dict[int, bytes | None]:
        fetched.append((channel, version))
        return {v: b for v, b in rows.items() if v <= version}  # the chain from ``version``

    chains = Chains(serde, fetch)
    first = chains.value("t", "", "log", 3, rows[3] or b"")
    again = chains.value("t", "", "log", 2, rows[2] or b"")
    assert (first, again) == (["a", "b", "c"], ["a", "b"])
    assert fetched == [("log", 2)]  # the chain below the head, once
    first.append("mutated")  # every call gets a list of its own
    assert chains.value("t", "", "log", 3, rows[3] or b"") == ["a", "b", "c"]


def test_postgres_follows_only_the_chain() -> None:
    from tests.unit.checkpoint.conftest import _postgres_saver

    for saver in _postgres_saver():
        graph, config = chat(saver), {"configurable": {"thread_id": "pg-chain"}}
        graph.invoke({"log": [], "turns": 10}, config)
        middle = next(s for s in graph.get_state_history(config) if len(s.values["log"]) == 4)
        graph.invoke(None, middle.config)  # replayed from there: a branch of six more deltas
        head = saver.get_tuple(config)
        assert head is not None and head.checkpoint.channel_values["log"] == expected(10)
        version = head.checkpoint.channel_versions["log"]
        chain = saver._versions("pg-chain", "", "log", version)
        every = stored(saver, "pg-chain")
        assert set(chain) < set(every)  # the first branch's last six are not read
        assert len(chain) == 11  # ten deltas down to the input's whole (empty) list


def test_a_chain_decodes_in_one_call() -> None:
    serde, calls = MsgpackSerde(), []

    class Counting(MsgpackSerde):
        def loads(self, data: bytes) -> Any:
            calls.append(data)
            return super().loads(data)

    rows: dict[int, bytes | None] = {1: serde.dumps(["a"])}
    for version in range(2, 40):  # an array header of 1 byte up to 15 items, 3 bytes from 16
        rows[version] = delta(serde, version - 1, [str(version), version])
    chains = Chains(Counting(), lambda t, ns, ch, v: rows)
    assert chains.value("t", "", "log", 39, rows[39] or b"") == [
        "a",
        *(item for v in range(2, 40) for item in (str(v), v)),
    ]
    assert len(calls) == 2  # the whole value, then every delta's items at once


def test_postgres_reads_the_chain_with_the_checkpoint() -> None:
    """A head read is the checkpoint, then its blobs (the chain among them) and writes."""
    from tests.unit.checkpoint.conftest import _postgres_saver

    chain_reads: list[tuple[Any, ...]] = []

    def fetch(*key: Any) -> dict[int, bytes | None]:
        chain_reads.append(key)
        return {}

    for saver in _postgres_saver():
        graph, config = chat(saver), {"configurable": {"thread_id": "pg-head"}}
        graph.invoke({"log": [], "turns": 20}, config)
        saver._versions = fetch  # type: ignore[method-assign]
        assert graph.get_state(config).values["log"] == expected(20)
        for snapshot in graph.get_state_history(config):
            assert snapshot.values.get("log", []) == expected(len(snapshot.values.get("log", [])))
    assert chain_reads == []


def test_postgres_reads_the_versions_each_checkpoint_needs_not_those_between() -> None:
    from bulksync.checkpoint import pg_migrations as pgm
    from tests.unit.checkpoint.conftest import _postgres_saver

    class Counted(TypedDict):
        log: Annotated[list[str], operator.add]
        n: int

    b = StateGraph(Counted)
    b.add_node("step", lambda s: {"log": [ITEM], "n": s["n"] + 1})
    b.add_edge(START, "step")
    b.add_conditional_edges("step", lambda s: "step" if s["n"] < 12 else END, ["step", END])
    for saver in _postgres_saver():
        graph, config = b.compile(checkpointer=saver), {"configurable": {"thread_id": "pg-far"}}
        graph.invoke({"log": [], "n": 0}, config)
        history = list(saver.list(config))
        far = [history[0], history[-3]]  # the head, and the first step's checkpoint
        keys = sorted(
            {("pg-far", "", ch, v) for t in far for ch, v in t.checkpoint.channel_versions.items()}
        )
        with saver.pool.connection() as conn:
            rows = conn.execute(pgm.BLOBS_SQL, [list(c) for c in zip(*keys, strict=True)])
            read = [(channel, version) for _, _, channel, version, _ in rows.fetchall()]
        # ``n`` is stored whole at each step: the two versions, none of the ten between.
        counts = [t.checkpoint.channel_versions["n"] for t in far]
        assert sorted(v for ch, v in read if ch == "n") == sorted(counts)
        # ``log``'s chain: the input's whole list and the twelve deltas above it.
        assert len([v for ch, v in read if ch == "log"]) == 13


def test_branches_of_one_chain_read_apart_in_one_read() -> None:
    """Versions share one list as prefixes; a branch from an older version forks it."""
    serde = MsgpackSerde()
    rows: dict[int, bytes | None] = {
        1: serde.dumps(["a"]),
        2: delta(serde, 1, ["b"]),
        3: delta(serde, 2, ["c"]),
        4: delta(serde, 2, ["x", "y"]),  # a fork of version 2
        5: delta(serde, 3, ["d"]),
    }
    chains = Chains(serde, lambda t, ns, ch, v: {k: b for k, b in rows.items() if k <= v})

    def read(version: int) -> list[Any]:
        return chains.value("t", "", "log", version, rows[version] or b"")

    assert read(3) == ["a", "b", "c"]
    assert read(4) == ["a", "b", "x", "y"]
    assert read(5) == ["a", "b", "c", "d"]
    assert read(2) == ["a", "b"]
    assert read(3) == ["a", "b", "c"]
    assert read(4) == ["a", "b", "x", "y"]
