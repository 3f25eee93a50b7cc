"""A tool call's arguments as the model sent them: parsed for the gate, and which call they make."""

from __future__ import annotations

import json
from typing import Any

from effectgate.canonical import args_hash


def parse(arguments: str) -> Any:
    """The model's arguments as JSON; what does not parse goes to the gate as is (-> Invalid)."""
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments


def call_of(name: str, args: Any) -> str:
    """Which call an outcome was decided for: its tool and arguments ("" if they do not hash)."""
    try:
        return args_hash(name, args)
    except Exception:
        return ""
