"""BinaryOperatorAggregate: start values, folding order, Overwrite in all its spellings."""

from __future__ import annotations

import collections.abc
import operator
import typing
from collections.abc import Callable
from typing import Annotated, Any, NotRequired, Optional, Required

import pytest
from langgraph.channels.binop import BinaryOperatorAggregate as LgBinop
from langgraph.types import Overwrite as LgOverwrite

from bulksync.channels import BinaryOperatorAggregate
from bulksync.channels.base import MISSING
from bulksync.errors import EmptyChannelError, InvalidUpdateError
from bulksync.types import Overwrite


class NeedsArgs:
    """A type that cannot be built without arguments."""

    def __init__(self, x: int) -> None:
        self.x = x


START_TYPES: dict[str, Any] = {
    "int": int,
    "str": str,
    "list": list,
    "list[int]": list[int],
    "typing.List[int]": typing.List[int],  # noqa: UP006 - the old spelling is what is tested
    "Annotated list": Annotated[list[int], operator.add],
    "abc Sequence": collections.abc.Sequence[str],
    "typing.Sequence": typing.Sequence[str],
    "MutableSequence": collections.abc.MutableSequence[int],
    "abc Set": collections.abc.Set[int],
    "MutableSet": collections.abc.MutableSet[int],
    "Mapping": collections.abc.Mapping[str, int],
    "MutableMapping": collections.abc.MutableMapping[str, int],
    "dict[str, int]": dict[str, int],
    "NotRequired list": NotRequired[list[int]],
    "Required Annotated": Required[Annotated[dict[str, int], operator.or_]],
    "Optional list": Optional[list[int]],  # noqa: UP045
    "class needing args": NeedsArgs,
    "Any": Any,
}


@pytest.mark.parametrize("typ", START_TYPES.values(), ids=START_TYPES.keys())
def test_start_value_matches_langgraph(typ: Any, trace: Callable[..., Any]) -> None:
    ours = BinaryOperatorAggregate(typ, operator.add, key="k")
    lg = LgBinop(typ, operator.add)
    assert trace(ours, []) == trace(lg, [])
    assert ours.typ is typ  # the declared type is kept, not the concrete one


def test_start_values_are_fresh_per_channel() -> None:
    template: BinaryOperatorAggregate[list[int]] = BinaryOperatorAggregate(list, operator.iadd)
    a, b = template.from_checkpoint(MISSING), template.from_checkpoint(MISSING)
    a.update([[1]])
    assert (a.get(), b.get(), template.get()) == ([1], [], [])


def _to_langgraph(value: Any) -> Any:
    return LgOverwrite(value.value) if isinstance(value, Overwrite) else value


FOLD_CASES: dict[str, tuple[Any, list[tuple[Any, ...]]]] = {
    "sum over steps": (int, [("update", [1, 2]), ("update", []), ("update", [3])]),
    "list concat keeps order": (list, [("update", [["a"], ["b"]]), ("update", [["c"]])]),
    "overwrite alone": (list, [("update", [["a"]]), ("update", [Overwrite(["z"])])]),
    "overwrite last drops earlier": (list, [("update", [["a"], ["b"], Overwrite(["z"])])]),
    "overwrite first drops later": (list, [("update", [Overwrite(["z"]), ["a"], ["b"]])]),
    "overwrite middle": (list, [("update", [["a"]]), ("update", [["b"], Overwrite([]), ["c"]])]),
    "dict spelling": (list, [("update", [["a"], {"__overwrite__": ["z"]}, ["b"]])]),
    "json spelling": (list, [("update", [["a"], {"type": "__overwrite__", "value": ["q"]}])]),
    "two overwrites": (list, [("update", [["a"]]), ("update", [Overwrite([1]), Overwrite([2])])]),
    "overwrite and dict spelling": (list, [("update", [Overwrite([1]), {"__overwrite__": [2]}])]),
    "overwrite then next step folds": (int, [("update", [Overwrite(10)]), ("update", [1, 2])]),
    "restore and copy": (list, [("update", [["a"]]), ("restore",), ("copy",), ("update", [["b"]])]),
    "stored": (
        list,
        [("update", [[("t", 1)]]), ("stored",), ("update", [Overwrite([{1}])]), ("stored",)],
    ),
    "many lists in one step": (list, [("update", [[i] for i in range(50)]), ("update", [[50]])]),
    "a tuple after lists raises": (list, [("update", [["a"], ("b",)])]),
    "an empty list among lists": (list, [("update", [["a"]]), ("update", [[], ["b"]])]),
    "no start value: first write is taken": (
        NeedsArgs,
        [("update", []), ("update", ["a", "b"]), ("update", ["c"])],
    ),
}


@pytest.mark.parametrize(("typ", "ops"), FOLD_CASES.values(), ids=FOLD_CASES.keys())
def test_update_matches_langgraph(
    typ: Any, ops: list[tuple[Any, ...]], trace: Callable[..., Any]
) -> None:
    reducer = operator.add
    ours = BinaryOperatorAggregate(typ, reducer, key="k")
    lg = LgBinop(typ, reducer)
    lg.key = "k"
    assert trace(ours, ops) == trace(lg, ops, _to_langgraph)


def test_lists_folded_with_add_leave_every_value_they_were_given_as_it_was() -> None:
    start, first, second = ["s"], ["a"], ["b"]
    channel = BinaryOperatorAggregate(list, operator.add, key="k").from_checkpoint(start)
    before = channel.get()
    channel.update([first, second])
    after_one = channel.get()
    channel.update([["c"], ["d"]])
    assert channel.get() == ["s", "a", "b", "c", "d"]
    # Folded into lists of the channel's own: no input, and no value handed out, changed.
    assert (start, first, second) == (["s"], ["a"], ["b"])
    assert (before, after_one) == (["s"], ["s", "a", "b"])


@pytest.mark.parametrize(
    "overwrite",
    [Overwrite(["z"]), {"__overwrite__": ["z"]}, {"type": "__overwrite__", "value": ["z"]}],
    ids=["Overwrite", "dict", "json"],
)
@pytest.mark.parametrize("position", [0, 1, 2])
def test_overwrite_replaces_the_step_wherever_it_is(overwrite: Any, position: int) -> None:
    channel: BinaryOperatorAggregate[list[str]] = BinaryOperatorAggregate(list, operator.add)
    channel.update([["old"]])
    values: list[Any] = [["a"], ["b"]]
    values.insert(position, overwrite)
    assert channel.update(values) is True
    assert channel.get() == ["z"]


@pytest.mark.parametrize(
    "value",
    [{"__overwrite__": 1, "other": 2}, {"type": "__overwrite__"}, {"type": "x", "value": 1}],
    ids=["extra key", "json without value", "other type"],
)
def test_dicts_that_only_look_like_overwrite_are_folded(value: dict[str, Any]) -> None:
    channel: BinaryOperatorAggregate[dict[str, Any]] = BinaryOperatorAggregate(dict, operator.or_)
    channel.update([value])
    assert channel.get() == value


def test_second_overwrite_names_the_key() -> None:
    channel: BinaryOperatorAggregate[Any] = BinaryOperatorAggregate(list, operator.add, key="items")
    with pytest.raises(InvalidUpdateError, match=r"At key 'items'.*only one Overwrite"):
        channel.update([Overwrite([1]), ["x"], {"__overwrite__": [2]}])


def test_overwrite_into_an_empty_channel_is_unwrapped() -> None:
    # LangGraph stores the Overwrite object itself here; a stored wrapper would not survive
    # msgpack and would break the next fold, so bulksync applies it as an overwrite.
    channel: BinaryOperatorAggregate[Any] = BinaryOperatorAggregate(NeedsArgs, operator.add)
    channel.update([Overwrite(5), 7])
    assert channel.get() == 5
    channel.update([1])
    assert channel.get() == 6


def test_reducer_errors_propagate_unchanged() -> None:
    boom = ZeroDivisionError("reducer failed")

    def reducer(current: int, new: int) -> int:
        raise boom

    channel: BinaryOperatorAggregate[int] = BinaryOperatorAggregate(int, reducer, key="k")
    with pytest.raises(ZeroDivisionError) as caught:
        channel.update([1])
    assert caught.value is boom


def test_reducer_sees_values_in_write_order() -> None:
    calls: list[tuple[str, str]] = []

    def reducer(current: str, new: str) -> str:
        calls.append((current, new))
        return current + new

    channel: BinaryOperatorAggregate[str] = BinaryOperatorAggregate(str, reducer)
    channel.update(["a", "b"])
    assert calls == [("", "a"), ("a", "b")]
    assert channel.get() == "ab"


def test_empty_step_reports_no_change() -> None:
    channel: BinaryOperatorAggregate[int] = BinaryOperatorAggregate(int, operator.add)
    assert channel.update([]) is False
    assert channel.get() == 0


def test_without_start_value_get_raises() -> None:
    channel: BinaryOperatorAggregate[Any] = BinaryOperatorAggregate(NeedsArgs, operator.add)
    assert channel.checkpoint() is MISSING
    with pytest.raises(EmptyChannelError):
        channel.get()


def test_from_checkpoint_keeps_spec_and_leaves_template() -> None:
    template: BinaryOperatorAggregate[list[int]] = BinaryOperatorAggregate(
        list[int], operator.add, key="items"
    )
    live = template.from_checkpoint([1, 2])
    live.update([[3]])
    assert (live.key, live.typ, live.operator, live.get()) == (
        "items",
        list[int],
        operator.add,
        [1, 2, 3],
    )
    assert template.get() == []
    assert live.copy().get() == [1, 2, 3]


def test_checkpoint_is_plain_data(is_plain: Callable[..., bool]) -> None:
    channel: BinaryOperatorAggregate[list[Any]] = BinaryOperatorAggregate(list, operator.add)
    channel.update([[1, ("a", {"b": 2.5})], Overwrite([{1, 2}])])
    assert is_plain(channel.checkpoint())
    assert channel.checkpoint() == [{1, 2}]


def test_compares_by_operator_like_langgraph() -> None:
    add = BinaryOperatorAggregate(int, operator.add)
    assert add == BinaryOperatorAggregate(list, operator.add)
    assert add != BinaryOperatorAggregate(int, operator.mul)
    assert BinaryOperatorAggregate(int, lambda a, b: a) == add
    assert (LgBinop(int, operator.add) == LgBinop(int, operator.mul)) is False
