"""The identity a gated run needs, and a clear error when it is missing.

The gate keys every call on the session, the id of the user message the run answers, and the
user; only the application knows them, so a gated agent never runs without all three. The one
line that passes them:

    gated.run(task, session_id="s-ada", origin_message_id="m3", user_id="u1")

`run_context` checks them for `GatedAgent.run` and names exactly the ones missing. smolagents'
own `agent.run(task)` (also `agent(task)` for a managed agent) carries none of them, so
`refuse_plain_runs` makes a wrapped agent's own `run` raise `MissingIdentity` before the model
is asked anything, saying to run it through its `GatedAgent`, unless a gated manager's run is
calling it as a managed agent (`_managed`): then it runs with that run's identity.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from smolagents.agents import MultiStepAgent

from effectgate import CallContext
from effectgate.adapter import MissingIdentity, missing_identity

ONE_LINE = "gated.run(task, session_id=..., origin_message_id=..., user_id=...)"
_WHAT = {
    "session_id": "the conversation",
    "origin_message_id": "the id of the user message this run answers",
    "user_id": "the user the run acts for",
}


def model_id_of(agent: MultiStepAgent) -> str:
    """The agent's model as smolagents names it (`Model.model_id`), '' when it has none: recorded
    with each approval and execution, never used to decide anything."""
    name = getattr(getattr(agent, "model", None), "model_id", None)
    return name if isinstance(name, str) else ""


def run_context(
    *,
    session_id: str | None,
    origin_message_id: str | None,
    user_id: str | None,
    agent_id: str,
    run_id: str,
    model_id: str = "",
) -> CallContext:
    """The run's `CallContext`; `MissingIdentity` naming each value that is missing or empty."""
    given = {"session_id": session_id, "origin_message_id": origin_message_id, "user_id": user_id}
    missing = [name for name, value in given.items() if not isinstance(value, str) or not value.strip()]
    if missing:
        names = " and ".join(missing) if len(missing) < 3 else "session_id, origin_message_id and user_id"
        what = "; ".join(f"{name} is {_WHAT[name]}" for name in missing)
        it = "them" if len(missing) > 1 else "it"
        raise missing_identity(names, f"pass {it} to GatedAgent.run ({what}): {ONE_LINE}")
    return CallContext(
        session_id=str(session_id),
        origin_message_id=str(origin_message_id),
        user_id=str(user_id),
        agent_id=agent_id,
        run_id=run_id,
        model_id=model_id,
    )


def check_max_steps(max_steps: object) -> None:
    """A run's `max_steps`: None (the agent's), or a whole number of steps. smolagents fails on
    anything else only inside its step loop, so a resume would have run its approved calls
    first: `TypeError` or `ValueError` here, before anything is decided or the model is asked.
    0 is the agent's own, as in smolagents."""
    if max_steps is None:
        return
    if not isinstance(max_steps, int) or isinstance(max_steps, bool):
        raise TypeError(f"max_steps must be a whole number of steps or None, not {max_steps!r}")
    if max_steps < 0:
        raise ValueError(f"max_steps must not be negative (got {max_steps})")


def outside_a_run() -> MissingIdentity:
    return missing_identity(
        "session_id, origin_message_id or user_id",
        f"a gated smolagents tool ran outside GatedAgent.run(...); call {ONE_LINE}",
    )


def plain_run_refused() -> MissingIdentity:
    """The error for smolagents' own `agent.run(task)` of a wrapped agent (no identity)."""
    return missing_identity(
        "session_id, origin_message_id or user_id",
        "smolagents' agent.run(task) carries none of them and this agent's tools are gated; run "
        f"it through its GatedAgent: {ONE_LINE}",
    )


def refuse_plain_runs(agent: MultiStepAgent, serve: Callable[..., Any]) -> Callable[..., Any]:
    """Make `agent.run` (smolagents' own, without identity; also what `agent(task)` calls when a
    manager calls it) run `serve(task, ...)` instead: as a managed agent of its gated manager's
    run in progress, or `MissingIdentity` before the model is asked anything (`_managed`).
    Return the original `run`, which `GatedAgent.run` drives."""
    plain: Callable[..., Any] = getattr(agent.run, "_effectgate_plain", agent.run)

    def run(self_: MultiStepAgent, task: str, *args: Any, **kwargs: Any) -> Any:
        return serve(task, *args, **kwargs)

    run._effectgate_plain = plain  # type: ignore[attr-defined]
    agent.run = types.MethodType(run, agent)
    return plain
