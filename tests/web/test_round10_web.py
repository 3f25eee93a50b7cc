"""Round 10 of the review of the reviewer inbox, on SQLite and PostgreSQL."""

from __future__ import annotations

from .conftest import Inbox, login, propose, snapshot


def test_reconciling_a_key_that_no_database_can_hold_is_not_found(inbox: Inbox) -> None:
    """POST /reconciliation/<id> with an id shaped like a write's key but holding a NUL (or a
    lone surrogate): the id reached the store's key lookup, which PostgreSQL refuses (its text
    cannot hold a NUL), so the reconcile answered a raw 502 "Reconciliation failed" naming the
    driver's error instead of "No such approval"."""
    client = inbox.client()
    csrf = login(client, "fiona")
    before = snapshot(inbox)
    for key in ("w_refund_order_%00", "w_refund_order_%ED%B3%BF"):
        r = client.post(f"/reconciliation/{key}", data={"csrf": csrf})
        assert r.status_code == 404, r.text
    assert snapshot(inbox) == before


def multipart(fields: dict[str, bytes]) -> bytes:
    parts = [
        b'--B\r\nContent-Disposition: form-data; name="' + name.encode() + b'"\r\n\r\n' + value + b"\r\n"
        for name, value in fields.items()
    ]
    return b"".join(parts) + b"--B--\r\n"


def test_a_csrf_field_holding_a_lone_surrogate_is_refused_not_a_server_error(inbox: Inbox) -> None:
    """A form posted as multipart with `charset=utf-7` (Starlette decodes each field with the
    charset the request names) can carry a lone surrogate, which UTF-8 cannot encode: the CSRF
    check encoded the submitted token and raised, so sign-in and every decision answered a bare
    500 (with a traceback in the log) instead of the CSRF refusal. It is refused (403), and
    nothing changes."""
    client = inbox.client(raise_server_exceptions=False)
    utf7 = {"content-type": "multipart/form-data; boundary=B; charset=utf-7"}
    surrogate = b"+3P8-"  # UTF-7 for U+DCFF
    client.get("/login")
    r = client.post(
        "/login",
        content=multipart({"csrf": surrogate, "approver": b"fiona", "secret": b"fiona-pw"}),
        headers=utf7,
    )
    assert r.status_code == 403
    assert "Sign out" not in client.get("/login").text  # not signed in
    login(client, "fiona")
    p = propose(inbox)
    before = snapshot(inbox)
    fields = {"csrf": surrogate, "version": b"1", "args_hash": p.card.args_hash.encode()}
    r = client.post(f"/approvals/{p.approval_id}/approve", content=multipart(fields), headers=utf7)
    assert r.status_code == 403
    assert snapshot(inbox) == before
