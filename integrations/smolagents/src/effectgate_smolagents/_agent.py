"""Gated smolagents tools, and a run that stops at a gated call and continues after the decision.

smolagents has no pause primitive, so `GatedAgent` builds one from what it has:

- Every tool of the agent but smolagents' own `final_answer` is replaced by a `GatedTool` (same name,
  description, inputs and output type). Its `forward` sends the call through the gate, with the
  identity of the current run (never anything the model wrote).
- A read or a write runs through the gate and returns its result. A refusal returns the gate's
  message as the tool's result, so the model can correct itself; in a `CodeAgent` it is raised
  there (`GateRefusal`), so the snippet stops and the model reads it before it can answer (code
  cannot go on to a `final_answer` claiming the call done, unread). A bad argument (nothing runs)
  raises `AgentToolCallError` with the gate's message where smolagents raises it, and is the
  call's result elsewhere (`_arguments`). A tool that raises fails as smolagents shows a plain
  tool's error (`_errors`), except that the other calls of a parallel step keep their
  observations (smolagents#2457 drops them when one call raises).
- A gated call registers its approval. In a `ToolCallingAgent` the tool answers "needs approval"
  and calls `agent.interrupt()`, so the step's other calls finish and are kept in memory, and the
  run stops before the next model call. In a `CodeAgent` it raises `ApprovalRequired`, a
  `BaseException` no handler in smolagents catches, so nothing after the gated call in the code
  block runs. Either way `GatedAgent.run` returns `AwaitingApproval` (approval ids, cards).
- The CodeAgent stop is total: every later tool call of that run raises `ApprovalRequired` again
  and runs nothing (`_check_stopped`); code that swallows it still ends the run before the next
  model call. A `GatedTool` keeps the gate and the agent only in a closure (`_tools`).
- `AwaitingApproval` records what the run paused on, signed (`_outcomes`). `resume` checks the
  run can go on, binds every decision to its call, applies it through the gate (an approved call
  runs once) and continues with `agent.run(..., reset=False)`, telling the model (`_decisions`).

A `ToolCallingAgent`'s step registers its gated calls together and has the gate validate their
arguments (`_calling`); the tools put in place of the agent's own are in `_tools`. A manager is
wrapped only when its managed agents (at every depth) are wrapped on the same gate; a run is
refused when a tool or a managed agent was added after wrapping (`_managed`), or when a CodeAgent's
code may import a module neither effect-free nor named in `allow_imports=` (`_imports`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from smolagents import CodeAgent, ToolCallingAgent
from smolagents.agents import MultiStepAgent
from smolagents.utils import AgentError, AgentToolCallError

from effectgate import CallContext, EffectGate, Executed, Invalid, Outcome, Pending, Refused
from effectgate.adapter import Paused, Unknown, check_wrappable
from effectgate.errors import EffectGateError
from effectgate.rows import DEFAULT_DB, Row, gate_for

from ._arguments import bad_argument
from ._calling import gated_calls, route_tool_calls, step_key
from ._code import ApprovalRequired, keep_logs_at_a_stop
from ._decisions import Decision, apply_decisions, checked, continuation
from ._errors import Snippet, gate_refused, tool_failed
from ._identity import check_max_steps, model_id_of, outside_a_run, refuse_plain_runs, run_context
from ._imports import acknowledged, freeze
from ._managed import adopt, check_team, check_tools, hide_members, own, serve_as_member
from ._memory import check_resumable, forget_others
from ._native import keeping_output, own_error, own_output
from ._outcomes import AwaitingApproval, Finished, RunOutcome, signed
from ._result import run_result, wants_full_result
from ._saving import mark_saved_agent
from ._tools import GatedTool, StopGuard, is_own_final_answer, is_wrapped, native_tools


class GatedAgent:
    """A smolagents agent (ToolCallingAgent or CodeAgent) whose tools run through the gate.

    Either name each tool's effect next to the agent's own tools:

        GatedAgent(agent, effects={"get_order": read(), "refund_order": money("finance")})

    which builds the gate from the agent's tools (`native_tools`: all but smolagents' `final_answer`)
    with `effectgate.rows.gate_for` on the store at `db` (the embedded SQLite file
    `effectgate.db` by default, set up on first use). The table is deny-by-default: a tool with
    no row, or a row naming no tool, raises `TableError` and nothing is changed. `agent_id`
    defaults to "agent" there, the only agent the table allows.

    Or pass a gate built from an effect table: `GatedAgent(agent, gate, agent_id="support")`
    (`agent_id` is required then: it is the name the table's allowlist gives the agent).

    Either way `.gate` is the gate approvals go through. The agent is changed in place (its
    tools are replaced by `GatedTool`s) and kept as `.agent`. `close()` (or `with`) closes a
    gate built from `effects`; a gate passed in stays open, it is the caller's.

    A manager (`managed_agents=[...]`) is taken only with a gate, and only when each managed
    agent, at every depth, was wrapped on that gate first; otherwise `UnknownTool`, whatever
    `unknown=` says (`_managed`). So is a CodeAgent whose code may import modules beyond a few
    effect-free ones (`_imports`) that `allow_imports` (`["numpy"]`, or "*" for any) does not name:
    each one named is your decision that model code may use it ungated, with no tool call. It is
    not saved: give it again to wrap a loaded agent. Everything is checked before anything changes.
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
        allow_imports: Iterable[str] | None = None,
    ) -> None:
        allowed = acknowledged(allow_imports)  # bad input raises here, before anything
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
            check_team(agent, None, allowed)  # a managed agent cannot be on a gate not built yet
            gate = gate_for(native_tools(agent), effects, agent_id=agent_id, db=db or DEFAULT_DB)
        elif effects is not None or db is not None:
            raise TypeError(
                "GatedAgent takes a gate or effects= (and db=), not both: a gate you built already "
                "has its table and store"
            )
        if not agent_id:
            raise ValueError("GatedAgent needs the agent_id the effect table's allowlist names")
        members = check_team(agent, gate, allowed)  # before anything is changed, like every tool's row
        for name, tool in agent.tools.items():
            if is_wrapped(tool):  # another GatedAgent's: it calls with that one's run identity
                raise TypeError(f"tool {name!r} is another GatedAgent's: give this agent the plain tool")
            if not is_own_final_answer(name, tool):
                check_wrappable(gate, agent_id=agent_id, name=name, unknown=unknown)
        self.agent = agent
        self.gate = gate
        self.agent_id = agent_id
        self.allow_imports = allowed  # the modules acknowledged, checked again at each run
        self.code = isinstance(agent, CodeAgent)
        self._snippet = Snippet()  # what a CodeAgent's code block in progress was refused
        self._lock = threading.Lock()
        self._pending: dict[str, Pending] = {}
        self._step: dict[tuple[str, str], list[Outcome]] = {}
        # the run's identity: not a ContextVar, the CodeAgent's executor may run code in another thread
        self._current: CallContext | None = None
        # The CodeAgent stop: set by the first gated call that stops a snippet; every later call
        # of the run raises again and runs nothing, until the run is resumed.
        self._stopped: Pending | None = None
        self._parallel = False  # the ToolCallingAgent step in progress has more than one call
        self._memory_of: tuple[str, str, list[Any]] | None = None  # the last run's session, user, steps
        for name, tool in list(agent.tools.items()):
            if is_own_final_answer(name, tool):  # a final_answer of the user's is gated
                if self.code:
                    agent.tools[name] = StopGuard(tool, self)
                continue
            agent.tools[name] = GatedTool(tool, self)
        if isinstance(agent, ToolCallingAgent):
            route_tool_calls(agent, self)
        if isinstance(agent, CodeAgent):
            keep_logs_at_a_stop(agent, self._snippet)  # the step keeps its output up to a gated call
            freeze(agent)  # the checked import lists, as tuples
        # smolagents' own run has no identity: refused, unless a gated manager's run calls it
        self._plain_run = refuse_plain_runs(agent, serve_as_member(self))
        own(agent, self)
        adopt(self, members)
        mark_saved_agent(agent, lambda: [n for n, t in agent.tools.items() if isinstance(t, GatedTool)])

    # -- smolagents hooks

    def _register_step(self, tool_calls: Sequence[Any]) -> None:
        """Register one model step's gated calls together (the core's parallel rule)."""
        runs, calls = gated_calls(self.agent, self.gate, tool_calls)
        self._parallel = runs > 1
        if not calls:
            return
        outcomes = self.gate.call_step(calls, self._context())
        with self._lock:
            for (name, args, _), outcome in zip(calls, outcomes, strict=True):
                self._step.setdefault(step_key(name, args), []).append(outcome)

    def _end_step(self) -> None:
        self._parallel = False
        with self._lock:
            self._step.clear()

    def _context(self) -> CallContext:
        ctx = self._current
        if ctx is None:  # an Exception: code of another run reads it, an application catches it
            raise outside_a_run()
        return ctx

    # -- one call

    def _call(self, name: str, args: Any) -> Any:
        ctx, code = self._context(), self._snippet if self.code else None  # refusals raise in code
        self._check_stopped(answer=name == "final_answer")  # a final_answer of the user's too
        with self._lock:
            queued = self._step.get(step_key(name, args))
            decided = queued.pop(0) if queued else None
        try:
            with keeping_output() as kept:
                outcome = decided if decided is not None else self.gate.call(name, args, ctx)
        except EffectGateError as exc:
            return gate_refused(name, exc, code=code)
        except Exception as exc:  # the tool's own failure, recorded: shown as smolagents shows it
            return tool_failed(
                name, args, own_error(exc), code=self.code, parallel=self._parallel, logger=self.agent.logger
            )
        if isinstance(outcome, Executed):
            return own_output(outcome, kept)
        if isinstance(outcome, Invalid):
            return bad_argument(outcome, code=code, parallel=self._parallel, logger=self.agent.logger)
        if isinstance(outcome, Pending):
            with self._lock:
                self._pending[outcome.approval_id] = outcome
            # the run stops before the next model call, also when model code swallows the
            # BaseException (a `return`, `break` or `continue` in a `finally` ends its unwinding)
            self.agent.interrupt()
            if self.code:
                self._stopped = outcome
                raise ApprovalRequired(outcome)
        if isinstance(outcome, Refused):
            return gate_refused(name, outcome, code=code)
        return outcome.for_model()

    def _check_stopped(self, answer: bool = False) -> None:
        """After a gated call stopped this CodeAgent run, refuse every later call (nothing runs);
        a final answer (`answer`) also after a refused call of its code block (`Snippet`)."""
        stopped = self._stopped
        if stopped is not None:
            raise ApprovalRequired(stopped)
        if answer:
            self._snippet.check_answer()

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
        check_max_steps(max_steps)
        ctx = run_context(
            session_id=session_id,
            origin_message_id=origin_message_id,
            user_id=user_id,
            agent_id=self.agent_id,
            run_id=run_id,
            model_id=model_id_of(self.agent),
        )
        return self._drive(task, ctx, reset=reset, max_steps=max_steps, return_full_result=return_full_result)

    def _drive(
        self,
        task: str,
        ctx: CallContext,
        *,
        reset: bool,
        max_steps: int | None,
        return_full_result: bool | None,
        additional_args: Mapping[str, Any] | None = None,
    ) -> RunOutcome:
        """One run as `ctx`, refused before the model is asked anything (`_check_runnable`)."""
        self._check_runnable()
        with self._lock:  # one run at a time; a second one changes nothing of the first
            if self._current is not None:
                raise RuntimeError("this GatedAgent is already running (smolagents agents are not reentrant)")
            forget_others(self.agent, self._memory_of, ctx, reset=reset)  # before anything changes
            self._current = ctx
            self._pending.clear()
            self._step.clear()
        self._stopped = None
        observations: list[tuple[str, str]] = []
        final: Any = None
        started = time.time()
        step_calls: dict[Any, str] = {}  # the step's calls by id: smolagents runs the last under each
        extra = {"additional_args": dict(additional_args)} if additional_args else {}
        try:
            for event in self._plain_run(task, stream=True, reset=reset, max_steps=max_steps, **extra):
                kind = type(event).__name__
                if kind == "ToolCall":
                    step_calls[event.id] = event.name
                elif kind == "ToolOutput" and not event.is_final_answer:
                    observations.append((event.tool_call.name, event.observation))
                elif kind == "ActionStep":
                    # a step's only call with a bad argument raised; the model reads the error
                    if isinstance(event.error, AgentToolCallError) and len(step_calls) == 1:
                        observations.append((next(iter(step_calls.values())), str(event.error)))
                    step_calls = {}
                    if self._pending:  # stop here: at max_steps smolagents would ask the model for an answer
                        break
                elif kind == "FinalAnswerStep":
                    final = event.output
        except ApprovalRequired:
            pass
        except AgentError:
            if not self._pending:
                raise
        finally:
            self._current = None
            self._memory_of = (ctx.session_id, ctx.user_id, self.agent.memory.steps)
            self.agent.interrupt_switch = False
        with self._lock:
            pending = tuple(self._pending.values())
            self._pending.clear()
        if pending:
            return signed(
                AwaitingApproval(
                    pending=pending,
                    session_id=ctx.session_id,
                    origin_message_id=ctx.origin_message_id,
                    user_id=ctx.user_id,
                    run_id=ctx.run_id,
                    observations=tuple(observations),
                    paused=tuple(Paused.of(p) for p in pending),
                    agent_id=ctx.agent_id,
                ),
                self.gate,
            )
        full = None
        if wants_full_result(self.agent, return_full_result):
            full = run_result(self.agent, final, started=started)
        return Finished(output=final, observations=tuple(observations), run_result=full)

    def _check_runnable(self) -> None:
        """Refused while it runs, or with a tool, managed agent or code import added after wrapping."""
        if self._current is not None:
            raise RuntimeError("this GatedAgent is already running (smolagents agents are not reentrant)")
        check_tools(self.agent, "the agent", self.allow_imports)
        adopt(self, check_team(self.agent, self.gate, self.allow_imports, owner=self))
        hide_members(self.agent)  # a CodeAgent's code is handed each managed agent's call only

    def decide(self, awaiting: AwaitingApproval, decisions: Mapping[str, Decision]) -> dict[str, Outcome]:
        """Apply decisions through the gate (`_decisions.apply_decisions`): approved calls run once,
        the rest named are denied; a record another gated agent made is refused (DecisionMismatch)."""
        return apply_decisions(self.gate, awaiting, decisions, agent_id=self.agent_id)

    def resume(
        self,
        awaiting: AwaitingApproval,
        decisions: Mapping[str, Decision],
        *,
        max_steps: int | None = None,
        return_full_result: bool | None = None,
    ) -> RunOutcome:
        """Apply the decisions, then continue the run (memory kept) with how each call ended; the
        outcome's `decided` holds each decided approval's outcome. `return_full_result` is `run`'s."""
        check_max_steps(max_steps)  # smolagents' own check comes after the decisions ran
        check_resumable(self.gate, self.agent, self._memory_of, checked(awaiting, decisions))  # whose memory
        self._check_runnable()  # a continuation that would be refused: nothing is decided
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


def gate_agent(
    agent: MultiStepAgent,
    gate: EffectGate,
    *,
    agent_id: str,
    unknown: Unknown = "raise",
    allow_imports: Iterable[str] | None = None,
) -> GatedAgent:
    """Wrap the agent's whole tool list (in place) and return the `GatedAgent` that runs it."""
    return GatedAgent(agent, gate, agent_id=agent_id, unknown=unknown, allow_imports=allow_imports)
