"""The tools the core-flow, reconciliation and lease-lost edge tests share: a payment (`Bank`)
and a write (`Tags`) whose reply can be lost and whose provider can be asked (`lookup`), and the
calls that get a grant."""

from __future__ import annotations

from typing import Any

from effectgate import (
    Approver,
    Effect,
    EffectGate,
    EffectTable,
    Grant,
    Pending,
    Reconciled,
    ToolContext,
    ToolSpec,
)
from effectgate.examples.shop import context
from effectgate.stores import SQLStore
from effectgate.testing import EffectRecorder

FINANCE = Approver("fiona", "finance")


class Bank:
    """A payment tool whose reply can be lost (the payment happened or not: unknown)."""

    def __init__(self) -> None:
        self.receiver = EffectRecorder()
        self.applied: dict[str, dict[str, Any]] = {}
        self.lose_reply = 0
        self.lookup_raises = False
        self.runs = 0

    def pay(self, account: str, amount: int, tool_context: ToolContext) -> dict[str, Any]:
        """Pay an account."""
        self.runs += 1
        key = tool_context.idempotency_key
        if key not in self.applied:
            self.applied[key] = {"account": account, "amount": amount, "ref": f"p{len(self.applied) + 1}"}
            self.receiver.record("pay", idempotency_key=key, account=account)
        if self.lose_reply:
            self.lose_reply -= 1
            raise TimeoutError("the reply was lost")
        return self.applied[key]

    def lookup(self, key: str) -> Reconciled | None:
        if self.lookup_raises:
            raise ConnectionError("provider lookup is down")
        if key in self.applied:
            return Reconciled(found=True, result=self.applied[key], provider_ref=self.applied[key]["ref"])
        return Reconciled(found=False)

    def table(self, *, reconcile: bool = True) -> EffectTable:
        table = EffectTable(
            [
                ToolSpec(
                    name="pay",
                    effect=Effect.MONEY,
                    fn=self.pay,
                    approver_role="finance",
                    subject=("account",),
                    reconcile=self.lookup if reconcile else None,
                )
            ]
        )
        table.allow_all("support")
        return table


def pay_grant(gate: EffectGate, account: str = "a1", message: str = "m1") -> Grant:
    out = gate.call("pay", {"account": account, "amount": 500}, context(message))
    assert isinstance(out, Pending), out
    grant = gate.approve(out.approval_id, version=1, approver=FINANCE)
    assert isinstance(grant, Grant)
    return grant


def exec_key(grant: Grant) -> str:
    return f"eg_{grant.approval_id}_v{grant.version}"


def status(store: SQLStore, approval_id: str) -> str:
    row = store.get_approval(approval_id)
    assert row is not None
    return row.status


class Tags:
    """A write whose reply can be lost; the service can say whether a key was applied."""

    def __init__(self) -> None:
        self.receiver = EffectRecorder()
        self.applied: dict[str, list[str]] = {}
        self.lose_reply = 0

    def tag(self, ticket_id: str, tags: list[str], tool_context: ToolContext) -> dict[str, Any]:
        """Tag a ticket."""
        self.applied[tool_context.idempotency_key] = tags
        self.receiver.record("tag", ticket_id=ticket_id)
        if self.lose_reply:
            self.lose_reply -= 1
            raise TimeoutError("the reply was lost")
        return {"ticket_id": ticket_id, "tags": tags}

    def lookup(self, key: str) -> Reconciled | None:
        if key in self.applied:
            return Reconciled(found=True, result={"tags": self.applied[key]})
        return Reconciled(found=False)

    def table(self) -> EffectTable:
        table = EffectTable(
            [
                ToolSpec(
                    name="tag",
                    effect=Effect.WRITE,
                    fn=self.tag,
                    subject=("ticket_id",),
                    reconcile=self.lookup,
                )
            ]
        )
        table.allow_all("support")
        return table
