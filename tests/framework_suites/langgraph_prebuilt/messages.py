# ruff: noqa
# Vendored from langgraph-prebuilt 1.1.3, libs/prebuilt/tests/messages.py (the PyPI sdist
# langgraph_prebuilt-1.1.3.tar.gz, sha256 7ee72332e925000e3d24d2d491dd0ebb9d3a44dbffe650185943b730a832cf6d).
# MIT, Copyright (c) 2024 LangChain, Inc.: see LICENSE beside. Unchanged below this header; edits: `from tests.any_str` made `from .any_str` (this package).
# The swap to the gated node happens in conftest.py / _swap.py, never here.
"""Redefined messages as a work-around for pydantic issue with AnyStr.

The code below creates version of pydantic models
that will work in unit tests with AnyStr as id field
Please note that the `id` field is assigned AFTER the model is created
to workaround an issue with pydantic ignoring the __eq__ method on
subclassed strings.
"""

from typing import Any

from langchain_core.messages import HumanMessage, ToolMessage

from .any_str import AnyStr


def _AnyIdHumanMessage(**kwargs: Any) -> HumanMessage:
    """Create a human message with an any id field."""
    message = HumanMessage(**kwargs)
    message.id = AnyStr()
    return message


def _AnyIdToolMessage(**kwargs: Any) -> ToolMessage:
    """Create a tool message with an any id field."""
    message = ToolMessage(**kwargs)
    message.id = AnyStr()
    return message
