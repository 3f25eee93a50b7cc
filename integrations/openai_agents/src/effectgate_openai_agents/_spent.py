"""What the model is told of an approved call whose grant another resume of the run presented (a
copy of the same paused snapshot approved and resumed first), when no stored result is there yet:
its run ended with an unknown outcome (`needs_reconciliation`: worded as a replay of the message
is, "Outcome unknown", never as running or refused), or it is still running there."""

from __future__ import annotations

from effectgate import EffectGate
from effectgate.adapter import unknown_outcome_of


def running_elsewhere(tool: str, approval_id: str) -> str:
    """What the model is told of an approved call another resume of the run is running now."""
    return (
        f"{tool} was approved and is being run for this request elsewhere (approval {approval_id}, "
        "by another resume of this run, say); it was not started again here, and its result is "
        "not known yet. Do not call it again."
    )


def outcome_unknown(gate: EffectGate, approval_id: str) -> str | None:
    """The "Outcome unknown" answer when the approval's execution needs reconciliation, else None.
    Blocking (it reads the store)."""
    unknown = unknown_outcome_of(gate, approval_id)
    return unknown.for_model() if unknown is not None else None


def spent_answer(gate: EffectGate, tool: str, approval_id: str) -> str:
    """A spent grant's call without a stored result: its outcome is unknown, or it runs elsewhere.
    Blocking (it reads the store)."""
    return outcome_unknown(gate, approval_id) or running_elsewhere(tool, approval_id)


__all__ = ["outcome_unknown", "running_elsewhere", "spent_answer"]
