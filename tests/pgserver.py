"""A throwaway PostgreSQL server on 127.0.0.1 for the test suite (Debian's `postgresql` package).

`python tests/pgserver.py start|stop|url` is what `make test` uses; the pytest fixtures call the
same functions. As root, a missing server is installed with apt-get, and the cluster runs as the
`postgres` system user (PostgreSQL refuses to run as root). Without root and without PostgreSQL,
`start` says how to enable the tests and exits 3; the fixtures then skip, except under CI=true,
where they fail.
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / ".pgtest"
PORT_FILE = DATA / "port"
#: Held while a server is started or stopped: pytest-xdist's workers each start it (idempotent),
#: and one must never clear the data directory of a server another is starting or using.
LOCK_FILE = ROOT / ".pgtest.lock"
ENABLE_HINT = (
    "PostgreSQL tests need a server: install Debian's postgresql package (apt-get install "
    "postgresql) or run `make test` as root, or set EFFECTGATE_PG_URL to a server you own."
)


class Unavailable(RuntimeError):
    pass


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _install() -> None:
    if os.geteuid() != 0:
        raise Unavailable(ENABLE_HINT)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "postgresql"], check=True, env=env)


def _as_owner(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def url(dbname: str = "postgres") -> str:
    env = os.environ.get("EFFECTGATE_PG_URL")
    if env:
        return env.rsplit("/", 1)[0] + f"/{dbname}"
    if not PORT_FILE.exists():
        raise Unavailable("the test PostgreSQL server is not running (python tests/pgserver.py start)")
    port = PORT_FILE.read_text().strip()
    return f"postgresql+psycopg://postgres@127.0.0.1:{port}/{dbname}"


def _ready(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


@contextmanager
def _locked() -> Iterator[None]:
    with open(LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def start() -> str:
    """Start the server (idempotent) and return its URL."""
    if os.environ.get("EFFECTGATE_PG_URL"):
        return url()
    with _locked():
        return _start()


def _start() -> str:
    # patient: a busy machine (two test workers) may be slow to accept; a live server is never replaced
    if PORT_FILE.exists() and _ready(int(PORT_FILE.read_text()), timeout=5):
        return url()
    bindir = _bindir()
    if bindir is None:
        _install()
        bindir = _bindir()
    if bindir is None:
        raise Unavailable(ENABLE_HINT)
    if DATA.exists():
        shutil.rmtree(DATA)
    DATA.mkdir(parents=True)
    if os.geteuid() == 0:
        shutil.chown(DATA, "postgres", "postgres")
    pgdata = DATA / "data"
    subprocess.run(
        _as_owner(
            [
                str(bindir / "initdb"),
                "-D",
                str(pgdata),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ]
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    port = _free_port()
    # fsync off: a throwaway test cluster; durability is tested against SQLite FULL and by kills,
    # not by pulling the power. max_connections covers 16 racing processes with pools.
    opts = (
        f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={DATA} "
        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
    )
    subprocess.run(
        _as_owner(
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(pgdata),
                "-l",
                str(DATA / "log"),
                "-o",
                opts,
                "-w",
                "-t",
                "60",
                "start",
            ]
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    PORT_FILE.write_text(str(port))
    deadline = time.monotonic() + 30
    while not _ready(port):
        if time.monotonic() > deadline:
            raise Unavailable(f"PostgreSQL did not start; see {DATA / 'log'}")
        time.sleep(0.1)
    return url()


def stop() -> None:
    with _locked():
        _stop()


def _stop() -> None:
    bindir = _bindir()
    pgdata = DATA / "data"
    if bindir is None or not pgdata.exists():
        return
    subprocess.run(
        _as_owner([str(bindir / "pg_ctl"), "-D", str(pgdata), "-m", "fast", "-w", "stop"]),
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    PORT_FILE.unlink(missing_ok=True)


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "start"
    try:
        if command == "start":
            print(start())
        elif command == "stop":
            stop()
        elif command == "url":
            print(url())
        else:
            sys.exit(f"usage: {sys.argv[0]} start|stop|url")
    except Unavailable as exc:
        print(str(exc), file=sys.stderr)
        sys.exit(3)
