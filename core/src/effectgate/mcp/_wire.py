"""What an MCP answer may hold: the SDK sends every message as UTF-8 JSON, which cannot hold a
lone surrogate (text a tool decoded with surrogateescape: `os.listdir` of a name that is not
UTF-8, a subprocess's output). Over stdio the SDK's writer fails on one and the server stops, so
every text and structured value of an answer has them written out first (`\\udcff`, as the gate
stores such text: `errors.storable_text`)."""

from __future__ import annotations

import json
from typing import Any

import pydantic_core

from ..errors import storable_text
from ..outcomes import model_text


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


def answer_of(result: Any) -> tuple[str, dict[str, Any] | None]:
    """The text and structured content of an executed call's result: its JSON as the store writes
    it (a pydantic model or a dataclass as its object, dates as ISO text), so the model reads
    what the other adapters give it, structured when that is an object. A value with no such
    JSON form (one holding itself, or nested deeper than the SDK writes) is told as its text
    (`model_text`), with nothing structured; one nested too deeply even for that, as a note."""
    jsonable = True
    if not isinstance(result, str | int | float | bool | None):
        try:
            result = pydantic_core.to_jsonable_python(result, fallback=str)
        except (TypeError, ValueError):
            jsonable = False
    try:
        value = written_out(result)
        text = model_text(value)  # as `Executed.for_model()`
    except RecursionError:
        return f"the result ({type(result).__name__}) is nested too deeply to be written out", None
    # the text's JSON: a value with no JSON form is printed there, never handed to the SDK raw
    try:
        return text, json.loads(text) if jsonable and isinstance(value, dict) else None
    except ValueError:  # an integer past Python's digit limit: written, but not read back
        return text, None


__all__ = ["answer_of", "written_out"]
