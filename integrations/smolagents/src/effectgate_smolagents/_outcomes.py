"""What a gated run returns: `Finished`, or `AwaitingApproval`, the signed record of the gated
calls it stopped at.

`AwaitingApproval` records, for each paused call, the approval id, version and args hash, with the
identity of the run, signed with the gate's keyring (`to_dict` / `from_dict` verify it). A resume
binds its decisions to this record (`_decisions`), so it can neither switch user or session nor
swap the calls it decides.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from smolagents.agents import RunResult

from effectgate import EffectGate, Outcome, Pending
from effectgate.adapter import Paused, TamperedState, sign_state, verify_state

AWAITING = "smolagents.awaiting"  # the purpose an `AwaitingApproval` is signed for


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
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # a version of 1e999: inf
            raise TamperedState(f"not an AwaitingApproval record: {exc!r}") from exc
        verify_state(gate, AWAITING, made.signed_fields(), data.get("signature"))
        pending = []
        for p in paused:
            card = gate.card(p.approval_id)
            pending.append(
                Pending(approval_id=p.approval_id, version=p.version, card=card, status=card.status)
            )
        return dataclasses.replace(made, pending=tuple(pending), signature=str(data["signature"]))


RunOutcome = Finished | AwaitingApproval


def signed(awaiting: AwaitingApproval, gate: EffectGate) -> AwaitingApproval:
    """`awaiting` with its signature: the gate keyring's MAC over its `signed_fields`."""
    return dataclasses.replace(awaiting, signature=sign_state(gate, AWAITING, awaiting.signed_fields()))
