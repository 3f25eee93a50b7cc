"""Edits of a RunState snapshot's JSON, as anyone holding the stored string could make them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from effectgate_openai_agents import STATE_KEY

Edit = Callable[[dict[str, Any]], None]


def set_value(key: str, value: str) -> Edit:
    return lambda data: data["context"]["context"].__setitem__(key, value)


def drop_entry(data: dict[str, Any]) -> None:
    del data["context"]["context"][STATE_KEY]


def _drop_signature(data: dict[str, Any]) -> None:
    del data["context"]["context"][STATE_KEY]["identity"]


def _alter_signature(data: dict[str, Any]) -> None:
    entry = data["context"]["context"][STATE_KEY]
    kid, mac = entry["identity"].split(".", 1)
    entry["identity"] = f"{kid}.{'A' if mac[0] != 'A' else 'B'}{mac[1:]}"


def both(*edits: Edit) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        for one in edits:
            one(data)

    return edit


def drop_interruption(data: dict[str, Any]) -> None:
    data["current_step"] = None


EDITS: dict[str, Edit] = {
    "user_id": set_value("user_id", "u2"),
    "session_id": set_value("session_id", "s-grace"),
    "origin_message_id": set_value("origin_message_id", "m-other"),
    "effectgate-entry-deleted": drop_entry,
    "entry-deleted-and-user_id": both(drop_entry, set_value("user_id", "u2")),
    "signature-deleted": _drop_signature,
    "signature-deleted-and-user_id": both(_drop_signature, set_value("user_id", "u2")),
    "signature-altered": _alter_signature,
}


def tampered(snapshot: str, edit: Edit) -> str:
    data = json.loads(snapshot)
    edit(data)
    return json.dumps(data)
