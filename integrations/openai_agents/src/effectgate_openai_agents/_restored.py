"""The SDK's own decisions count only when they are made in this process, on a state effectgate saw.

`state.approve(item)` and `state.reject(item)` are flags in the SDK's run context (its decision
table, `RunContextWrapper._approvals`), serialized into the `RunState` snapshot unsigned: a
restored snapshot's flags are whatever its holder wrote, and a stored snapshot resumed twice
carries the same flag twice. So effectgate marks, in this process, every SDK run context it sees,
and the first time it sees one holding decisions it did not watch being made (a state restored
from a snapshot), it drops the SDK's approvals of its gated tools there:

- each per-call approval without effectgate's grant attached (`approve` / `approve_as` attach a
  signed, single-use grant: that approval stays, and the gate checks the grant when the call runs);
- each always-approve decision (it would approve the tool's later calls).

Those calls stay paused (the run shows them again as interruptions) until the application decides
them in this process: `state.approve(item)` on the loaded state, settled as the configured
`native_approver` (`_native_decisions`), or through the gate (`approve_as`, `approve`). A
rejection the snapshot carries is kept (it only closes the approval) and is recorded as the
system identity `sdk-reject`, never as the current request's approver.

When effectgate sees a restored state: while it loads, since `RunState.from_string` rebuilds the
paused turn with the current agent's tools and evaluates each gated tool's `is_enabled`, where
effectgate looks; so the approvals present at load are dropped, and a `state.approve(item)` after
`from_string` is a decision made here. A snapshot edited so that nothing is rebuilt at load is
seen at the latest by `pending_approvals` (and the other decision functions) or when it runs, and
its approvals are dropped then. The decisions of tools effectgate does not gate are not touched.

The mark is an attribute of the SDK's context object: `result.to_state()` copies the object with
`copy.copy`, which carries it, and a restored state's context is a new object without one. A
tool's context shares the run context's decision table, which is how it finds the run's mark; a
context whose decision table was replaced (a snapshot restored onto the same object) is seen
afresh.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from effectgate._logging import logger as guarded_logger

from ._context import STATE_KEY

log = guarded_logger(__name__)  # a handler that raises changes no call (effectgate._logging)

_ATTR = "_effectgate_seen"
#: The SDK run contexts marked in this process (weakly: a mark dies with its run or state).
_SEEN: weakref.WeakSet[Any] = weakref.WeakSet()
#: Guards `_SEEN`: runs on other threads add to it while one looks through it (a WeakSet's
#: iteration fails when it changes size meanwhile).
_SEEN_LOCK = threading.Lock()
#: The names of the tools effectgate gates in this process (`gate_tools`): the SDK approvals of
#: other tools (a shell tool, say) are not effectgate's to drop.
_GATED: set[str] = set()


def gated(name: str) -> None:
    """Record that the tool `name` is gated: its approvals in a restored snapshot are dropped."""
    _GATED.add(name)


@dataclass(eq=False)
class Seen:
    """effectgate's mark on one SDK run context: the decision table it was taken on, and what the
    SDK held rejected when effectgate first saw it (carried in by a snapshot, or none)."""

    owner: weakref.ReferenceType[Any]
    decisions: dict[Any, Any]
    rejected_calls: frozenset[str] = frozenset()
    rejected_tools: frozenset[str] = frozenset()

    def restored_rejection(self, tool: str, call_id: str) -> bool:
        """Whether the SDK's rejection of this call came with a restored snapshot."""
        return call_id in self.rejected_calls or tool in self.rejected_tools


def _mark(wrapper: Any, decisions: dict[Any, Any], *, calls: frozenset[str], tools: frozenset[str]) -> Seen:
    seen = Seen(weakref.ref(wrapper), decisions, calls, tools)
    setattr(wrapper, _ATTR, seen)
    with _SEEN_LOCK:
        _SEEN.add(wrapper)
    return seen


def _granted_calls(context: Any) -> set[str]:
    """Call ids whose effectgate record has a grant attached (`approve` / `approve_as`)."""
    state = context.get(STATE_KEY) if isinstance(context, Mapping) else None
    records = state.get("approvals") if isinstance(state, Mapping) else None
    grants = state.get("grants") if isinstance(state, Mapping) else None
    if not isinstance(records, Mapping) or not isinstance(grants, Mapping):
        return set()
    return {
        call_id
        for call_id, record in records.items()
        if isinstance(record, Mapping)
        and isinstance(approval_id := record.get("approval_id"), str)  # an edited one may be a list
        and isinstance(grants.get(approval_id), str)
    }


def _gated_tool(key: Any) -> str | None:
    """The gated tool an SDK decision key is for (None: not a tool effectgate gates)."""
    name = getattr(key, "tool_key", key)  # an agent-owned key names its tool in `tool_key`
    if not isinstance(name, str):
        return None  # a hosted MCP decision
    return name if name in _GATED or name.rpartition(".")[2] in _GATED else None


def _forget_settled(context: Any) -> None:
    """Drop the marks `_native_decisions` writes on a call's record once it settled the SDK's
    decision for it: unsealed, so a mark a context carried in (an edited snapshot, say) would
    keep a decision made here from being settled (a native reject from closing the approval)."""
    state = context.get(STATE_KEY) if isinstance(context, Mapping) else None
    records = state.get("approvals") if isinstance(state, Mapping) else None
    for record in records.values() if isinstance(records, Mapping) else ():
        if isinstance(record, MutableMapping):
            record.pop("native", None)
            record.pop("native_error", None)


def _first_look(wrapper: Any, decisions: dict[Any, Any]) -> Seen:
    """Drop the approvals a context carried in before effectgate saw it (module docstring), and
    the marks of decisions settled before (`_forget_settled`)."""
    _forget_settled(getattr(wrapper, "context", None))
    granted = _granted_calls(getattr(wrapper, "context", None))
    dropped: list[str] = []
    rejected_calls: set[str] = set()
    rejected_tools: set[str] = set()
    for key, record in decisions.items():
        tool = _gated_tool(key)
        if tool is None:
            continue
        approved, rejected = getattr(record, "approved", None), getattr(record, "rejected", None)
        if approved is True:
            record.approved = []
            if rejected is not True:
                record.sticky_scope = None
            dropped.append(f"always-approve of {tool}")
        elif isinstance(approved, list):
            for call_id in [c for c in approved if c not in granted]:
                approved.remove(call_id)
                dropped.append(f"call {call_id!r}")
        if isinstance(rejected, list):
            rejected_calls.update(c for c in rejected if isinstance(c, str))
        elif rejected is True:
            rejected_tools.add(tool)
    if dropped:
        log.warning(
            "effectgate dropped the SDK approvals this restored run state carried (%s): an approval "
            "in a snapshot is unsigned, so it is not a decision, and those calls stay paused. Decide "
            "them in this process (state.approve on the loaded state) or through the gate (approve_as / "
            "approve, whose grant is signed)",
            ", ".join(dropped),
        )
    return _mark(wrapper, decisions, calls=frozenset(rejected_calls), tools=frozenset(rejected_tools))


def observe(wrapper: Any) -> Seen | None:
    """effectgate's mark on the SDK run context `wrapper` (None when it is not one), made on first
    sight, which drops the approvals the context carried in (module docstring)."""
    decisions = getattr(wrapper, "_approvals", None)
    if not isinstance(decisions, dict):
        return None
    seen = getattr(wrapper, _ATTR, None)
    if isinstance(seen, Seen):
        owner = seen.owner()
        if owner is wrapper and seen.decisions is decisions:
            return seen
        if owner is not wrapper:  # a copy of a context seen here (`result.to_state()`): the same run
            return _mark(wrapper, decisions, calls=seen.rejected_calls, tools=seen.rejected_tools)
        # the same context with its decision table replaced: a snapshot restored onto it
    else:
        with _SEEN_LOCK:
            seen_here = list(_SEEN)
        for other in seen_here:  # a tool's context shares its run context's decision table
            found = getattr(other, _ATTR, None)
            if (
                isinstance(found, Seen)
                and found.owner() is other
                and found.decisions is decisions
                and getattr(other, "_approvals", None) is decisions
            ):
                return found
    return _first_look(wrapper, decisions)


__all__ = ["Seen", "gated", "observe"]
