"""Round 10 of the review of the webhook notifier, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
import respx

from effectgate.outcomes import TAMPERED_WARNING
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock

from .conftest import Rig
from .test_record_text import UNVERIFIED, expiring_body


@pytest.mark.parametrize("subject", ['["1042"]', '"1042"', "7", "null"])
def test_an_edited_record_whose_subject_is_not_an_object_is_still_announced(
    rig: Rig, router: respx.MockRouter, store: SQLStore, clock: FakeClock, subject: str
) -> None:
    """An approval row edited in the database (its sealed role, and its subject written as a list,
    a string or a number) came up for its expiry warning. The message read the subject as an
    object (`.items()`): rendering raised, the notice was recorded as a failed delivery and never
    posted, so an edit silenced the page meant to say the record does not verify. It is posted,
    with the fixed headline and the edited subject as plain text."""
    card, body = expiring_body(rig, router, store, clock, approver_role="nobody", subject_json=subject)
    assert card.warnings[0] == TAMPERED_WARNING
    assert UNVERIFIED in body["blocks"][0]["text"]["text"]
    assert body["metadata"]["event_payload"]["intact"] is False
    events = [e.kind for e in store.events() if e.kind.startswith("webhook_")]
    assert events == ["webhook_delivered", "webhook_delivered"]
