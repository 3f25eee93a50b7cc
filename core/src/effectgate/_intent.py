"""The keys a gated call is proposed under (`_proposals`): its subject's, which the subject lock
and history use, and its intent's (session, tool, origin message, and subject or arguments),
which finds the call's approval again however often it is re-issued. One derivation, for the
gate and for anything that must find a call's approval as the gate filed it (`mcp._prior`); and
the one wording of the refusal of a call found so that may not run as its row's class now is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .canonical import ENCODE, digest, key_of, plain_json, sha256_hex
from .context import CallContext
from .stores.records import ApprovalRow
from .table import ToolSpec


def subject_keys(subject: Any, *parts: str) -> tuple[str, str]:
    """`digest({"subject": subject})` and `key_of(*parts, subject)`, a plain subject encoded once."""
    if not (plain_json(subject) and plain_json("".join(parts))):
        return digest({"subject": subject}), key_of(*parts, subject)
    text, listed = ENCODE(subject), ",".join(map(ENCODE, parts))
    return sha256_hex(f'{{"subject":{text}}}'.encode()), sha256_hex(f"[{listed},{text}]".encode())


def intent_keys(
    spec: ToolSpec, args: Mapping[str, Any], frozen: str, ctx: CallContext, subject: Any
) -> tuple[str, str]:
    """The (subject key, intent key) a call of `spec` is proposed under: `args` frozen, `frozen`
    their hash, `subject` `spec.subject_of(args)`. Shadow calls never hold a live subject, nor a
    live call's intent key."""
    head = ("intent-shadow" if spec.shadow else "intent", ctx.session_id, spec.name, ctx.origin_message_id)
    if subject is not None:
        subject_key, intent = subject_keys(subject, *head)
    else:
        subject_key, intent = f"args:{frozen}", key_of(*head, dict(args))
    return (f"shadow:{subject_key}" if spec.shadow else subject_key), intent


def reclassified_since(tool: str, row: ApprovalRow, effect: str) -> str:
    """The `mismatch` refusal of a call of `tool` proposed for approval as `row` while its tool was
    gated, re-issued now that it is an `effect` call (a write, `_calls`; a read, `mcp._prior`)."""
    return (
        f"{tool}: this call was proposed for approval as a {row.effect} call (approval {row.id}, "
        f"{row.status}); its tool has been reclassified since (its table row or, behind MCP, its "
        f"server's hints), and it does not run as a {effect} call. Nothing ran; this request "
        "cannot run as it is."
    )
