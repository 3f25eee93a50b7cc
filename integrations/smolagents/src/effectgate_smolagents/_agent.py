"""Gated smolagents tools, and a run that stops at a gated call and continues after the decision.

smolagents has no pause primitive, so `GatedAgent` builds one from what it has:

- Every tool of the agent (except `final_answer`) is replaced by a `GatedTool` with the same name,
  description, inputs and output type. Its `forward` sends the call through the gate, with the
  identity of the current run (never anything the model wrote).
- A read or a write runs through the gate and returns its result. A refusal returns the gate's
  message as the tool's result, so the model can correct itself. A bad argument (nothing runs)
  raises `AgentToolCallError` with the gate's message where smolagents raises it, and is the
  call's result elsewhere (`_arguments`). A tool that raises fails as smolagents shows a plain
  tool's error (`_errors`), except that the other calls of a parallel step keep their
  observations (smolagents#2457 drops them when one call raises).
- A gated call registers its approval. In a `ToolCallingAgent` the tool answers "needs approval"
  and calls `agent.interrupt()`, so the step's other calls finish and are kept in memory, and the
  run stops before the next model call. In a `CodeAgent` it raises `ApprovalRequired`, a
  `BaseException` no handler in smolagents catches, so nothing after the gated call in the code
  block runs. Either way `GatedAgent.run` returns `AwaitingApproval` (approval ids, cards).
- The CodeAgent stop is total: once a gated call has stopped a snippet, every later tool call of
  that run (from a `finally`, an `except`, a loop, a nested function, `final_answer` included)
  raises `ApprovalRequired` again and runs nothing, until the run is resumed. Code that swallows
  the stop (a `return`, `break` or `continue` in a `finally`) still ends the run before the next
  model call. smolagents' interpreter lets code read and set any attribute that is not a dunder,
  so a `GatedTool` keeps the gate and the agent only in a closure: code cannot reach them.
- `AwaitingApproval` records, for each paused call, the approval id, version and args hash, with
  the identity of the run, signed with the gate's keyring (`to_dict` / `from_dict` verify it).
- `GatedAgent.resume(awaiting, decisions)` first binds every decision to the call it is filed
  under (`effectgate.adapter.bind_decision`): a grant for another approval, or for a version the
  approval has moved past, raises `DecisionMismatch` before anything runs. Then it executes
  approved calls through the gate (once: a second resume gets the stored result), records
  denials, and continues the run with `agent.run(..., reset=False)`. The continuation's task
  tells the model how each call ended. A model that issues the approved call again is matched by
  the stable key (session, origin message, tool, subject) and the args hash, and gets the stored
  result: one effect.

For a `ToolCallingAgent`, smolagents' own argument check (`validate_tool_arguments`) is skipped
for gated tools. The gate validates the arguments as the tool receives them (`_arguments`: a bare
value is the tool's first input, as in smolagents) against the effect table instead, so a bad
argument is recorded as `invalid` and no approval is created. The one model step's gated calls
are registered together (`gate.call_step`): two calls of one gated tool in a step register neither.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from smolagents import CodeAgent, Tool, ToolCallingAgent
from smolagents.agents import MultiStepAgent, RunResult
from smolagents.utils import AgentError, AgentToolCallError

from effectgate import (
    Approver,
    CallContext,
    EffectGate,
    Executed,
    Grant,
    Invalid,
    Outcome,
    Pending,
    Refused,
)
from effectgate.adapter import (
    DecisionMismatch,
    Paused,
    TamperedState,
    Unknown,
    bind_decision,
    check_wrappable,
    is_gated,
    sign_state,
    verify_state,
)
from effectgate.canonical import args_hash
from effectgate.errors import (
    ApprovalError,
    EffectGateError,
    PolicyViolation,
    TokenError,
    WrongApprover,
)
from effectgate.rows import DEFAULT_DB, NativeTool, Row, gate_for

from ._arguments import bad_argument, keywords, received
from ._code import ApprovalRequired, keep_logs_at_a_stop
from ._errors import tool_failed
from ._identity import Stop, model_id_of, outside_a_run, refuse_plain_runs, run_context
from ._native import native_tool
from ._result import run_result, wants_full_result
from ._saving import mark_saved_agent, saved_tool, unmarked

_AWAITING = "smolagents.awaiting"


@dataclass(frozen=True)
class Finished:
    """The run ended with a final answer. `observations`: (tool, what the model was given) per call.

    `run_result`: smolagents' `RunResult` (token usage, timing, steps, state) when the run or the
    agent asked for the full result (`return_full_result`, as in smolagents' `run`), else None."""

    output: Any
    observations: tuple[tuple[str, str], ...] = ()
    decided: tuple[tuple[str, Outcome], ...] = ()
    run_result: RunResult | None = None


@dataclass(frozen=True)
class AwaitingApproval:
    """The run stopped at gated calls; store this (`to_dict`) with the memory and resume later.

    `paused` holds what the run paused on (approval id, version, args hash per call) and
    `signature` the gate keyring's MAC over it and the run's identity: `from_dict` refuses a
    record that was changed (`TamperedState`), so a resume can neither switch user or session
    nor swap the calls it decides."""

    pending: tuple[Pending, ...]
    session_id: str
    origin_message_id: str
    user_id: str
    run_id: str = ""
    observations: tuple[tuple[str, str], ...] = ()
    decided: tuple[tuple[str, Outcome], ...] = ()
    paused: tuple[Paused, ...] = ()
    agent_id: str = ""
    signature: str = ""

    @property
    def approval_ids(self) -> tuple[str, ...]:
        return tuple(p.approval_id for p in self.pending)

    def signed_fields(self) -> dict[str, Any]:
        """What the signature covers."""
        return {
            "paused": [p.to_dict() for p in self.paused],
            "session_id": self.session_id,
            "origin_message_id": self.origin_message_id,
            "user_id": self.user_id,
            "run_id": self.run_id,
            "agent_id": self.agent_id,
        }

    def to_dict(self) -> dict[str, Any]:
        """What the run paused on and who it runs for, signed; the cards are re-read from the store."""
        return {"approval_ids": list(self.approval_ids), **self.signed_fields(), "signature": self.signature}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], gate: EffectGate) -> AwaitingApproval:
        """The record `to_dict` made, verified with the gate's keyring (`TamperedState` if not)."""
        try:
            paused = tuple(Paused.from_dict(p) for p in data["paused"])
            made = cls(
                pending=(),
                session_id=str(data["session_id"]),
                origin_message_id=str(data["origin_message_id"]),
                user_id=str(data["user_id"]),
                run_id=str(data.get("run_id", "")),
                paused=paused,
                agent_id=str(data.get("agent_id", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise TamperedState(f"not an AwaitingApproval record: {exc!r}") from exc
        verify_state(gate, _AWAITING, made.signed_fields(), data.get("signature"))
        pending = []
        for p in paused:
            card = gate.card(p.approval_id)
            pending.append(
                Pending(approval_id=p.approval_id, version=p.version, card=card, status=card.status)
            )
        return dataclasses.replace(made, pending=tuple(pending), signature=str(data["signature"]))


RunOutcome = Finished | AwaitingApproval


@dataclass(frozen=True)
class Approve:
    """Run the approved call with this grant (from `gate.approve` or `effectgate approve`)."""

    grant: Grant | str


@dataclass(frozen=True)
class Deny:
    approver: Approver
    reason: str


Decision = Approve | Deny


class GatedTool(Tool):
    """A smolagents Tool standing for `inner`, whose every call goes through the gate.

    It keeps no attribute that leads to the gate, the `GatedAgent` or `inner`: a CodeAgent's
    code can read and set any attribute whose name is not a dunder (`refund_order._owner`,
    `setattr`), so what it may reach from a tool is only the call itself, held in a closure."""

    skip_forward_signature_validation = True

    def __init__(self, inner: Tool, owner: GatedAgent) -> None:
        self.name = inner.name
        self.description = inner.description
        self.inputs = dict(inner.inputs)
        self.output_type = inner.output_type
        self.output_schema = getattr(inner, "output_schema", None)
        self._run = _through(owner, inner.name)
        self._saved = saved_tool(inner)  # a closure too: `to_dict` gives inner's code, marked
        super().__init__()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if args:  # bound as Python binds them to the inner tool's `forward(...)`, or refused
            if len(args) > len(self.inputs):
                raise TypeError(
                    f"{self.name}() takes {len(self.inputs)} positional arguments but {len(args)} were given"
                )
            positional = dict(zip(self.inputs, args, strict=False))
            for name in positional.keys() & kwargs.keys():
                raise TypeError(f"{self.name}() got multiple values for argument {name!r}")
            kwargs = {**positional, **kwargs}
        return self._run(kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The inner tool's `to_dict()`, marked as gated: what `agent.save` writes (`_saving`)."""
        return self._saved()


def _through(owner: GatedAgent, name: str) -> Callable[[Any], Any]:
    """`owner._call(name, args)` as a closure: reachable from model code only through dunders."""

    def run(args: Any) -> Any:
        return owner._call(name, args)

    return run


def _text(outcome: Outcome) -> str:
    return outcome.for_model()


class GatedAgent:
    """A smolagents agent (ToolCallingAgent or CodeAgent) whose tools run through the gate.

    Either name each tool's effect next to the agent's own tools:

        GatedAgent(agent, effects={"get_order": read(), "refund_order": money("finance")})

    which builds the gate from the agent's tools (`native_tools`, every tool but `final_answer`)
    with `effectgate.rows.gate_for` on the store at `db` (the embedded SQLite file
    `effectgate.db` by default, set up on first use). The table is deny-by-default: a tool with
    no row, or a row naming no tool, raises `TableError` and nothing is changed. `agent_id`
    defaults to "agent" there, the only agent the table allows.

    Or pass a gate built from an effect table: `GatedAgent(agent, gate, agent_id="support")`
    (`agent_id` is required then: it is the name the table's allowlist gives the agent).

    Either way `.gate` is the gate approvals go through. The agent is changed in place (its
    tools are replaced by `GatedTool`s) and kept as `.agent`. `close()` (or `with`) closes a
    gate built from `effects`; a gate passed in stays open, it is the caller's.
    """

    def __init__(
        self,
        agent: MultiStepAgent,
        gate: EffectGate | None = None,
        *,
        effects: Mapping[str, Row] | None = None,
        agent_id: str | None = None,
        db: str | None = None,
        unknown: Unknown = "raise",
    ) -> None:
        self._owns_gate = gate is None
        if gate is None:
            if effects is None:
                raise TypeError(
                    "GatedAgent needs effects={tool name: row} naming each tool's effect "
                    '(e.g. effects={"get_order": read()}), or a gate built from an effect table'
                )
            agent_id = "agent" if agent_id is None else agent_id
            if not agent_id:
                raise ValueError("agent_id must be a non-empty name")
            gate = gate_for(native_tools(agent), effects, agent_id=agent_id, db=db or DEFAULT_DB)
        elif effects is not None or db is not None:
            raise TypeError(
                "GatedAgent takes a gate or effects= (and db=), not both: a gate you built already "
                "has its table and store"
            )
        if not agent_id:
            raise ValueError("GatedAgent needs the agent_id the effect table's allowlist names")
        self.agent = agent
        self.gate = gate
        self.agent_id = agent_id
        self.code = isinstance(agent, CodeAgent)
        self._lock = threading.Lock()
        self._pending: dict[str, Pending] = {}
        self._step: dict[tuple[str, str], list[Outcome]] = {}
        # the identity of the run in progress: an attribute, not a ContextVar, because a CodeAgent's
        # executor may run the code in a worker thread that does not inherit the caller's context
        self._current: CallContext | None = None
        # The CodeAgent stop: set by the first gated call that stops a snippet; every later call
        # of the run raises again and runs nothing, until the run is resumed.
        self._stopped: Pending | None = None
        self._parallel = False  # the ToolCallingAgent step in progress has more than one call
        for name, tool in list(agent.tools.items()):
            if isinstance(tool, GatedTool | _StopGuard):
                continue
            if name == "final_answer":
                if self.code:
                    agent.tools[name] = _StopGuard(tool, self)
                continue
            check_wrappable(gate, agent_id=agent_id, name=name, unknown=unknown)
            agent.tools[name] = GatedTool(tool, self)
        if isinstance(agent, ToolCallingAgent):
            self._patch_tool_calling(agent)
        if isinstance(agent, CodeAgent):
            keep_logs_at_a_stop(agent)  # the step keeps the snippet's output up to a gated call
        self._plain_run = refuse_plain_runs(agent)  # smolagents' own run has no identity
        mark_saved_agent(agent, lambda: [n for n, t in agent.tools.items() if isinstance(t, GatedTool)])

    # -- smolagents hooks

    def _patch_tool_calling(self, agent: ToolCallingAgent) -> None:
        original_execute = agent.execute_tool_call
        original_process = agent.process_tool_calls
        owner = self

        def execute_tool_call(self_: Any, tool_name: str, arguments: Any) -> Any:
            tool = self_.tools.get(tool_name)
            if isinstance(tool, GatedTool):  # the gate validates against the table, and records it
                arguments = received(self_, tool, arguments)
                if keywords(arguments):
                    return tool(**arguments, sanitize_inputs_outputs=True)
                return owner._call(tool_name, arguments)  # not keywords: the gate refuses it
            return original_execute(tool_name, arguments)

        def process_tool_calls(self_: Any, chat_message: Any, memory_step: Any) -> Any:
            owner._register_step(chat_message.tool_calls or [])
            try:
                yield from original_process(chat_message, memory_step)
            finally:
                owner._parallel = False
                with owner._lock:
                    owner._step.clear()

        agent.execute_tool_call = types.MethodType(execute_tool_call, agent)
        agent.process_tool_calls = types.MethodType(process_tool_calls, agent)

    def _gated(self, name: str) -> bool:
        return is_gated(self.gate, name)

    def _register_step(self, tool_calls: Sequence[Any]) -> None:
        """Register one model step's gated calls together (the core's parallel rule)."""
        self._parallel = len(tool_calls) > 1
        calls = []
        for c in tool_calls:
            tool = self.agent.tools.get(c.function.name)
            if self._gated(c.function.name) and isinstance(tool, GatedTool):
                # what execute_tool_call will send (smolagents gives it `arguments or {}`)
                calls.append((c.function.name, received(self.agent, tool, c.function.arguments or {}), c.id))
        if not calls:
            return
        outcomes = self.gate.call_step(calls, self._context())
        with self._lock:
            for (name, args, _), outcome in zip(calls, outcomes, strict=True):
                self._step.setdefault(self._step_key(name, args), []).append(outcome)

    @staticmethod
    def _step_key(name: str, args: Any) -> tuple[str, str]:
        try:
            return name, args_hash(name, args)
        except Exception:
            return name, repr(args)

    def _context(self) -> CallContext:
        ctx = self._current
        if ctx is None:
            raise Stop(outside_a_run())
        return ctx

    # -- one call

    def _call(self, name: str, args: Any) -> Any:
        ctx = self._context()
        self._check_stopped()
        with self._lock:
            queued = self._step.get(self._step_key(name, args))
            decided = queued.pop(0) if queued else None
        try:
            outcome = decided if decided is not None else self.gate.call(name, args, ctx)
        except EffectGateError as exc:
            return f"Refused: {exc}"
        except Exception as exc:  # the tool's own failure, recorded: shown as smolagents shows it
            return tool_failed(
                name, args, exc, code=self.code, parallel=self._parallel, logger=self.agent.logger
            )
        if isinstance(outcome, Executed):
            return outcome.result
        if isinstance(outcome, Invalid):
            return bad_argument(outcome, code=self.code, parallel=self._parallel, logger=self.agent.logger)
        if isinstance(outcome, Pending):
            with self._lock:
                self._pending[outcome.approval_id] = outcome
            # the run stops before the next model call, also when model code swallows the
            # BaseException (a `return`, `break` or `continue` in a `finally` ends its unwinding)
            self.agent.interrupt()
            if self.code:
                self._stopped = outcome
                raise ApprovalRequired(outcome)
        return _text(outcome)

    def _check_stopped(self) -> None:
        """After a gated call stopped this CodeAgent run, refuse every later call (nothing runs)."""
        stopped = self._stopped
        if stopped is not None:
            raise ApprovalRequired(stopped)

    # -- lifecycle

    def close(self) -> None:
        """Close the gate this agent built from `effects` (a gate passed in is left open)."""
        if self._owns_gate:
            self.gate.close()

    def __enter__(self) -> GatedAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- runs

    def run(
        self,
        task: str,
        *,
        session_id: str | None = None,
        origin_message_id: str | None = None,
        user_id: str | None = None,
        run_id: str = "",
        reset: bool = True,
        max_steps: int | None = None,
        return_full_result: bool | None = None,
    ) -> RunOutcome:
        """Run the agent on `task` for this user message; stop at the first step with gated calls.

        All three identity values are required: `MissingIdentity` names each one missing.
        `return_full_result` (None: the agent's own setting) puts smolagents' `RunResult` on
        `Finished.run_result`, as smolagents' `run` would return it."""
        ctx = run_context(
            session_id=session_id,
            origin_message_id=origin_message_id,
            user_id=user_id,
            agent_id=self.agent_id,
            run_id=run_id,
            model_id=model_id_of(self.agent),
        )
        with self._lock:
            self._pending.clear()
            self._step.clear()
        self._stopped = None
        observations: list[tuple[str, str]] = []
        final: Any = None
        if self._current is not None:
            raise RuntimeError("this GatedAgent is already running (smolagents agents are not reentrant)")
        self._current = ctx
        started = time.time()
        step_calls: list[str] = []
        try:
            for event in self._plain_run(task, stream=True, reset=reset, max_steps=max_steps):
                kind = type(event).__name__
                if kind == "ToolCall":
                    step_calls.append(event.name)
                elif kind == "ToolOutput" and not event.is_final_answer:
                    observations.append((event.tool_call.name, event.observation))
                elif kind == "ActionStep":
                    # a step's only call with a bad argument raised; the model reads the error
                    if isinstance(event.error, AgentToolCallError) and len(step_calls) == 1:
                        observations.append((step_calls[0], str(event.error)))
                    step_calls = []
                elif kind == "FinalAnswerStep":
                    final = event.output
        except ApprovalRequired:
            pass
        except AgentError:
            if not self._pending:
                raise
        except Stop as stop:
            raise stop.error from None
        finally:
            self._current = None
            self.agent.interrupt_switch = False
        with self._lock:
            pending = tuple(self._pending.values())
            self._pending.clear()
        if pending:
            awaiting = AwaitingApproval(
                pending=pending,
                session_id=ctx.session_id,
                origin_message_id=ctx.origin_message_id,
                user_id=ctx.user_id,
                run_id=run_id,
                observations=tuple(observations),
                paused=tuple(Paused.of(p) for p in pending),
                agent_id=self.agent_id,
            )
            return dataclasses.replace(
                awaiting, signature=sign_state(self.gate, _AWAITING, awaiting.signed_fields())
            )
        full = (
            run_result(self.agent, final, started=started)
            if wants_full_result(self.agent, return_full_result)
            else None
        )
        return Finished(output=final, observations=tuple(observations), run_result=full)

    def _bind(self, awaiting: AwaitingApproval, decisions: Mapping[str, Decision]) -> None:
        """Every decision must answer a call this run paused on, at the version and args hash it
        paused on; an approval carries a grant for exactly that call; a denial has a reason and
        an approver the call's role allows (`PolicyViolation`, `WrongApprover`, as `gate.deny`
        would raise). Checked for all decisions before any of them is applied: a mismatch raises
        `DecisionMismatch` and nothing runs."""
        verify_state(self.gate, _AWAITING, awaiting.signed_fields(), awaiting.signature)
        paused = {p.approval_id: p for p in awaiting.paused}
        for approval_id, decision in decisions.items():
            at = paused.get(approval_id)
            if at is None:
                raise DecisionMismatch(
                    str(approval_id), f"this run did not pause on approval {approval_id!r}; nothing ran"
                )
            if isinstance(decision, Approve):
                bind_decision(self.gate, at, _token(decision))
            elif not isinstance(decision, Deny):
                raise DecisionMismatch(at.approval_id, f"a decision is Approve or Deny, not {decision!r}")
            else:
                card = self.gate.card(at.approval_id)
                if card.status in ("pending", "approved") and (card.version, card.args_hash) != (
                    at.version,
                    at.args_hash,
                ):
                    raise DecisionMismatch(
                        at.approval_id,
                        f"approval {at.approval_id} is at version {card.version} now; the run paused "
                        f"on version {at.version}: decide the current card again",
                    )
                # what gate.deny checks, checked here too: a denial refused after an approved
                # sibling had run would leave the resume half applied
                if not decision.reason or not decision.reason.strip():
                    raise PolicyViolation("a denial needs a reason the model can be told")
                if card.status in ("pending", "approved") and not self.gate.policy.role_satisfies(
                    decision.approver.role, card.approver_role
                ):
                    raise WrongApprover(
                        at.approval_id,
                        f"{card.tool} needs role {card.approver_role}; {decision.approver.id} holds "
                        f"{decision.approver.role}",
                    )

    def decide(self, awaiting: AwaitingApproval, decisions: Mapping[str, Decision]) -> dict[str, Outcome]:
        """Apply decisions through the gate: execute approved calls (once), deny the rest named.
        Every decision is bound to its call first (see `_bind`); denials are recorded before any
        approved call runs, so a denial the gate still refuses (it just expired) runs nothing."""
        self._bind(awaiting, decisions)
        paused = {p.approval_id: p for p in awaiting.paused}
        named = [(p, decisions[p.approval_id]) for p in awaiting.pending if p.approval_id in decisions]
        done: dict[str, Outcome] = {}
        for pending, decision in named:
            if isinstance(decision, Deny):
                done[pending.approval_id] = self._deny(paused[pending.approval_id], decision)
        for pending, decision in named:
            if isinstance(decision, Approve):
                done[pending.approval_id] = self._execute(pending, decision)
        return {p.approval_id: done[p.approval_id] for p, _ in named}

    def _execute(self, pending: Pending, decision: Approve) -> Outcome:
        stored = self.gate.result(pending.approval_id)
        if stored is not None:
            return stored
        try:
            return self.gate.execute(_token(decision))
        except (TokenError, ApprovalError) as exc:
            return Refused(
                code="denied", message=str(exc), tool=pending.card.tool, approval_id=pending.approval_id
            )

    def _deny(self, paused: Paused, decision: Deny) -> Outcome:
        row = self.gate.store.get_approval(paused.approval_id)
        if row is not None and row.status == "denied":
            return Refused(
                code="denied",
                message=f"{row.tool} was denied: {row.reason}",
                tool=row.tool,
                approval_id=row.id,
            )
        return self.gate.deny(
            paused.approval_id, approver=decision.approver, reason=decision.reason, version=paused.version
        )

    def resume(
        self,
        awaiting: AwaitingApproval,
        decisions: Mapping[str, Decision],
        *,
        max_steps: int | None = None,
        return_full_result: bool | None = None,
    ) -> RunOutcome:
        """Apply the decisions, then continue the run (memory kept) with how each call ended.

        The outcome's `decided` holds each decided approval's outcome (what the model is told);
        `return_full_result` is `run`'s."""
        done = self.decide(awaiting, decisions)
        outcome = self.run(
            continuation(awaiting, done),
            session_id=awaiting.session_id,
            origin_message_id=awaiting.origin_message_id,
            user_id=awaiting.user_id,
            run_id=awaiting.run_id,
            reset=False,
            max_steps=max_steps,
            return_full_result=return_full_result,
        )
        return dataclasses.replace(outcome, decided=tuple(done.items()))


def _token(decision: Approve) -> str:
    return decision.grant.token if isinstance(decision.grant, Grant) else decision.grant


class _StopGuard(Tool):
    """A CodeAgent's `final_answer`, refused (raising `ApprovalRequired` again) once a gated call
    has stopped the run: the snippet cannot end the run as if nothing waited."""

    skip_forward_signature_validation = True

    def __init__(self, inner: Tool, owner: GatedAgent) -> None:
        self.name = inner.name
        self.description = inner.description
        self.inputs = dict(inner.inputs)
        self.output_type = inner.output_type
        self._answer = _guarded(owner, inner)  # a closure, like GatedTool's: nothing to reach
        self._saved = unmarked(inner)  # final_answer is saved as it was
        super().__init__()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._answer(*args, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        return self._saved()


def _guarded(owner: GatedAgent, inner: Tool) -> Callable[..., Any]:
    def answer(*args: Any, **kwargs: Any) -> Any:
        owner._check_stopped()
        return inner(*args, **kwargs)

    return answer


def continuation(awaiting: AwaitingApproval, done: Mapping[str, Outcome]) -> str:
    """The task text that continues a run: how each decided call ended, and what still waits."""
    lines = ["effectgate: the calls that waited for approval were decided."]
    for pending in awaiting.pending:
        card = pending.card
        call = f"{card.tool}({json.dumps(dict(card.args), sort_keys=True)})"
        outcome = done.get(pending.approval_id)
        if isinstance(outcome, Executed):
            lines.append(
                f"- {call} was approved and has run; result: {outcome.for_model()}. Do not call it again."
            )
        elif outcome is not None:
            lines.append(
                f"- {call} did not run: {outcome.for_model()} Do not call it again for this request."
            )
        else:
            lines.append(f"- {call} is still waiting for approval (approval {pending.approval_id}).")
    lines.append("Continue with the user's request.")
    return "\n".join(lines)


def native_tools(agent: MultiStepAgent) -> list[NativeTool]:
    """The gate's view (`native_tool`) of every tool of `agent` but `final_answer`: what
    `GatedAgent(agent, effects=...)` builds its gate from. For gate options `GatedAgent` does not
    take (`policy=`, `keyring=`, ...): `gate_for(native_tools(agent), effects, agent_id=..., ...)`,
    then `GatedAgent(agent, gate, agent_id=...)`. An agent already gated is refused (TypeError)."""
    tools: list[NativeTool] = []
    for name, tool in agent.tools.items():
        if name == "final_answer":
            continue
        if isinstance(tool, GatedTool | _StopGuard):
            raise TypeError(f"tool {name!r} is already gated: this agent was given to a GatedAgent")
        tools.append(native_tool(tool))
    return tools


def gate_agent(
    agent: MultiStepAgent, gate: EffectGate, *, agent_id: str, unknown: Unknown = "raise"
) -> GatedAgent:
    """Wrap the agent's whole tool list (in place) and return the `GatedAgent` that runs it."""
    return GatedAgent(agent, gate, agent_id=agent_id, unknown=unknown)
