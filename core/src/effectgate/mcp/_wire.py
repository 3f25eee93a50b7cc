"""What an MCP answer may hold: the SDK sends every message as UTF-8 JSON, which cannot hold a
lone surrogate (text a tool decoded with surrogateescape: `os.listdir` of a name that is not
UTF-8, a subprocess's output). Over stdio the SDK's writer fails on one and the server stops, so
every text and structured value of an answer has them written out first (`\\udcff`, as the gate
stores such text: `errors.storable_text`)."""

from __future__ import annotations

from typing import Any

from ..errors import storable_text


def written_out(value: Any) -> Any:
    """A JSON value (text, or objects and arrays of them) with every lone surrogate in its text,
    keys included, written out; anything else as it is."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, list):
        return [written_out(item) for item in value]
    if isinstance(value, dict):
        return {written_out(key): written_out(item) for key, item in value.items()}
    return value


__all__ = ["written_out"]
