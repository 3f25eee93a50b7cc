"""`effectgate serve` against the demo database: it starts on loopback, signs an approver in,
and lists the demo's records; bad set-up is refused with one line and exit 2."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from effectgate.cli import main
from effectgate.web import hash_secret
from tests.web.serving import free_port, login_page

ROOT = Path(__file__).resolve().parents[2]


def test_serve_works_against_the_demo_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """After the demo, the inbox serves its history and pending cards to a registered approver."""
    db = f"sqlite:///{tmp_path}/demo.db"
    assert main(["demo", "--db", db]) == 0
    capsys.readouterr()
    approvers = tmp_path / "approvers.toml"
    approvers.write_text(f'[[approver]]\nid = "fiona"\nrole = "finance"\nsecret = "{hash_secret("pw")}"\n')
    port = free_port()
    command = [sys.executable, "-m", "effectgate.cli", "serve", "--db", db]
    command += ["--app", "effectgate.examples.shop:app", "--approvers", str(approvers), "--port", str(port)]
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, "EFFECTGATE_WEB_SECRET": "s" * 32},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # printed just before uvicorn binds
        assert f"127.0.0.1:{port}" in first, first
        base = f"http://127.0.0.1:{port}"
        login = login_page(base, proc)
        with httpx.Client(base_url=base, cookies=login.cookies) as client:
            csrf = re.search(r'name="csrf" value="([^"]+)"', login.text)
            assert csrf
            r = client.post("/login", data={"csrf": csrf.group(1), "approver": "fiona", "secret": "pw"})
            assert r.status_code == 303
            history = client.get("/history")
            assert history.status_code == 200
            assert "refund_order" in history.text
            assert "executed" in history.text
            assert client.get("/").status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "needs --approvers"),
        (["--approvers", "/nonexistent.toml"], "cannot read --approvers"),
    ],
)
def test_serve_refuses_bad_setup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    """Without a usable approvers file serve exits 2 with one line and serves nothing."""
    db = f"sqlite:///{tmp_path}/demo.db"
    assert main(["demo", "--db", db]) == 0
    capsys.readouterr()
    assert main(["serve", "--db", db, "--app", "effectgate.examples.shop:app", *extra]) == 2
    assert message in capsys.readouterr().err


def test_serve_without_app_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Approving re-runs the table's checks, so serve needs the application's gate."""
    db = f"sqlite:///{tmp_path}/demo.db"
    assert main(["demo", "--db", db]) == 0
    approvers = tmp_path / "a.toml"
    approvers.write_text(f'[[approver]]\nid = "f"\nrole = "finance"\nsecret = "{hash_secret("pw")}"\n')
    capsys.readouterr()
    assert main(["serve", "--db", db, "--approvers", str(approvers)]) == 2
    assert "--app" in capsys.readouterr().err


def test_hash_secret_prints_a_verifiable_scrypt_hash() -> None:
    """`effectgate hash-secret` reads the secret on stdin and prints a hash that verifies it only."""
    from effectgate.web import verify_secret

    done = subprocess.run(
        [sys.executable, "-m", "effectgate.cli", "hash-secret"],
        input="correct horse\n",
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    stored = done.stdout.strip()
    assert stored.startswith("scrypt$")
    assert verify_secret("correct horse", stored)
    assert not verify_secret("correct horsf", stored)


def _approvers(tmp_path: Path) -> Path:
    approvers = tmp_path / "a.toml"
    approvers.write_text(f'[[approver]]\nid = "f"\nrole = "finance"\nsecret = "{hash_secret("pw")}"\n')
    return approvers


def _serve(db: str, tmp_path: Path) -> list[str]:
    """`effectgate serve` on `db` with the shop app and an approvers file (no --port)."""
    return [
        "serve",
        "--db",
        db,
        "--app",
        "effectgate.examples.shop:app",
        "--approvers",
        str(_approvers(tmp_path)),
    ]


@pytest.mark.parametrize("port", ["0", "99999", "-1"])
def test_serve_refuses_a_port_out_of_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], port: str
) -> None:
    """A port outside 1-65535 is a usage error in one line, before anything is opened or served."""
    assert main([*_serve(f"sqlite:///{tmp_path}/d.db", tmp_path), "--port", port]) == 2
    out, err = capsys.readouterr()
    assert "1 to 65535" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert "inbox on" not in out
    assert not (tmp_path / "d.db").exists()


def test_serve_refuses_a_port_in_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A port another process listens on: one line, exit 5 (unavailable), and no claim to serve."""
    import socket

    db = f"sqlite:///{tmp_path}/demo.db"
    assert main(["demo", "--db", db]) == 0
    capsys.readouterr()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main([*_serve(db, tmp_path), "--port", str(port)]) == 5
    out, err = capsys.readouterr()
    assert f"cannot listen on 127.0.0.1:{port}" in err
    assert len(err.strip().splitlines()) == 1
    assert "inbox on" not in out
