"""The running example: a support and billing agent for a small shop (see the README).

Customers u1 (Ada) and u2 (Grace); orders 1042 (u1, 120.00 GBP), 1043 (u1, 35.00), 2001 (u2,
500.00); subscriptions sub_u1, sub_u2; tickets t-17 (u1), t-18 (u2). Amounts are integers in
minor units. The shop's payment provider honours `Idempotency-Key` and records every effect it
applies in an `EffectRecorder`, so tests and the demo count effects where they land.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._clock import Clock
from ..context import CallContext, Confirmation, ToolContext
from ..effects import Effect, Policy, Reversibility
from ..errors import OutcomeUnknown
from ..gate import EffectGate
from ..stores.sql import SQLStore
from ..table import EffectTable, Escalate, Reconciled, ToolSpec
from ..testing import EffectRecorder
from ..tokens import Keyring

SUPPORT_AGENT = "support"
SUMMARY_AGENT = "queue_summarizer"

#: finance_lead may approve what finance may.
SHOP_POLICY = Policy(role_grants={"finance_lead": frozenset({"finance"})})


@dataclass
class PaymentProvider:
    """A provider that dedupes on the idempotency key, like a real payment API."""

    receiver: EffectRecorder
    refunds: dict[str, dict[str, Any]] = field(default_factory=dict[str, dict[str, Any]])
    timeouts_to_inject: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def refund(self, *, key: str, order_id: str, amount: int, currency: str) -> dict[str, Any]:
        with self._lock:
            if key in self.refunds:
                return self.refunds[key]
            refund = {
                "refund_id": f"re_{len(self.refunds) + 1}",
                "order_id": order_id,
                "amount": amount,
                "currency": currency,
            }
            self.refunds[key] = refund
            self.receiver.record("refund", idempotency_key=key, order_id=order_id, amount=amount)
            if self.timeouts_to_inject:
                # The refund happened, but the reply is lost: the caller cannot know.
                self.timeouts_to_inject -= 1
                raise OutcomeUnknown("payment provider timed out", provider_ref=str(refund["refund_id"]))
            return refund

    def lookup(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return self.refunds.get(key)


@dataclass
class Shop:
    """The shop's state and its tools. Every effect lands in `receiver`."""

    receiver: EffectRecorder = field(default_factory=EffectRecorder)
    customers: dict[str, str] = field(default_factory=lambda: {"u1": "Ada", "u2": "Grace"})
    orders: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {
            "1042": {"user_id": "u1", "total": 12000, "currency": "GBP", "status": "shipped"},
            "1043": {"user_id": "u1", "total": 3500, "currency": "GBP", "status": "processing"},
            "2001": {"user_id": "u2", "total": 50000, "currency": "GBP", "status": "delivered"},
        }
    )
    subscriptions: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {
            "sub_u1": {"user_id": "u1", "status": "active"},
            "sub_u2": {"user_id": "u2", "status": "active"},
        }
    )
    tickets: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {
            "t-17": {"user_id": "u1", "tags": ["billing"], "subject": "refund for 1042"},
            "t-18": {"user_id": "u2", "tags": [], "subject": "login trouble"},
        }
    )
    deleted: set[str] = field(default_factory=set[str])
    provider: PaymentProvider = field(init=False)

    def __post_init__(self) -> None:
        self.provider = PaymentProvider(self.receiver)

    # -- tools

    def get_order(self, order_id: str) -> dict[str, Any]:
        """Look up an order's status and total."""
        order = self.orders[order_id]
        return {
            "order_id": order_id,
            "status": order["status"],
            "total": order["total"],
            "currency": order["currency"],
        }

    def search_tickets(self, query: str) -> list[dict[str, Any]]:
        """Search support tickets by text."""
        q = query.lower()
        return [
            {"ticket_id": t, "subject": v["subject"]}
            for t, v in self.tickets.items()
            if q in v["subject"].lower()
        ]

    def update_ticket_tags(self, ticket_id: str, tags: list[str]) -> dict[str, Any]:
        """Replace a ticket's tags."""
        self.tickets[ticket_id]["tags"] = sorted(set(tags))
        self.receiver.record("ticket_tags", ticket_id=ticket_id, tags=sorted(set(tags)))
        return {"ticket_id": ticket_id, "tags": self.tickets[ticket_id]["tags"]}

    def refund_order(
        self, order_id: str, amount: int, currency: str, tool_context: ToolContext
    ) -> dict[str, Any]:
        """Refund part or all of an order through the payment provider."""
        return self.provider.refund(
            key=tool_context.idempotency_key, order_id=order_id, amount=amount, currency=currency
        )

    def send_email(self, to: list[str], subject: str, body: str) -> dict[str, Any]:
        """Send an email to one or more recipients."""
        self.receiver.record("email", to=list(to), subject=subject)
        return {"sent": len(to)}

    def cancel_subscription(self, subscription_id: str) -> dict[str, Any]:
        """Cancel a subscription at the end of the period."""
        self.subscriptions[subscription_id]["status"] = "cancelled"
        self.receiver.record("cancel", subscription_id=subscription_id)
        return {"subscription_id": subscription_id, "status": "cancelled"}

    def delete_customer_data(self, customer_id: str) -> dict[str, Any]:
        """Soft-delete a customer's data (30-day grace period)."""
        self.deleted.add(customer_id)
        self.receiver.record("delete", customer_id=customer_id)
        return {"customer_id": customer_id, "deleted": "soft", "grace_days": 30}

    # -- checks

    def owns_order(self, args: Mapping[str, Any], ctx: CallContext) -> bool:
        order = self.orders.get(str(args.get("order_id")))
        return order is not None and order["user_id"] == ctx.user_id

    def owns_ticket(self, args: Mapping[str, Any], ctx: CallContext) -> bool:
        ticket = self.tickets.get(str(args.get("ticket_id")))
        return ticket is not None and ticket["user_id"] == ctx.user_id

    def owns_subscription(self, args: Mapping[str, Any], ctx: CallContext) -> bool:
        sub = self.subscriptions.get(str(args.get("subscription_id")))
        return sub is not None and sub["user_id"] == ctx.user_id

    def is_self(self, args: Mapping[str, Any], ctx: CallContext) -> bool:
        return args.get("customer_id") == ctx.user_id

    def refundable(self, order_id: str, history: Confirmation) -> int:
        """What is left to refund: the total minus refunds approved or executed for the order."""
        taken = sum(int(e.args.get("amount", 0)) for e in history.committed())
        return int(self.orders[order_id]["total"]) - taken

    def refund_within_balance(self, args: Mapping[str, Any], check: Confirmation) -> str | None:
        amount = int(args["amount"])
        if amount <= 0:
            return "the amount must be positive"
        if args["currency"] != self.orders[args["order_id"]]["currency"]:
            return f"the order is in {self.orders[args['order_id']]['currency']}"
        left = self.refundable(args["order_id"], check)
        if amount > left:
            return f"only {left} is left to refund on order {args['order_id']}"
        return None

    def tags_of(self, args: Mapping[str, Any]) -> list[str]:
        return list(self.tickets[args["ticket_id"]]["tags"])

    def reconcile_refund(self, key: str) -> Reconciled | None:
        refund = self.provider.lookup(key)
        if refund is None:
            return Reconciled(found=False)
        return Reconciled(found=True, result=refund, provider_ref=refund["refund_id"])

    # -- the table

    def table(self) -> EffectTable:
        specs = [
            ToolSpec(
                name="get_order",
                effect=Effect.READ,
                fn=self.get_order,
                subject=("order_id",),
                scope=self.owns_order,
                owner="orders",
            ),
            ToolSpec(name="search_tickets", effect=Effect.READ, fn=self.search_tickets, owner="support"),
            ToolSpec(
                name="update_ticket_tags",
                effect=Effect.WRITE,
                fn=self.update_ticket_tags,
                reversibility=Reversibility.REVERSIBLE,
                subject=("ticket_id",),
                scope=self.owns_ticket,
                snapshot=self.tags_of,
                owner="support",
            ),
            ToolSpec(
                name="refund_order",
                effect=Effect.MONEY,
                fn=self.refund_order,
                approver_role="finance",
                reversibility=Reversibility.COMPENSABLE,
                subject=("order_id",),
                scope=self.owns_order,
                confirm=self.refund_within_balance,
                balance=lambda args, check: {"refundable": self.refundable(args["order_id"], check)},
                reconcile=self.reconcile_refund,
                owner="payments",
                escalate=(
                    Escalate.above("amount", 100000, role="finance_lead", note="refund above 1000.00"),
                ),
            ),
            ToolSpec(
                name="send_email",
                effect=Effect.SEND,
                fn=self.send_email,
                approver_role="support_lead",
                reversibility=Reversibility.IRREVERSIBLE,
                subject=("to",),
                owner="messaging",
                escalate=(Escalate.count_above("to", 500, role="marketing_lead", note="bulk send"),),
            ),
            ToolSpec(
                name="cancel_subscription",
                effect=Effect.MONEY,
                fn=self.cancel_subscription,
                approver_role="billing",
                reversibility=Reversibility.COMPENSABLE,
                subject=("subscription_id",),
                scope=self.owns_subscription,
                owner="billing",
            ),
            ToolSpec(
                name="delete_customer_data",
                effect=Effect.DESTRUCTIVE,
                fn=self.delete_customer_data,
                approver_role="privacy",
                reversibility=Reversibility.IRREVERSIBLE,
                subject=("customer_id",),
                scope=self.is_self,
                owner="privacy",
            ),
        ]
        table = EffectTable(specs)
        table.allow_all(SUPPORT_AGENT)
        table.allow(SUMMARY_AGENT, [s.name for s in specs if s.name not in ("send_email", "refund_order")])
        return table


def context(
    message_id: str,
    *,
    user_id: str = "u1",
    session_id: str = "s-ada",
    agent_id: str = SUPPORT_AGENT,
    run_id: str = "run-1",
) -> CallContext:
    """The CallContext the shop's backend builds for a user message."""
    return CallContext(
        session_id=session_id, origin_message_id=message_id, user_id=user_id, agent_id=agent_id, run_id=run_id
    )


def app(
    store: SQLStore,
    *,
    keyring: Keyring | None = None,
    clock: Clock | None = None,
    shop: Shop | None = None,
    **options: Any,
) -> EffectGate:
    """The shop's gate: `effectgate --app effectgate.examples.shop:app ...` uses this. Other
    keyword options (`notify=`, `on_needs_reconciliation=`) go to EffectGate."""
    shop = shop or Shop()
    return EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=keyring, clock=clock, **options)
