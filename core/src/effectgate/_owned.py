"""Files effectgate keeps for itself, which its file tools never read, write or delete.

A SQLite store's database with its journals (`-wal`, `-shm`, `-journal`) and the key file beside it
(`DB.keys`), any key file a keyring was loaded from, and the files that govern the gate: an effect
table loaded from TOML and the inbox's approver file. `file_tools(".")` next to the default
`effectgate.db` is a natural first set-up: without this a model could read the grant keys (the key
file is text, and a search shows its lines) or replace the ledger with a write, which runs at once.

Paths are recorded when a gate is built over a store (`own_store`) and when a keyring, table or
approver file is loaded (`own`), for the life of the process. `owned` matches an entry by its
directory (device and inode) and its name, compared case-insensitively after NFC (a file system
that folds case or normalizes names opens the same file under another spelling), and, for a file
with more than one link, by its own device and inode.
"""

from __future__ import annotations

import os
import threading
import unicodedata
from contextlib import suppress

_LOCK = threading.Lock()
_OWNED: dict[str, set[str]] = {}  # a folded file name -> the directories it is owned in
_PATHS: set[str] = set()  # the owned files' absolute paths


def _fold(name: str) -> str:
    return unicodedata.normalize("NFC", name).casefold()


def own(*paths: str | os.PathLike[str]) -> None:
    """Keep the file tools away from `paths` (whether they exist yet or not)."""
    with _LOCK:
        for path in paths:
            full = os.path.abspath(os.fspath(path))
            with suppress(OSError, ValueError):
                full = os.path.realpath(full)
            folder, name = os.path.split(full)
            _OWNED.setdefault(_fold(name), set()).add(folder)
            _PATHS.add(full)


def own_store(url: str) -> None:
    """A SQLite file store's database, its journals and its development key file (`DB.keys`)."""
    own(*(path for path, _ in store_files(url)))


def store_files(url: str) -> list[tuple[str, str]]:
    """The files of the SQLite file store at `url`, each with what it is: the database and its
    journals (beside the file a symlink names, where SQLite keeps them) and its development key
    file (`DB.keys`, beside the name given, as `keyring_for` reads it); none for another store.
    What the file tools never touch (`own_store`) and the CLI never writes over."""
    if not url.startswith("sqlite"):
        return []
    import sqlalchemy as sa

    from .stores._memory import in_memory, sqlite_file

    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        return []
    if parsed.get_backend_name() != "sqlite" or in_memory(parsed) or not parsed.database:
        return []
    database = given = str(sqlite_file(parsed))  # a URI form's (uri=true) path too
    with suppress(OSError, ValueError):  # SQLite keeps the journals beside the file a link names
        database = os.path.realpath(database)
    journals = [(f"{database}{end}", f"the database's {end} file") for end in ("-wal", "-shm", "-journal")]
    keys = [(f"{path}.keys", "the database's key file") for path in dict.fromkeys((database, given))]
    return [(database, "the database"), *journals, *keys]


def owned(dir_fd: int, name: str, seen: os.stat_result | None) -> bool:
    """Whether the entry `name` in the directory `dir_fd` (`seen`: its lstat, None when absent)
    is one of effectgate's own files."""
    if not _OWNED:
        return False
    with _LOCK:
        folders = list(_OWNED.get(_fold(name), ()))
        linked = list(_PATHS) if seen is not None and seen.st_nlink > 1 else []
    if folders:
        here = os.fstat(dir_fd)
        for folder in folders:
            with suppress(OSError):
                there = os.stat(folder)
                if (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino):
                    return True
    for path in linked:  # another name of an owned file (a hard link)
        with suppress(OSError):
            other = os.stat(path, follow_symlinks=False)
            if seen is not None and (other.st_dev, other.st_ino) == (seen.st_dev, seen.st_ino):
                return True
    return False
