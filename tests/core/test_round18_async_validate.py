"""Round 18: argument validation on the async path (`acall`, and the MCP proxy that uses it), and
the async check of notifiers.

An upstream MCP tool whose schema holds a catastrophic regex (`"pattern": "^(a+)+$"`, checked
against 24 "a"s and a "!") stalled the proxy's event loop about 0.5 s per call, every other
client with it (measured through `GatedProxy`, twice per call: the fast validator, then the full
one). The argument checks of `acall` already run in the flow's worker thread, off the loop
(pinned below); that does not help here: CPython's regex engine holds the GIL for a whole match,
so a 0.8 s match in a worker thread stalls every other thread, the loop's too, for 0.8 s. Running
validation in `asyncio.to_thread` (the first idea) keeps the loop free for checks that let go of
the GIL, never for this one.

What bounds the match instead, and why refusal at table build is the choice recorded here:
- a per-pattern match timeout: the standard `re` has none (the `regex` package's `timeout=`, or
  a linear-time engine such as google-re2, would be a new dependency of the core; re2 lacks the
  lookarounds ECMA patterns allow);
- a match in a child process with a timeout: a process round trip on every call of the row;
- refusing such a pattern where the row is built (`_validators`, beside `ecma_patterns`), a
  `TableError` for a table of one's own, and for the proxy the upstream's tool not served (as an
  over-long name is not, `_upstream.specs_for`): deterministic, nothing paid per call. Its cost
  is a static check's: nested unbounded quantifiers (star height 2) also flag safe patterns
  such as `^([a-z0-9-]+\\.)+[a-z]{2,}$` (host names), and a sharper check is work of its own.
  A design decision, so the test is a strict xfail.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import pytest

from effectgate import CallContext, Effect, EffectTable, Invalid, Keyring, ToolSpec, _validators
from effectgate.errors import TableError
from effectgate.examples.shop import Shop, app, context
from effectgate.notify import Notification
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import MakeGate

CTX = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="a1")


def lookup(code: str) -> dict[str, Any]:
    """Look a code up."""
    return {"code": code}


def test_acall_checks_arguments_off_the_event_loop(
    make_gate: MakeGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pattern check (the full validator's, reached when the fast one refuses) that waits for
    a coroutine on the same loop: it is released, so the check ran in a worker thread. Were it
    run on the loop, the wait would run out (guarded: 5 s), and `stalled` says so."""
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^x$"}}}
    row = ToolSpec(name="lookup", fn=lookup, effect=Effect.READ, schema=schema)
    gate = make_gate(EffectTable([row], allow={"a1": ["lookup"]}))
    started, released, stalled = threading.Event(), threading.Event(), []
    search = _validators._search

    def blocking_search(regex: str, text: str) -> bool:
        started.set()
        if not released.wait(5):
            stalled.append(regex)
        return search(regex, text)

    monkeypatch.setattr(_validators, "_search", blocking_search)

    async def release() -> None:
        assert await asyncio.to_thread(started.wait, 5)
        released.set()

    async def scenario() -> Any:
        out, _ = await asyncio.gather(gate.acall("lookup", {"code": "y"}, CTX), release())
        return out

    out = asyncio.run(scenario())
    assert isinstance(out, Invalid)
    assert [e.pointer for e in out.errors] == ["/code"]
    assert stalled == []


@pytest.mark.xfail(
    strict=True,
    reason="a design decision (see the module docstring): refuse a pattern with nested unbounded "
    "quantifiers where the row is built (_validators, beside ecma_patterns), a TableError; the MCP "
    "proxy then does not serve that upstream tool (_upstream.specs_for). Off-loop validation cannot "
    "help: CPython's re holds the GIL for a whole match",
)
def test_a_catastrophic_pattern_is_refused_when_its_row_is_built() -> None:
    """`^(a+)+$` takes exponential time on "aaa...a!": refused before any call is checked."""
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^(a+)+$"}}}
    with pytest.raises(TableError):
        ToolSpec(name="lookup", fn=lookup, effect=Effect.READ, schema=schema)


def test_a_decorated_bridge_to_an_event_loop_is_a_notifier(store: SQLStore, clock: FakeClock) -> None:
    """Not changed, on purpose: `_sync_hook` does not unwrap `functools.wraps` as
    `flow.refuse_async_on_loop` does. A notifier is refused when the gate is built, so unwrapping
    would refuse this plain function, which hands each notice to a loop as the TypeError advises;
    an async function behind a pass-through decorator returns a coroutine when called, and that
    notice is recorded `notify_failed` (README, notifiers)."""
    seen: list[str] = []

    def on_a_loop(fn: Any) -> Any:
        @functools.wraps(fn)
        def hook(notice: Notification) -> None:
            asyncio.run(fn(notice))  # this thread runs no loop: the gate's call is synchronous

        return hook

    @on_a_loop
    async def page(notice: Notification) -> None:
        seen.append(notice.kind)

    gate = app(store, keyring=Keyring.generate(), clock=clock, shop=Shop(), notify=page)
    try:
        gate.call("refund_order", {"order_id": "1042", "amount": 12000, "currency": "GBP"}, context("m3"))
    finally:
        gate.close()
    assert seen == ["pending"]
    assert store.events(kind="notify_failed") == []
