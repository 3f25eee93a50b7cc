"""Each redaction target joined to its call (`Call`: its approval and idempotency records, read
from the whole ledger), and the targets of one subject among a user's (`of_subject`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .._json import same_json
from ..table import _as_set
from . import _queries as Q
from ._dialect import is_redacted
from ._personal_rows import _batches, _select_in
from ._proposing import with_proposals
from ._redaction import _APPROVAL_EXTRA, Call, Target


def _origin(t: Any) -> tuple[Any, ...]:
    """What ties a write's events to its execution (neither names an approval): the same tool,
    arguments, session and message (the write's idempotency key is made of them)."""
    return (t.tool, t.args_hash, t.session_id, t.origin_message_id)


def _with_calls(conn: Connection, rows: list[Target]) -> list[Target]:
    """Each row with its `Call`, read from the whole ledger (a call's approval or records may be
    outside the selection: younger than a retention rule's age, or of another effect)."""
    e, i = Q.T_EXECUTIONS, Q.T_IDEMPOTENCY
    ids = {t.key for t in rows if t.table == "eg_approvals"} | {t.approval_id for t in rows if t.approval_id}
    named = {t.key: _named(t) for t in rows if t.table == "eg_events" and not t.approval_id}
    ids |= {aid for listed in named.values() for aid in listed}
    # a read has no execution row: only the other events that name no approval are a write's
    writes = {
        t.args_hash
        for t in rows
        if t.table == "eg_events" and not t.approval_id and t.args_hash and t.effect != "read"
    }
    keys_of: dict[str, set[str]] = {}  # approval id -> its idempotency keys
    write_key: dict[tuple[Any, ...], str] = {}
    approval_of: dict[str, str] = {}
    q = sa.select(
        e.c.approval_id, e.c.idempotency_key, e.c.tool, e.c.args_hash, e.c.session_id, e.c.origin_message_id
    )
    found = [r for batch in _batches(ids) for r in conn.execute(q.where(e.c.approval_id.in_(batch)))]
    found += [r for batch in _batches(writes) for r in conn.execute(q.where(e.c.args_hash.in_(batch)))]
    for r in found:
        if r.approval_id:
            keys_of.setdefault(r.approval_id, set()).add(r.idempotency_key)
            approval_of[r.idempotency_key] = r.approval_id
        else:
            write_key[_origin(r)] = r.idempotency_key
    a = Q.T_APPROVALS
    approvals = {t.key: t for t in _select_in(conn, "eg_approvals", a.c.id, ids, _APPROVAL_EXTRA)}
    approvals = with_proposals(conn, approvals)
    keys = {k for found in keys_of.values() for k in found} | set(write_key.values())
    keys |= {t.idempotency_key for t in rows if t.idempotency_key} | {
        t.key for t in rows if t.table == "eg_idempotency"
    }
    status = {  # a record erased with its call (a late run reopened it) never runs nor is settled
        r.key: "erased" if is_redacted(r.error) else r.status
        for batch in _batches(keys)
        for r in conn.execute(sa.select(i.c.key, i.c.status, i.c.error).where(i.c.key.in_(batch)))
    }
    out = []
    for t in rows:
        key = t.key if t.table == "eg_idempotency" else t.idempotency_key
        if t.table == "eg_events" and not t.approval_id:
            key = write_key.get(_origin(t))
        aid = t.key if t.table == "eg_approvals" else t.approval_id or approval_of.get(key or "")
        if aid is None and key is None:
            listed = named.get(t.key, ()) if t.table == "eg_events" else ()
            listing = tuple(approvals[n] for n in listed if n in approvals)
            out.append(
                replace(t, call=Call(id=listed[0], approval=None, records=(), named=listing)) if listed else t
            )
            continue
        own = keys_of.get(aid, set()) if aid else set()
        records = tuple(status[k] for k in sorted(own | ({key} if key else set())) if k in status)
        call = Call(id=aid or key or t.key, approval=approvals.get(aid) if aid else None, records=records)
        out.append(replace(t, call=call))
    return out


def _named(t: Target) -> tuple[str, ...]:
    """The approval ids an event's detail lists in `approval_ids` (see `Call.named`)."""
    text = t.values.get("detail_json") or ""
    if '"approval_ids"' not in text:  # most events name none: no parse
        return ()
    listed = (_json_object(text) or {}).get("approval_ids")
    return tuple(sorted({a for a in listed if isinstance(a, str)})) if isinstance(listed, list) else ()


def of_subject(rows: Sequence[Target], keys: Sequence[str], subject: Mapping[str, Any]) -> list[Target]:
    """The rows of one subject among a user's: the calls of the approvals whose subject key is
    one of `keys`, and the ungated calls (writes) whose arguments hold every field of `subject`
    with that value, a list as the set it names (a write records no subject key, only its
    arguments). A read records no arguments, only their hash: it is not found by subject (a
    redaction of the user finds it)."""
    calls = {t.key for t in rows if t.table == "eg_approvals" and t.subject_key in keys}
    for t in rows:
        if t.table == "eg_executions" and not t.approval_id and t.call is not None:
            args = _json_object(t.values.get("args_json"))
            if args is not None and all(
                k in args and same_json(_as_set(args[k]), _as_set(v)) for k, v in subject.items()
            ):
                calls.add(t.call.id)
    # a note naming several calls (`Call.named`) is the subject's when any is, whichever sorts first
    return [t for t in rows if t.call is not None and {t.call.id, *(a.key for a in t.call.named)} & calls]


def _json_object(text: str | None) -> dict[str, Any] | None:
    try:
        value = json.loads(text or "")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
