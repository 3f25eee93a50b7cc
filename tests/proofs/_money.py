"""The money tool the proofs run: a refund through a payment provider over HTTP, with httpx.

The tool passes the gate's idempotency key downstream (`set_idempotency_key`) and tells the gate
what it knows about the outcome:

- 200/201: the refund happened; the provider's charge is the result.
- a timeout or a broken connection after the request may have been sent, a 409 "in progress",
  or a 202 "processing" (its id becomes the `provider_ref`): `OutcomeUnknown`, never a failure.
- a connection that was never made (`NotSent`) or a 4xx the provider uses for "refused, nothing
  happened" (`Declined`): definite failures, which the table row lists in `definite_failures`.
- anything else, a 5xx included (the provider may have acted before failing): `ProviderError`,
  which the row does not list, so the gate treats it as an unknown outcome.

`reconcile(key)` asks the provider by key: found, not found, or (when the provider has no
lookup) None, meaning nobody can tell.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from effectgate import (
    Approver,
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Grant,
    Pending,
    Reconciled,
    ToolContext,
    ToolSpec,
    set_idempotency_key,
)
from effectgate.errors import OutcomeUnknown

AGENT = "support-agent"
FINANCE = Approver("fin-1", "finance")
AMOUNT = 1250


class ProviderError(Exception):
    """The provider answered that the refund did not happen."""

    def __init__(self, status: int, detail: str) -> None:
        self.status = status
        super().__init__(f"provider answered {status}: {detail}")


class Declined(ProviderError):
    """The provider refused the refund (400, 402, 422): nothing happened."""


class NotSent(ProviderError):
    """No connection was made, so no request reached the provider."""


class Refunds:
    """The `refund` tool and its `reconcile` hook, bound to one provider.

    `before_call` runs after the claim, before the request is sent; `after_response` runs once
    the provider has answered, before the gate stores anything. The crash proofs die there.
    """

    def __init__(
        self,
        base_url: str,
        *,
        lookups: bool = True,
        timeout: float = 10.0,
        before_call: Callable[[], None] | None = None,
        after_response: Callable[[], None] | None = None,
    ) -> None:
        self.lookups = lookups
        self.client = httpx.Client(base_url=base_url, timeout=timeout)
        self.before_call = before_call
        self.after_response = after_response

    def close(self) -> None:
        self.client.close()

    def refund(self, order_id: str, amount: int, tool_context: ToolContext) -> dict[str, Any]:
        """Refund `amount` (minor units) on an order through the payment provider."""
        request = self.client.build_request("POST", "/refunds", json={"order_id": order_id, "amount": amount})
        set_idempotency_key(request, tool_context)
        if self.before_call is not None:
            self.before_call()
        try:
            response = self.client.send(request)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise NotSent(0, f"never sent: {exc!r}") from exc  # no connection, no request
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            raise OutcomeUnknown(f"no answer after sending the refund: {exc!r}") from exc
        if self.after_response is not None:
            self.after_response()
        status = response.status_code
        if status in (200, 201):
            return dict(response.json())
        if status == 202:
            raise OutcomeUnknown(
                "the provider is still processing the refund", provider_ref=response.json()["id"]
            )
        if status == 409:
            raise OutcomeUnknown(f"the provider reports this key in progress: {response.text}")
        if status in (400, 402, 422):
            raise Declined(status, response.text)
        raise ProviderError(status, response.text)

    def reconcile(self, key: str) -> Reconciled | None:
        """Ask the provider whether it saw `key`; None when it cannot tell."""
        if not self.lookups:
            return None
        response = self.client.get(f"/refunds/{key}")
        if response.status_code == 200:
            charge = dict(response.json())
            return Reconciled(found=True, result=charge, provider_ref=charge.get("id"))
        if response.status_code == 404:
            return Reconciled(found=False)
        return None


def money_table(refunds: Refunds) -> EffectTable:
    """A one-row effect table: `refund` is money, approved by finance, one order at a time."""
    table = EffectTable(
        [
            ToolSpec(
                name="refund",
                effect=Effect.MONEY,
                fn=refunds.refund,
                approver_role="finance",
                subject=("order_id",),
                reconcile=refunds.reconcile,
                definite_failures=(Declined, NotSent),
            )
        ]
    )
    table.allow(AGENT, ["refund"])
    return table


def context(session: str = "s1", message: str = "m1") -> CallContext:
    return CallContext(session_id=session, origin_message_id=message, user_id="u1", agent_id=AGENT)


def refund_args(order_id: str, amount: int = AMOUNT) -> dict[str, Any]:
    return {"order_id": order_id, "amount": amount}


def grant(gate: EffectGate, order_id: str, *, session: str = "s1", message: str | None = None) -> Grant:
    """Propose a refund on `order_id` and approve it as finance; the grant to execute."""
    outcome = gate.call("refund", refund_args(order_id), context(session, message or f"m-{order_id}"))
    assert isinstance(outcome, Pending), outcome
    granted = gate.approve(outcome.approval_id, version=outcome.version, approver=FINANCE)
    assert isinstance(granted, Grant), granted
    return granted


class LaterClock:
    """The wall clock moved `shift` seconds ahead: a recovering process sees leases expired.

    `sleep` moves the clock instead of waiting, as FakeClock does."""

    def __init__(self, shift: float) -> None:
        self.shift = shift

    def now(self) -> float:
        return time.time() + self.shift

    def sleep(self, seconds: float) -> None:
        self.shift += seconds
