"""`effectgate redact`, `effectgate retain` and `effectgate hold`: erasure, retention and legal
holds (see `effectgate.redact` for what each keeps and refuses); `effectgate seal-rules`: seal
the rule rows an earlier release recorded without a seal (`effectgate.audit.seal_rules`). Each
prints what it did, or with `--json` one JSON object; a refusal exits 4 having changed nothing."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from .._audit_sealed import sealed_entries
from .._export_file import linked, strict_loads
from .._holds import UnknownFact
from ..audit import seal_rules
from ..chain import check_keyring
from ..context import _storable
from ..effects import Policy
from ..export import ExportError, redact_export, verify_export
from ..redact import (
    FACTS,
    Redaction,
    RedactionError,
    SubjectNotFound,
    hold,
    holds,
    redact,
    release,
    retain,
    subject_keys,
)
from ._args import check_export_file, retention_rule
from ._render import EXIT_FINDINGS, EXIT_OK, _one_line, _text, _write_json
from ._store import NotFound, UsageError, _make_gate, _open, keyring_for


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "redact", parents=[common], help="erase a user's personal data, keeping the financial facts"
    )
    p.add_argument("--user", required=True, help="the user whose records are erased (their user_id)")
    p.add_argument("--subject", help='only approvals of this subject, as JSON, e.g. \'{"order_id": "1042"}\'')
    p.add_argument("--by", required=True, help="who runs the erasure (recorded with it)")
    p.add_argument("--reason", required=True, help="why (e.g. the request's reference; recorded)")
    p.add_argument(
        "--keep",
        default=",".join(FACTS),
        help="arguments kept as facts, comma-separated (default: %(default)s)",
    )
    p.add_argument(
        "--export", action="append", default=[], metavar="FILE", help="also erase them from this export file"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p = sub.add_parser("retain", parents=[common], help="apply retention rules: erase personal data by age")
    p.add_argument(
        "--rule",
        type=retention_rule,
        action="append",
        required=True,
        metavar="KIND=DAYS",
        help="e.g. read=30 (repeat per kind: an effect class, or unclassified)",
    )
    p.add_argument("--by", required=True, help="who runs it (recorded)")
    p.add_argument("--keep", default=",".join(FACTS), help="arguments kept as facts (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p = sub.add_parser("hold", parents=[common], help="place, release or list legal holds")
    p.add_argument("--user", help="place a hold on this user's records")
    p.add_argument("--release", metavar="HOLD_ID", help="release this hold")
    p.add_argument("--by", help="who places or releases it (recorded)")
    p.add_argument("--reason", help="why (placing or releasing a hold; recorded)")
    p.add_argument("--json", action="store_true", help="print the holds as JSON")
    p = sub.add_parser(
        "seal-rules",
        parents=[common],
        help="seal the rule rows an earlier release recorded unsealed (after checking the ledger)",
    )
    p.add_argument("--by", required=True, help="who vouches for the rule rows as they stand (recorded)")
    p.add_argument("--json", action="store_true", help="print the sealed fingerprints as JSON")


def _keep(text: str) -> tuple[str, ...]:
    """The `--keep` names; none at all (`--keep "$FACTS"`, the variable unset) is bad input: it
    would erase the financial facts with the rest, which no later pass brings back."""
    names = tuple(k.strip() for k in text.split(",") if k.strip())
    if not names:
        raise UsageError(f"--keep {text!r} names no argument: give the facts to keep; nothing was erased")
    return names


def _cmd_redact(args: argparse.Namespace, out: Console) -> int:
    for name in ("user", "by", "reason"):  # empty: bad input (2), as for `hold`
        _given(args, name, "")
    subject = None
    if args.subject is not None:
        try:
            subject = strict_loads(args.subject)  # no NaN, and no field named twice (which value?)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested past the parser's depth
            raise UsageError(f"--subject must be a JSON object: {exc}") from exc
        if not isinstance(subject, dict) or not subject:  # {} would match every write of the user
            raise UsageError(
                '--subject must be a JSON object naming at least one field, e.g. \'{"order_id": "1042"}\' '
                "(leave --subject out to erase all of the user's records)"
            )
    for path in args.export:  # every export file checked before anything is erased
        check_export_file(args.db, path)
        if linked(Path(path)):  # renamed over: the other link would keep the erased values
            raise UsageError(f"--export {path} has another hard link (it keeps the values); nothing erased")
    with _open(args.db) as store:  # a mistyped path is "no database at" (3), not "no keyring"
        keyring = keyring_for(args.db, create=False)
        try:
            done = redact(
                store,
                keyring,
                user_id=args.user,
                subject=subject,
                by=args.by,
                reason=args.reason,
                keep=_keep(args.keep),
                policy=_policy(args, store),
            )
        except SubjectNotFound as exc:  # exit 3, not a refusal: nothing to erase was found
            rid = _erased_before(store, keyring, args.user, subject) if args.export else None
            if rid is None:  # else its files were left to finish (a failed rewrite): done below
                raise NotFound(str(exc)) from exc
            done = Redaction(rid, 0, 0, _keep(args.keep))
        except UnknownFact as exc:  # a mistyped --keep: bad input (2), as the others
            raise UsageError(str(exc)) from exc
        found = done.rows > 0 or _has_records(store, args.user)  # none at all: a typo, likely
        # the files lose exactly what the ledger erased (with --subject: that subject's records),
        # by its sealed entries alone: one inserted in the database (its commitment copied from the
        # file's record) would erase a value the ledger still holds, or hide a sealed one
        erased = sealed_entries(store, keyring) if args.export else {}
        files: dict[str, int] = {}
        for path in dict.fromkeys(args.export):  # each once; a hold placed since keeps the files' copies
            if any(h.user_id == args.user for h in holds(store)):
                raise RedactionError(
                    f"redaction {done.id} erased the ledger's values, but user {args.user!r} has been "
                    f"placed under a legal hold since: {path} was not changed (export files erased "
                    f"before it: {', '.join(files) or 'none'})"
                )
            files[path] = _redact_file(store, path, args.user, erased, done.id)
    # checked, not assumed: a file broken before the erasure is still broken after it
    broken = {path: v.problem or "broken" for path in files if not (v := verify_export(path, keyring)).ok}
    code = EXIT_FINDINGS if broken else EXIT_OK  # as `verify` exits for a broken export
    if not found:  # nothing to erase is no error, but must not read as an erasure done
        _no_records(args.user, "nothing was erased")
    if args.json:
        _write_json({**done.to_dict(), "found": found, "exports": files, "broken": broken})
        return code
    out.print(
        _text(
            f"redaction {done.id}: erased {done.values} value(s) in {done.rows} record(s) of user "
            f"{args.user}; kept {', '.join(done.keep) or 'no arguments'}"
        )
    )
    for path, lines in files.items():
        state = f"it does NOT verify: {broken[path]}" if path in broken else "the file still verifies"
        out.print(_text(f"{path}: erased the values of {lines} record(s); {state}"))
    return code


def _erased_before(store: Any, keyring: Any, user: str, subject: Any) -> str | None:
    """The id of the last redaction of `user`'s `subject` (its event names both, and its sealed
    entries are in the ledger), or None: a write it erased no longer shows the subject in its
    arguments, so the same command run again to finish its export files finds none."""
    ran = {e.redaction_id for e in sealed_entries(store, keyring).values()}
    named = {"user_id": user, "subject_key": subject_keys(subject)[0]}
    for event in reversed(store.events(kind="redacted")):
        try:
            detail = strict_loads(event.detail_json)
        except (ValueError, RecursionError):
            continue
        rid = detail.get("redaction_id") if isinstance(detail, dict) else None
        if isinstance(rid, str) and rid in ran and named.items() <= detail.items():
            return rid
    return None


def _policy(args: argparse.Namespace, store: Any) -> Policy | None:
    """The policy of the `--app` gate (its `pending_ttl` says when a pending call whose proposal
    event recorded none lapsed), or None without one: erasure then keeps a call while its column,
    or its proposal event plus the `pending_ttl` that event recorded, says it is open
    (`_deadline.for_erasure`)."""
    if not getattr(args, "app", None):
        return None
    gate = _make_gate(args, store, need_app=True)
    try:
        return gate.policy
    finally:
        gate.close()


def _has_records(store: Any, user: str) -> bool:
    """Whether the ledger holds any record of `user` (erased already or not)."""
    with store.transaction() as conn:
        return bool(store.redaction_targets(conn, user_id=user))


def _no_records(user: str, done: str) -> None:
    """Say on stderr that `user` has no record: likely a mistyped id, which must not read as done."""
    note = _one_line(f"no records were found for user {user!r}: {done} (check the id)")
    print(f"effectgate: note: {note}", file=sys.stderr)


def _redact_file(store: Any, path: str, user: str, erased: dict[Any, Any], rid: str) -> int:
    try:
        return redact_export(path, store=store, user_id=user, erased=erased)
    except (ExportError, OSError) as exc:  # the ledger's erasure is done: say so, and how to finish
        raise ExportError(
            f"redaction {rid} erased the ledger's values, but not yet the export file's: {exc}; "
            "run the same `effectgate redact` again to erase them from the file"
        ) from exc


def _cmd_retain(args: argparse.Namespace, out: Console) -> int:
    _given(args, "by", "")  # empty: bad input (2), as for `hold`
    rules: dict[str, float] = {}  # (kind, days) pairs, each checked by `_args.retention_rule`
    for kind, days in args.rule:
        if kind in rules:  # which one was meant? (the last would silently win)
            raise UsageError(f"--rule {kind}= is given twice: give each kind once; nothing was erased")
        rules[kind] = days
    with _open(args.db) as store:
        keyring = keyring_for(args.db, create=False)
        try:
            policy = _policy(args, store)
            done = retain(store, keyring, rules, by=args.by, keep=_keep(args.keep), policy=policy)
        except UnknownFact as exc:  # a mistyped --keep: bad input (2), as the others
            raise UsageError(str(exc)) from exc
    if args.json:
        _write_json(done.to_dict())
        return EXIT_OK
    held = f"; left held users alone: {', '.join(done.held)}" if done.held else ""
    out.print(_text(f"retention {done.id}: erased {done.values} value(s) in {done.rows} record(s){held}"))
    return EXIT_OK


def _given(args: argparse.Namespace, name: str, why: str) -> str:
    value: str | None = getattr(args, name)
    if value is None or not value.strip():
        raise UsageError(f"--{name} is required {why}" if value is None else f"--{name} must not be empty")
    return value


def _cmd_hold(args: argparse.Namespace, out: Console) -> int:
    if args.user is not None and args.release is not None:
        raise UsageError("give --user (place a hold) or --release HOLD_ID, not both")
    if args.user is None and args.release is None and (args.by is not None or args.reason is not None):
        # a hold meant, its --user forgotten: listing would exit 0
        raise UsageError("--by and --reason place a hold: give --user too (nothing was placed)")
    if args.user is not None:
        user = _given(args, "user", "")
        # "u1 " is not u1: its hold would hold nothing (NUL, a lone surrogate: the library's refusal, 4)
        if _storable(user) and (user != user.strip() or not user.isprintable()):
            raise UsageError(
                f"--user {user!r}: a user id with leading or trailing whitespace, or a control or invisible "
                "character, is not the id the calls recorded: give it exactly; nothing was placed"
            )
        by, reason = _given(args, "by", "to place a hold"), _given(args, "reason", "to place a hold")
        with _open(args.db) as store:
            placed = hold(store, user_id=user, by=by, reason=reason)
            found = _has_records(store, user)  # a hold may come first: placed, but said
        if not found:
            _no_records(user, "the hold is placed, and holds no record yet")
        if args.json:
            _write_json({"placed": placed.model_dump(), "found": found})
        else:
            out.print(_text(f"hold {placed.id} placed on user {placed.user_id}"))
        return EXIT_OK
    if args.release is not None:
        hold_id, by = _given(args, "release", ""), _given(args, "by", "to release a hold")
        reason = _given(args, "reason", "to release a hold")
        with _open(args.db) as store:
            release(store, hold_id, by=by, reason=reason)
        if args.json:
            _write_json({"released": hold_id, "by": by, "reason": reason})
        else:
            out.print(_text(f"hold {hold_id} released"))
        return EXIT_OK
    with _open(args.db) as store:
        active = holds(store)
    if args.json:
        _write_json([h.model_dump() for h in active])
    elif not active:
        out.print(_text("no active legal holds"))
    for h in [] if args.json else active:
        out.print(_text(f"{h.id}  user {h.user_id}  by {h.placed_by}  {h.reason}"))
    return EXIT_OK


def _cmd_seal_rules(args: argparse.Namespace, out: Console) -> int:
    by = _given(args, "by", "")
    with _open(args.db) as store:
        keyring = keyring_for(args.db, create=False)
        with store.reading() as conn:  # a seal under another keyring vouches for nothing
            check_keyring(store, conn, keyring)
        sealed = seal_rules(store, keyring, by=by)
    if args.json:
        _write_json({"sealed": sealed, "by": by})
    else:
        done = f"{len(sealed)} rule row(s) sealed by {by}" if sealed else "every rule row is sealed"
        out.print(_text(done))
    return EXIT_OK
