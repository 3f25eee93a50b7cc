"""Tamper-evident export of the decision records: a hash chain with a signed manifest.

    manifest = export_chain(store, keyring, "2026-12-04.jsonl")                # first export
    manifest = export_chain(store, keyring, "2026-12-05.jsonl", after=manifest) # only what is new
    report = verify_export("2026-12-05.jsonl", keyring, after=previous)         # names the first break

A decision record is one execution the gate recorded (a read is not one; a write, and a gated call with
who authorised it): its sequence number (the execution's id), time, tool, effect, status, args hash, the
arguments' facts and commitments, idempotency key and provider reference, the caller (session, origin
message, user, agent, run, and the model that proposed it), the table, row and policy fingerprints, and
for a gated call its approval id, version, every approver of the round that minted the grant that ran it
(id, role, round, time: a lapsed round vouches for no run) and that grant (its key id and its token's sha256).

The file is JSON Lines, one `{"seq", "prev", "hash", "record", "personal"}` a line, where `hash`
is sha256 of `prev` and the record's RFC 8785 canonical JSON, and `prev` is the hash of the line
before (the first line's is the previous export's chain head, or 64 zeros). Personal values (the
arguments' text and the error) sit outside the chain, in `personal`; the record inside it carries
their commitments (`record["personal"]`: the keyring's MAC of each, as `effectgate.redact` makes
them) and the arguments' facts (`record["args"]`: amount and currency). So `redact_export` can
erase from a file already written exactly the values the ledger's redaction erased (its entries
name the execution, column and commitment) and the file still verifies, while `verify`
checks every value still present against its commitment. Beside it, `<file>.manifest.json`
names the format, the key id, the first and last sequence, the count, the chain's start and head,
and is signed with the gate's keyring (HMAC, domain-separated from grant tokens). `verify_export`
recomputes every link and checks the manifest's signature: a flipped byte, a removed, added or
reordered record, a file cut short or a forged manifest are each named at the first record where
the chain breaks. A line must be the exact bytes the exporter wrote (a repeated key, an extra
field or another serialisation of the same JSON is a changed line: what a reader sees is what was
hashed), and the file is streamed with a bound on a line's length (`MAX_LINE`).

What is exported is re-derived first: the export checkpoints the ledger's own hash chain
(`effectgate.chain.seal_chain`), then runs `audit` over the whole ledger with the keyring (seals,
hashes, roles, approver counts, and the chain: a row deleted or edited in the database since an
earlier checkpoint) and refuses while it has findings, so a signature never vouches for an edited
row. The manifest pins the ledger's chain heads (`_pins`). An incremental export starts after
the previous manifest's last sequence (its signature verified first), continues its chain, and
refuses while the ledger's chain is cut back below that manifest's pins. Records after the last
execution older than `settle` seconds are left for the next export (a row whose transaction
commits late is not skipped); a future-dated one before it goes out with it, never blocking.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import _holds, _pins, _seal
from ._audit_sealed import backing, entries
from ._commitments import commitment, commitment_holds, commitment_part
from ._export_file import MAX_LINE, LineError, doubles, fitted, line_text, read_lines, rewrite, strict_loads
from ._manifest import (  # noqa: F401 - the manifest's names, as `effectgate.export` has always had them
    FORMAT,
    GENESIS,
    LINE_FIELDS,
    PURPOSE,
    READABLE,
    ExportError,
    Manifest,
    manifest_path,
    personal_of,
    refuse_overwriting,
)
from .audit import audit
from .canonical import canonical_json
from .chain import seal_chain
from .redact import FACTS, facts_of, is_redacted
from .stores.protocol import Store
from .stores.records import RedactedRow
from .tokens import Keyring

SETTLE_S = 60.0


def link(prev: str, record: Mapping[str, Any]) -> str:
    """The hash of one chain line: sha256 over the previous hash and the record's canonical JSON."""
    return hashlib.sha256(prev.encode() + b"\n" + canonical_json(dict(record))).hexdigest()


def decision_records(
    store: Store, keyring: Keyring, *, after_seq: int = 0, before: float | None = None
) -> Iterator[tuple[dict[str, Any], dict[str, str]]]:
    """The decision records with a sequence number above `after_seq`, in sequence order, up to
    the last execution (of any effect) older than `before`: younger ones after it are left for the
    next export, as the ledger's chain leaves them (`seal_chain`), and a younger or future-dated
    one before it is exported with it, so one row with a wrong clock cannot hold back every later
    record. Each comes with its personal values (column -> text; an erased value is absent)."""
    erased = backing(entries(store), keyring)[0]  # sealed ones (none inserted since hides them)
    # the grant that ran a call: key id, token hash (never the token), the round whose approvers count
    grants = {a.id: (a.token_kid, a.token_hash, a.grants - 1) for a in store.approvals() if a.token_hash}
    approvers: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for d in store.all_decisions():  # sealed: not one inserted after the audit
        ran = grants.get(d.approval_id, (0, 0, None))[2]
        if d.decision == "approve" and d.grant_round == ran and _seal.decision_intact(keyring, d):
            who = {"id": d.approver_id, "role": d.role, "round": d.grant_round, "at": d.at}
            approvers[(d.approval_id, d.version)].append(who)
    refs = {r.key: r.provider_ref for r in store.idempotency_records()}
    executions = store.executions()
    settled = [ex.id for ex in executions if ex.id is not None and (before is None or ex.at < before)]
    upto = max(settled, default=0)  # in id order: what comes after the last settled row waits
    for ex in executions:
        assert ex.id is not None
        if ex.id > upto:
            return
        if ex.id <= after_seq or ex.effect == "read":
            continue
        gated = ex.approval_id is not None and ex.version is not None
        grant = grants.get(ex.approval_id or "", (None, None, None))
        personal, committed = dict[str, str](), dict[str, str]()  # column -> text, and -> its commitment
        for column, text in (("args_json", ex.args_json), ("error", ex.error)):
            if text is None:
                continue
            if is_redacted(text):  # its entry: read again if erased since (another process)
                if (k := ("eg_executions", str(ex.id), column)) not in erased:
                    erased = backing(entries(store), keyring)[0]
                committed[column] = erased[k].commitment if k in erased else ""
            else:
                personal[column] = text
                committed[column] = commitment(keyring, text)
        yield (
            {
                "seq": ex.id,
                "at": ex.at,
                "tool": ex.tool,
                "effect": ex.effect,
                "status": ex.status,
                "args_hash": ex.args_hash,
                "args": doubles(facts_of(ex.args_json, FACTS)),
                "personal": committed,
                "redacted": is_redacted(ex.args_json),
                "idempotency_key": ex.idempotency_key,
                "provider_ref": refs.get(ex.idempotency_key),
                "session_id": ex.session_id,
                "origin_message_id": ex.origin_message_id,
                "user_id": ex.user_id,
                "agent_id": ex.agent_id,
                "run_id": ex.run_id,
                "model_id": ex.model_id,
                "table_fingerprint": ex.table_fingerprint,
                "row_fingerprint": ex.row_fingerprint,
                "policy_fingerprint": ex.policy_fingerprint,
                "approval_id": ex.approval_id,
                "version": ex.version,
                "approvers": approvers.get((ex.approval_id, ex.version), []) if gated else [],  # type: ignore[arg-type]
                "token_kid": grant[0],
                "token_hash": grant[1],
            },
            personal,
        )


def export_chain(
    store: Store,
    keyring: Keyring,
    path: str | Path,
    *,
    after: Manifest | None = None,
    settle: float = SETTLE_S,
    now: float | None = None,
    max_line: int = MAX_LINE,
) -> Manifest:
    """Write the decision records after `after` (all when None), up to the checkpoint the audit verified,
    to `path` as a hash chain, and its signed manifest (`manifest_path(path)`) pinning the chain's heads.
    Refused, writing nothing, when `after` is not signed by this keyring, its pins no longer hold, or
    `path` is `after`'s export or manifest (checked before the seal); refused with no export written
    when the audit after the seal has findings (its new checkpoints stay). A line is at most
    `max_line` bytes, as `verify_export` reads it back (`_export_file.fitted`)."""
    target = Path(path)
    if target.is_dir():  # its rename would fail after the manifest beside it was replaced
        raise ExportError(f"{target} is a directory: give a file name; nothing was exported or written")
    if after is not None:
        after.check(keyring)
        refuse_overwriting(target, after)
        if cut := sorted({b.table for b in _pins.breaks(store, after.heads)}):  # before any write
            raise ExportError(
                f"the ledger's chain no longer holds what the previous export pinned ({', '.join(cut)}): "
                "run `effectgate audit --pinned` with its manifest; nothing was exported or written"
            )
    at = time.time() if now is None else now
    seal_chain(store, keyring, now=at, settle=settle)  # the ledger's own chain covers what is exported
    heads = _pins.heads(store)  # the cut: a row committed after it (after the audit) waits
    report = audit(store, keyring=keyring, chain=True, pinned=after.heads if after is not None else None)
    if not report.clean:
        kinds = sorted({f.kind for f in report.findings})
        raise ExportError(
            f"the ledger has {len(report.findings)} audit finding(s) ({', '.join(kinds)}): run "
            "`effectgate audit` and resolve them; nothing was exported"
        )
    start, after_seq = (after.head, after.after_seq) if after is not None else (GENESIS, 0)
    head, first, last, count = start, None, None, 0
    with rewrite(target, ExportError) as out:  # renamed over `target` once its manifest is signed
        for record, personal in decision_records(store, keyring, after_seq=after_seq, before=at - settle):
            if record["seq"] > heads.get("eg_executions", {}).get("last_id", 0):
                break  # committed after the checkpoint the audit verified: the next export's
            digest = link(head, record)
            line = {"seq": record["seq"], "prev": head, "hash": digest, "record": record}
            line["personal"] = personal
            out.write(fitted(line, max_line, ExportError) + "\n")
            head, last, count = digest, record["seq"], count + 1
            first = record["seq"] if first is None else first
        manifest = Manifest(
            format=FORMAT,
            key_id=keyring.current,
            first_seq=first,
            last_seq=last,
            count=count,
            start=start,
            head=head,
            after_seq=after_seq if last is None else last,
            created_at=at,
            heads=heads,
        )
        signed = Manifest(**{**asdict(manifest), "signature": keyring.sign(PURPOSE, manifest.body())})
        # written whole (beside it, then renamed: a symlink there is replaced) before the file is
        # renamed into place: a manifest that cannot be written leaves the previous file as it was
        out.flush()  # and the file is written whole first (a full disk fails here, changing nothing)
        with rewrite(manifest_path(target), ExportError) as signed_out:
            signed_out.write(signed.dumps())
    return signed


def _personal_holds(keyring: Keyring, record: Mapping[str, Any], personal: Any) -> bool:
    """The line's personal values (outside the chain) match the commitments the record (inside
    it) carries; an erased value is simply absent."""
    if personal is None:
        return True
    if not isinstance(personal, dict) or not isinstance(committed := record.get("personal"), dict):
        return False
    macs = {c: m for c, m in committed.items() if isinstance(m, str) and m.isascii()}  # compare_digest: ASCII
    return all(
        isinstance(text, str) and column in macs and commitment_holds(keyring, text, macs[column])
        for column, text in personal.items()
    )


def _same_value(a: Any, b: Any) -> bool:
    """Two commitments commit to the same value: a key both name (each names its keyring's) agrees."""
    parts = (p.partition(".") for p in a.split(",")) if isinstance(a, str) and isinstance(b, str) else ()
    return any(mac and commitment_part(b, kid) == mac for kid, _, mac in parts)


def redact_export(
    path: str | Path,
    *,
    store: Store,
    user_id: str,
    erased: Mapping[tuple[str, str, str], RedactedRow] | None = None,
    max_line: int = MAX_LINE,
) -> int:
    """Erase `user_id`'s personal values from an export file (after `redact` erased them from the
    ledger): their lines keep their records, so the chain and the manifest still verify. With
    `erased`, the ledger's redaction entries (`effectgate.redact.entries`), exactly the values the
    ledger erased go: a value is removed when an entry names its execution (the line's sequence)
    and column and commits to the same value, so a redaction of one subject erases that subject's
    records and no other. Without it, every personal value of the user's lines goes (what `redact`
    of the whole user erases). Returns how many lines changed. The file is read a line at a time
    (ExportError, nothing changed, for a line not a chain line, longer than `max_line` bytes, or the
    user's in the first format; a file with another link; RedactionError for a user under a legal
    hold in `store`, checked before and after the rewrite) and replaced whole."""
    if not isinstance(user_id, str) or not user_id:
        raise ExportError("user_id must be a non-empty string")
    _holds.refuse_held(store, None, user_id, "the export file was not changed")
    target, changed = Path(path), 0
    try:  # written beside it by this rewrite alone (another one under way is refused), then renamed
        with rewrite(target, ExportError, erasing=True) as out:
            for number, text in read_lines(target, max_line=max_line):
                try:
                    line = strict_loads(text)
                    record, personal = line["record"], personal_of(target, number, line, user_id)
                    mine = record.get("user_id") == user_id and personal
                except (ValueError, RecursionError, KeyError, TypeError, AttributeError) as exc:
                    raise LineError(number, "not a chain line (run `effectgate verify`)") from exc
                if mine:
                    if erased is None:
                        kept: dict[str, Any] = {}
                    else:
                        committed = record.get("personal") or {}
                        kept = {
                            column: value
                            for column, value in personal.items()
                            if (entry := erased.get(("eg_executions", str(record.get("seq")), column)))
                            is None
                            or not _same_value(entry.commitment, committed.get(column))
                        }
                    if kept != personal:
                        line["personal"] = kept
                        changed += 1
                        text = line_text(line)
                out.write(text + "\n")
            _holds.refuse_held(store, None, user_id, "the export file was not changed")  # held since
    except LineError as exc:
        raise ExportError(f"{target} was not changed: {exc}") from exc
    return changed


@dataclass(frozen=True)
class Verified:
    """The result of `verify_export`: `ok`, or the first break (1-based line, its sequence, why)."""

    ok: bool
    count: int
    line: int | None = None
    seq: int | None = None
    problem: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def verify_export(
    path: str | Path, keyring: Keyring, *, after: Manifest | None = None, max_line: int = MAX_LINE
) -> Verified:
    """Check an export file against its signed manifest (and, with `after`, that it continues that
    earlier export's chain). Each line must be exactly the bytes the exporter wrote: strict JSON
    (no key named twice), the format's fields and no others, serialised as `export_chain` does,
    so what one reader sees is what was hashed. The file is read a line at a time; a line longer
    than `max_line` bytes is a break. Never raises for a broken file: the answer names the first
    break."""
    try:
        manifest = Manifest.load(manifest_path(path))
        manifest.check(keyring)
        if after is not None:
            after.check(keyring)
    except ExportError as exc:
        return Verified(False, 0, problem=str(exc))
    if after is not None and manifest.start != after.head:
        return Verified(False, 0, problem="the file does not continue the given earlier export's chain")
    fields = LINE_FIELDS[manifest.format]
    head, count, last_seq, number = manifest.start, 0, None, 0
    try:
        for number, text in read_lines(path, max_line=max_line):
            broken = _check_line(keyring, text, fields, head, last_seq)
            if isinstance(broken, tuple):
                return Verified(False, count, number, *broken)
            head, count, last_seq = broken["hash"], count + 1, broken["seq"]
    except LineError as exc:
        return Verified(False, count, exc.line, None, exc.problem)
    except OSError as exc:
        return Verified(False, count, problem=f"cannot read {path}: {exc}")
    if count != manifest.count or head != manifest.head or last_seq != manifest.last_seq:
        return Verified(
            False,
            count,
            number + 1,
            None,
            f"the file ends after {count} record(s) at another head than its manifest's "
            f"{manifest.count} (records were removed or added at the end)",
        )
    return Verified(True, count)


def _check_line(
    keyring: Keyring, text: str, fields: list[str], head: str, last_seq: int | None
) -> dict[str, Any] | tuple[int | None, str]:
    """The parsed line when it holds, else (its sequence if known, why not)."""
    try:
        line = strict_loads(text)
    except (ValueError, RecursionError):
        return None, "not a chain line (unreadable JSON, or a key named twice)"
    if not isinstance(line, dict) or list(line) != fields:
        return None, f"not a chain line (its fields must be exactly {', '.join(fields)})"
    seq, prev, digest, record = line["seq"], line["prev"], line["hash"], line["record"]
    # `type(...) is int`: true is an int that equals 1 (a line's seq is outside its hash)
    same = isinstance(record, dict) and type(seq) is type(record.get("seq")) is int and record["seq"] == seq
    if not same:
        return None, "the line's sequence number is not its record's"
    if prev != head:
        return seq, "does not follow the record before it (a record was removed, added or reordered)"
    try:
        holds = link(prev, record) == digest
    except (ValueError, TypeError, RecursionError):
        holds = False
    if not holds:
        return seq, "the record does not match its hash (it was changed)"
    if not _personal_holds(keyring, record, line.get("personal")):
        return seq, "a personal value does not match its commitment (it was changed)"
    if last_seq is not None and seq <= last_seq:
        return seq, "sequence numbers go backwards"
    if line_text(line) != text:
        return seq, "the line is not written as the export wrote it (its bytes were changed)"
    return line


__all__ = [
    "FORMAT",
    "GENESIS",
    "ExportError",
    "Manifest",
    "Verified",
    "decision_records",
    "export_chain",
    "link",
    "manifest_path",
    "redact_export",
    "verify_export",
]
