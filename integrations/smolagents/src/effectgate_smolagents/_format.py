"""No `str.format` in a gated CodeAgent's code: a replacement field reads any attribute.

smolagents' interpreter refuses a dunder attribute that code names (`tool.__wrapped__`), but a
replacement field of `str.format` or `format_map` follows attributes and items itself, dunders
included: `"{0.__wrapped__.__globals__}".format(tool)` showed the adapter's module, and from there
the gate, its store and its keyring's secret, as text the model could answer with. So a gated
CodeAgent's executor refuses code that names `format` or `format_map` as an attribute, and its
`getattr` refuses those names (an error the model reads: an f-string formats, format specs
included, and its fields are checked code). A hardening only: smolagents' local interpreter is
not a security boundary (see the README).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from smolagents.local_python_executor import InterpreterError, LocalPythonExecutor

REFUSED = frozenset({"format", "format_map"})
REFUSAL = (
    "str.format and format_map are not available to this agent's code (their fields read any "
    'attribute): use an f-string, e.g. f"{x:>8.2f}"'
)
_CHECKED: dict[type, type] = {}


def refuse_format(executor: object) -> None:
    """Make a local executor refuse code naming `format` / `format_map`, and guard its `getattr`
    (call after each `send_tools`, which rebuilds its tools)."""
    if not isinstance(executor, LocalPythonExecutor):
        return  # a remote one is refused when wrapped (`_managed.check_executor`)
    cls = type(executor)
    if cls not in _CHECKED.values():
        executor.__class__ = _CHECKED.get(cls) or _checked(cls)
    found = executor.static_tools.get("getattr")
    if found is not None and not getattr(found, "_effectgate_format", False):
        executor.static_tools["getattr"] = _guarded(found)


def check_code(code: str) -> None:
    """`InterpreterError` if `code` names `format` or `format_map` as an attribute."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return  # smolagents reports it
    if any(isinstance(n, ast.Attribute) and n.attr in REFUSED for n in ast.walk(tree)):
        raise InterpreterError(REFUSAL)


def _checked(cls: type) -> type:
    def __call__(self: Any, code_action: str) -> Any:
        check_code(code_action)
        return cls.__call__(self, code_action)

    # no slots of its own: its instances have the layout of `cls`'s, so `__class__` can be set
    made = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__, "__slots__": ()})
    _CHECKED[cls] = made
    return made


def _guarded(getattr_: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(obj: Any, name: str, *default: Any) -> Any:
        if name in REFUSED:
            raise InterpreterError(REFUSAL)
        return getattr_(obj, name, *default)

    guarded._effectgate_format = True  # type: ignore[attr-defined]
    guarded.__name__ = guarded.__qualname__ = "getattr"
    return guarded
