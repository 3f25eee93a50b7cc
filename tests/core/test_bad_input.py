"""Bad input gets a clear error and changes nothing: arguments, tokens, keyring files.

Arguments the gate cannot freeze exactly come back as `Invalid` with a JSON pointer (nothing is
recorded as executed); malformed tokens are `TokenError("malformed")` with a refusal event; a
keyring file is created once under concurrency and refused when others can read it.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from effectgate import Executed, Invalid, Keyring, Pending
from effectgate.canonical import MAX_DEPTH, args_hash
from effectgate.errors import TokenError
from effectgate.examples.shop import context
from effectgate.stores import SQLStore

from .conftest import ShopGate

TAGS = {"ticket_id": "t-17", "tags": ["urgent"]}


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


class Tags(Sequence[str]):
    """A Sequence that is not a list or a tuple."""

    def __getitem__(self, index: Any) -> Any:
        return ["urgent"][index]

    def __len__(self) -> int:
        return 1


@pytest.mark.parametrize(
    ("args", "pointer"),
    [
        ({"ticket_id": "t-17", "tags": nested(MAX_DEPTH + 5)}, "/tags"),
        ({"ticket_id": "t-17", "tags": ["\ud800"]}, "/tags/0"),
        ({"ticket_id": "t-17\udfff", "tags": []}, "/ticket_id"),
        ({"ticket_id": "t-17", "tags": [], "\ud83d": 1}, "/\ud83d"),
        ({"ticket_id": "t-17", "tags": Tags()}, "/tags"),
        ({"ticket_id": "t-17", "tags": collections.UserList(["x"])}, "/tags"),
        (types.MappingProxyType(TAGS), ""),
        (collections.UserDict(TAGS), ""),
        ({"ticket_id": "t-17", "tags": [float("nan")]}, "/tags/0"),
        ({"ticket_id": "t-17", "tags": [2**60]}, "/tags/0"),
        ({"ticket_id": b"t-17", "tags": []}, "/ticket_id"),
    ],
    ids=[
        "too-deep",
        "surrogate-value",
        "surrogate-in-text",
        "surrogate-key",
        "sequence",
        "userlist",
        "mappingproxy",
        "userdict",
        "nan",
        "huge-int",
        "bytes",
    ],
)
def test_unfreezable_arguments_are_invalid(
    shop_gate: ShopGate, store: SQLStore, args: Any, pointer: str
) -> None:
    """Each argument set with no exact JSON form is Invalid at its pointer; nothing runs or is stored."""
    shop, gate = shop_gate
    out = gate.call("update_ticket_tags", args, context("m1"))
    assert isinstance(out, Invalid), out
    assert any(e.pointer == pointer or e.pointer.startswith(pointer + "/") for e in out.errors), out.errors
    assert shop.receiver.count("ticket_tags") == 0
    assert store.executions() == []
    assert store.idempotency_records() == []


def test_integral_float_for_an_integer_arrives_as_an_integer(shop_gate: ShopGate, store: SQLStore) -> None:
    """12000.0 for an integer argument is frozen, hashed and passed on as 12000: the same approval."""
    _, gate = shop_gate
    as_float = gate.call(
        "refund_order", {"order_id": "1042", "amount": 12000.0, "currency": "GBP"}, context("m1")
    )
    as_int = gate.call(
        "refund_order", {"order_id": "1042", "amount": 12000, "currency": "GBP"}, context("m1")
    )
    assert isinstance(as_float, Pending)
    assert isinstance(as_int, Pending)
    assert as_int.approval_id == as_float.approval_id
    assert as_int.replay
    assert as_float.card.args["amount"] == 12000
    assert type(as_float.card.args["amount"]) is int
    expected = args_hash("refund_order", {"order_id": "1042", "amount": 12000, "currency": "GBP"})
    assert as_float.card.args_hash == expected


def test_arguments_mutated_after_the_call_do_not_change_the_record(
    shop_gate: ShopGate, store: SQLStore
) -> None:
    """The gate freezes a copy at call time: the caller mutating its dict afterwards changes nothing."""
    _, gate = shop_gate
    args: dict[str, Any] = {"order_id": "1042", "amount": 6000, "currency": "GBP"}
    out = gate.call("refund_order", args, context("m1"))
    assert isinstance(out, Pending)
    args["amount"] = 12000
    assert gate.card(out.approval_id).args["amount"] == 6000


def test_tuple_arguments_arrive_as_lists(shop_gate: ShopGate) -> None:
    """A tuple is frozen as a JSON array: the tool receives a list."""
    shop, gate = shop_gate
    out = gate.call("update_ticket_tags", {"ticket_id": "t-17", "tags": ("urgent", "vip")}, context("m1"))
    assert isinstance(out, Executed), out
    assert shop.tickets["t-17"]["tags"] == ["urgent", "vip"]


@pytest.mark.parametrize(
    "token",
    [
        "eg1.k1.ap1.١.100.nonce.mac",
        "eg1.k1.ap1.1.²00.nonce.mac",
        "eg1.k1.ap1." + "9" * 5000 + ".100.nonce.mac",
        "eg1.k1.ap1.1." + "9" * 40 + ".nonce.mac",
        "eg1.k1." + "a" * 600 + ".1.100.nonce.mac",
        "eg1.k\u202e1.ap1.1.100.nonce.mac",
        "eg1.k1.ap1.1.100.nonce.m\x00c",
        "eg1.k1.ap1.1.100.nonce.mac\n",
    ],
    ids=["arabic-digit", "superscript", "huge-version", "huge-expiry", "long-id", "bidi", "nul", "newline"],
)
def test_malformed_token_is_refused_and_recorded(shop_gate: ShopGate, store: SQLStore, token: str) -> None:
    """A malformed token is TokenError("malformed"), recorded as a refusal; nothing runs."""
    _, gate = shop_gate
    with pytest.raises(TokenError) as raised:
        gate.execute(token)
    assert raised.value.reason == "malformed"
    assert [e.kind for e in store.events(kind="token_refused")] == ["token_refused"]
    assert store.executions() == []


# -- the keyring file


def _load(path: str, out: Any) -> None:
    out.put(Keyring.load_or_create(path).dumps())


def test_concurrent_first_use_makes_one_key(tmp_path: Path) -> None:
    """Many processes creating the development keyring at once all end with the same key."""
    path = str(tmp_path / "db.keys")
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_load, args=(path, queue)) for _ in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    seen = {queue.get(timeout=10) for _ in procs}
    assert len(seen) == 1
    assert seen == {Path(path).read_text()}
    assert [p.name for p in tmp_path.iterdir()] == ["db.keys"]


def test_keyring_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    """A key file others can read is refused, with the chmod that fixes it."""
    path = tmp_path / "db.keys"
    Keyring.load_or_create(path)
    os.chmod(path, 0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        Keyring.load_or_create(path)


@pytest.mark.parametrize("secret", ["00" * 32, "ab" * 32], ids=["zeros", "repeated"])
def test_non_random_key_is_refused(tmp_path: Path, secret: str) -> None:
    """An all-zero (or one-byte-repeated) key is refused in the environment form and in a key file."""
    with pytest.raises(ValueError, match="not random"):
        Keyring.parse(f"k1:{secret}")
    path = tmp_path / "db.keys"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"k1:{secret}")
    with pytest.raises(ValueError, match="not random"):
        Keyring.load_or_create(path)
