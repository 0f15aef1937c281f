"""``Encoded``: a value with its bytes, decoded lazily; what savers store for it."""

from __future__ import annotations

from typing import Any

from bulksync.checkpoint.base import Encoded, decoded, stored_bytes
from bulksync.checkpoint.serde import MsgpackSerde


class Counting(MsgpackSerde):
    """Counts decodes."""

    def __init__(self) -> None:
        super().__init__()
        self.loads_calls = 0

    def loads(self, data: bytes) -> Any:
        self.loads_calls += 1
        return super().loads(data)


def test_value_is_decoded_once_and_only_when_asked() -> None:
    serde = Counting()
    enc = Encoded(serde.dumps([1, (2,)]), serde)
    assert serde.loads_calls == 0
    assert "…" in repr(enc)
    assert enc.value == [1, (2,)] and enc.value is enc.value
    assert serde.loads_calls == 1


def test_equal_to_its_value_and_to_an_encoded_of_it() -> None:
    serde = MsgpackSerde()
    enc = Encoded.of(serde, {"a": 1})
    assert enc == {"a": 1}
    plain: Any = {"a": 1}
    assert plain.__eq__(enc) is NotImplemented and plain == enc  # reflected to Encoded
    assert enc == Encoded.of(serde, {"a": 1})
    assert enc != {"a": 2}


def test_holds_is_identity_without_decoding() -> None:
    serde = MsgpackSerde()
    value = [1]
    assert Encoded.of(serde, value).holds(value)
    assert not Encoded.of(serde, value).holds([1])
    assert not Encoded(serde.dumps(value), serde).holds(value)


def test_stored_bytes_reuse_only_a_shared_format() -> None:
    mine, other = MsgpackSerde(), MsgpackSerde()
    enc = Encoded.of(mine, "v")
    assert stored_bytes(other, enc) is enc.data
    assert stored_bytes(other, "v") == enc.data
    assert decoded(enc) == "v" and decoded("v") == "v"
