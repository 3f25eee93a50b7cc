"""The README's inbox walk-through, run as written (issue 17).

The ```sh block under "The reviewer inbox" runs in bash in a fresh directory. `make` and `uv` are
shell functions that do what the Makefile's targets do, minus the venv set-up this suite already
has: `make demo` runs `effectgate demo`, `uv run X` runs X, and `make serve` starts the Makefile's
own `serve` recipe (read from the Makefile, on a free port). Then a browser's requests: sign in as
the approver the block registers, find the refund the demo left for finance, approve it. The
approval is then approved in the demo database, by fiona as finance.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx

from effectgate import open_store
from tests.web.serving import free_port, login_page

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def inbox_block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## The reviewer inbox\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert found, "the inbox section has no ```sh block"
    return found.group(1)


def serve_recipe() -> list[str]:
    """The Makefile's `serve` command line, as the shell would split it."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    recipe = re.search(r"^serve:.*\n\t@(.+)$", makefile, re.MULTILINE)
    assert recipe, "the Makefile has no serve recipe"
    line = (
        recipe.group(1)
        .replace("$(UV) run --frozen ", "")
        .replace("$${APPROVERS:-approvers.toml}", "approvers.toml")
    )
    assert "$" not in line, line
    return shlex.split(line)


SHIMS = """
make() {
  case "$1" in
    demo) effectgate demo ;;
    serve) echo "make serve" >> serve.requested ;;
    *) echo "unexpected make $1" >&2; return 2 ;;
  esac
}
uv() { [ "$1" = run ] || return 2; shift; "$@"; }
set -euo pipefail
"""


def test_the_inbox_walk_through_works_as_written(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "EFFECTGATE_WEB_SECRET": "s" * 32}
    for name in ("EFFECTGATE_DB", "EFFECTGATE_APP", "EFFECTGATE_KEYRING"):
        env.pop(name, None)
    done = subprocess.run(
        ["bash", "-c", SHIMS + inbox_block()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "serve.requested").exists(), "the block never starts the inbox"
    db = "sqlite:///effectgate-demo.db"
    with open_store(f"sqlite:///{tmp_path / 'effectgate-demo.db'}") as store:
        waiting = store.approvals(status="pending", role="finance")
    assert waiting, "the demo left nothing for the finance approver"
    refund = waiting[0]

    port = free_port()
    command = serve_recipe()
    assert command[:2] == ["effectgate", "serve"]
    assert db in command
    proc = subprocess.Popen(
        [str(BIN / command[0]), *command[1:], "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        login = login_page(base, proc)
        with httpx.Client(base_url=base, cookies=login.cookies) as client:
            csrf = re.search(r'name="csrf" value="([^"]+)"', login.text)
            assert csrf
            signed = client.post(
                "/login", data={"csrf": csrf.group(1), "approver": "fiona", "secret": "a long secret"}
            )
            assert signed.status_code == 303, signed.text
            inbox = client.get("/")
            assert refund.id in inbox.text
            page = client.get(f"/approvals/{refund.id}")
            csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
            assert csrf
            answer = client.post(
                f"/approvals/{refund.id}/approve",
                data={"csrf": csrf.group(1), "version": refund.version, "args_hash": refund.args_hash},
            )
            assert answer.status_code == 200, answer.text
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    with open_store(f"sqlite:///{tmp_path / 'effectgate-demo.db'}") as store:
        decided = [d for d in store.all_decisions() if d.approval_id == refund.id]
        row = store.get_approval(refund.id)
    assert [(d.approver_id, d.role, d.decision) for d in decided] == [("fiona", "finance", "approve")]
    assert row is not None
    assert row.status == "approved"
