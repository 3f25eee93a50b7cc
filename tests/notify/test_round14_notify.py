"""Round 14 of the review of the webhook notifier, on SQLite and PostgreSQL."""

from __future__ import annotations

import httpx
import pytest

from effectgate.notify import Notification

from .conftest import MakeNotifier


def test_roles_given_as_one_string_are_refused_not_read_as_letters(make_notifier: MakeNotifier) -> None:
    """`roles="finance"` (a str is a Collection[str] to a type checker) was read as the set of its
    letters: no notice for the role "finance" ever matched, so the webhook silently paged no one
    and recorded nothing. A bare string is refused at construction, naming the fix; a collection
    of role names works as before."""
    with pytest.raises(TypeError, match=r"roles=\{'finance'\}"):
        make_notifier(roles="finance")
    assert make_notifier(roles=["finance"]).roles == frozenset({"finance"})


def test_the_timeout_given_holds_for_a_client_given_too(make_notifier: MakeNotifier) -> None:
    """`WebhookNotifier(url, client=..., timeout=2)` (a client of one's own, for a proxy, say):
    the timeout was used only to build the notifier's own client, so with a client given it was
    silently ignored and each request waited as long as that client's default (or for ever, with
    `timeout=None` on it). The timeout given is every request's; without one, the client's own."""
    seen: list[dict[str, float | None]] = []

    def receiver(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"])
        return httpx.Response(200)

    notice = Notification(kind="pending", tool="refund_order", approver_role="finance", at=0.0)
    for timeout in (2.0, None):
        client = httpx.Client(transport=httpx.MockTransport(receiver), timeout=None)
        with client:
            options = {} if timeout is None else {"timeout": timeout}
            assert make_notifier(client=client, **options).deliver(notice).delivered
    assert seen == [dict.fromkeys(("connect", "read", "write", "pool"), t) for t in (2.0, None)]
