"""The application's gate for the commands that take --app (`_store._make_gate`), imported only
by a command that makes a gate: `audit` without --app loads neither this nor the gate."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from ..errors import describe
from ..gate import EffectGate
from ..stores._memory import sqlite_file
from ..stores.sql import SQLStore
from ._moved import shadowed
from ._store import UsageError

__all__ = ["EffectGate", "load_app", "same_database"]


def load_app(ref: str) -> Callable[..., EffectGate]:
    module, sep, attr = ref.partition(":")
    if not sep:
        raise UsageError(f"--app takes module:factory, got {ref!r}")
    try:
        try:
            loaded = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            # The installed script's sys.path[0] is its bin directory: find a module of the working
            # directory as `python -m effectgate.cli` does (kept: its tools may import lazily).
            if exc.name != module.partition(".")[0] or os.getcwd() in sys.path:
                raise
            sys.path.append(os.getcwd())  # last: never shadows an installed package
            loaded = importlib.import_module(module)
        factory = getattr(loaded, attr)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot load --app {ref}: {exc}{shadowed(module)}") from exc
    except Exception as exc:  # the module's own code failed on import (its config), or `.name`
        raise UsageError(f"cannot load --app {ref}: {describe(exc)}") from exc
    if not callable(factory):
        raise UsageError(f"--app {ref} is not callable")
    return factory  # type: ignore[no-any-return]


def same_database(mine: object, given: SQLStore) -> bool:
    """Whether the app's gate decides in the database the command opened (the same SQLite file,
    or the same server database): else `--db` would name one ledger and the call run in another."""
    if mine is given:
        return True
    url = getattr(getattr(mine, "engine", None), "url", None)
    if not isinstance(url, sa.engine.URL) or url.get_backend_name() != given.engine.url.get_backend_name():
        return False
    urls = [url, given.engine.url]
    if urls[1].get_backend_name() == "sqlite":  # no file: in memory, a database of its own
        files = [sqlite_file(u) for u in urls]
        return None not in files and len({Path(f).resolve() for f in files if f}) == 1
    return len({(u.host, u.port or 5432, u.database) for u in urls}) == 1
