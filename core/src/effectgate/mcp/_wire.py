"""What an MCP answer may hold: the SDK sends every message as UTF-8 JSON, which cannot hold a
lone surrogate (text a tool decoded with surrogateescape: `os.listdir` of a name that is not
UTF-8, a subprocess's output). Over stdio the SDK's writer fails on one and the server stops, so
every text and structured value of an answer has them written out first (`\\udcff`, as the gate
stores such text: `errors.storable_text`)."""

from __future__ import annotations

from typing import Any

from ..errors import storable_text


def written_out(value: Any, _path: frozenset[int] = frozenset()) -> Any:
    """A JSON value (text, or objects and arrays of them) with every lone surrogate in its text,
    keys included, written out; anything else as it is (a list or object holding itself, too:
    it has no JSON form, and the model is told its repr)."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, list | dict):
        if id(value) in _path:
            return value
        inner = _path | {id(value)}
        if isinstance(value, list):
            return [written_out(item, inner) for item in value]
        return {written_out(key, inner): written_out(item, inner) for key, item in value.items()}
    return value


__all__ = ["written_out"]
