"""Round 21, the command line and the files it reads back:

- `redact --export FILE` erased from the export file every value an `eg_redacted` entry named,
  sealed or not: an entry inserted in the database (its commitment copied from the export file's
  own record, which carries it in clear) made a redaction of one subject erase another subject's
  values from the export, values the ledger still holds (the audit stays clean: it checks an
  entry only beside a marker); and one inserted after a sealed entry of the same value hid it (the
  file kept a value the ledger erased). Only entries whose seal verifies decide now.
- `export --out FILE` with a `FILE.partial` or `FILE.manifest.json.partial` left by an interrupted
  export (or another export of FILE under way) sealed the ledger's chain (new checkpoints) and
  wrote the whole file before refusing: refused now before the ledger is opened (exit 4).
- `redact --subject S --export FILE` whose file rewrite failed after the ledger's erasure says "run
  the same `effectgate redact` again to erase them from the file"; for a write (found by its
  arguments, which the first run erased) the same command then exited 3 (`SubjectNotFound`) and
  never reached the file, which kept the values. A subject an earlier redaction of the user
  erased is now found as erased: the files are finished, nothing new is erased in the ledger.
- `setup` said "kept the development key file DB.keys" (or "keys from $EFFECTGATE_KEYRING") and
  exited 0 over a key file no command can load (not a keyring, readable by others, a symlink to
  nothing) or a malformed $EFFECTGATE_KEYRING: every later command then failed. Refused now,
  exit 2, before the schema is made.
- `mcp proxy --config FIFO` (a named pipe, or /dev/stdin, which carries MCP over stdio) waited for
  a writer for ever; refused now as not a regular file (exit 2), as `serve --approvers` is."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from effectgate import Approver, Executed, Grant, Pending, open_store
from effectgate import export as export_module
from effectgate.cli import keyring_for
from effectgate.examples.shop import app, context

from . import test_cli
from .test_cli import Run

cli = test_cli.cli  # the command run in-process, and a clean environment
_cli_env = test_cli._cli_env

FINANCE = Approver("fiona", "finance")
REFUND = {"amount": 500, "currency": "GBP"}


@pytest.fixture
def two_orders(tmp_path: Path) -> str:
    """A ledger with two executed refunds of user u1 (orders 1042 and 1043); returns its URL."""
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    with open_store(url) as store:
        store.setup()
        gate = app(store, keyring=keyring_for(url))
        for message, order in (("m1", "1042"), ("m2", "1043")):
            pending = gate.call("refund_order", {**REFUND, "order_id": order}, context(message, user_id="u1"))
            assert isinstance(pending, Pending), pending
            grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
            assert isinstance(grant, Grant)
            assert isinstance(gate.execute(grant.token), Executed)
        gate.close()
    return url


def _lines(export: Path) -> list[dict[str, object]]:
    return [json.loads(text) for text in export.read_text().splitlines()]


def test_an_unsealed_redaction_entry_never_erases_a_value_from_an_export(
    two_orders: str, tmp_path: Path, cli: Callable[..., Run]
) -> None:
    export = tmp_path / "x.jsonl"
    assert cli("export", "--db", two_orders, "--out", str(export), "--settle", "0").code == 0
    [other] = [line for line in _lines(export) if '"1043"' in str(line["personal"])]
    record = other["record"]
    assert isinstance(record, dict)
    with open_store(two_orders) as store, store.transaction() as conn:  # inserted, not sealed
        store.append_redacted(
            conn,
            [
                {
                    "redaction_id": "r-forged",
                    "table_name": "eg_executions",
                    "row_key": str(record["seq"]),
                    "column_name": "args_json",
                    "commitment": record["personal"]["args_json"],
                    "at": 0.0,
                    "seal": "k1.forged",
                }
            ],
        )
    run = cli(
        "redact", "--db", two_orders, "--user", "u1", "--subject", '{"order_id": "1042"}',
        "--by", "dpo", "--reason", "r", "--export", str(export),
    )  # fmt: skip
    assert run.code == 0, (run.code, run.out, run.err)
    left = [line for line in _lines(export) if line["seq"] == other["seq"]]
    assert left == [other]  # order 1043's values, still in the ledger, stay in the file
    with open_store(two_orders) as store:
        [row] = [e for e in store.executions() if e.id == other["seq"]]
        assert '"1043"' in row.args_json


def test_an_inserted_redaction_entry_never_hides_a_sealed_one_from_an_export(
    two_orders: str, tmp_path: Path, cli: Callable[..., Run]
) -> None:
    export = tmp_path / "x.jsonl"
    assert cli("export", "--db", two_orders, "--out", str(export), "--settle", "0").code == 0
    [mine] = [line for line in _lines(export) if '"1042"' in str(line["personal"])]
    command = ["redact", "--db", two_orders, "--user", "u1", "--subject", '{"order_id": "1042"}']
    command += ["--by", "dpo", "--reason", "r"]
    assert cli(*command).code == 0  # the ledger's values erased; the export file not given
    with open_store(two_orders) as store, store.transaction() as conn:  # the same value, inserted
        store.append_redacted(
            conn,
            [
                {
                    "redaction_id": "r-forged",
                    "table_name": "eg_executions",
                    "row_key": str(mine["seq"]),
                    "column_name": "args_json",
                    "commitment": "k1.00",
                    "at": 0.0,
                    "seal": "k1.forged",
                }
            ],
        )
    run = cli(*command, "--export", str(export))  # run again to erase the file's copies
    assert run.code == 0, (run.code, run.out, run.err)
    [left] = [line for line in _lines(export) if line["seq"] == mine["seq"]]
    assert left["personal"] == {}  # erased, as the ledger's sealed entry says
    assert cli("verify", "--db", two_orders, str(export)).code == 0


def _checkpoints(url: str) -> int:
    with open_store(url) as store, store.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM eg_chain")).scalar_one())


@pytest.mark.parametrize("left", ["x.jsonl.partial", "x.jsonl.manifest.json.partial"])
def test_an_export_over_an_unfinished_rewrite_is_refused_before_the_ledger_is_sealed(
    two_orders: str, tmp_path: Path, cli: Callable[..., Run], left: str
) -> None:
    (tmp_path / left).write_text("half of an interrupted export\n")
    before = _checkpoints(two_orders)
    run = cli("export", "--db", two_orders, "--out", str(tmp_path / "x.jsonl"), "--settle", "0")
    assert run.code == 4, (run.code, run.out, run.err)
    assert f"{left} exists" in run.err
    assert _checkpoints(two_orders) == before  # the ledger's chain was not sealed for it
    assert not (tmp_path / "x.jsonl").exists()
    assert not (tmp_path / "x.jsonl.manifest.json").exists()
    assert (tmp_path / left).read_text() == "half of an interrupted export\n"


def test_a_subject_write_whose_file_erasure_failed_is_finished_by_the_same_command(
    tmp_path: Path, cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    with open_store(url) as store:
        store.setup()
        gate = app(store, keyring=keyring_for(url))
        args = {"ticket_id": "t-17", "tags": ["urgent"]}
        assert isinstance(gate.call("update_ticket_tags", args, context("m1")), Executed)
        pending = gate.call("refund_order", {**REFUND, "order_id": "1043"}, context("m2"))
        assert isinstance(pending, Pending), pending
        grant = gate.approve(pending.approval_id, version=1, approver=FINANCE)
        assert isinstance(grant, Grant)
        assert isinstance(gate.execute(grant.token), Executed)
        gate.close()
    export = tmp_path / "x.jsonl"
    assert cli("export", "--db", url, "--out", str(export), "--settle", "0").code == 0
    command = ["redact", "--db", url, "--user", "u1", "--subject", '{"ticket_id": "t-17"}']
    command += ["--by", "dpo", "--reason", "r", "--export", str(export)]
    real = export_module.read_lines

    def failing(path: str | Path, **options: Any) -> Any:
        raise OSError("disk gone")

    monkeypatch.setattr(export_module, "read_lines", failing)
    first = cli(*command)
    assert first.code == 4, (first.code, first.out, first.err)
    assert "run the same `effectgate redact` again" in first.err
    assert "t-17" in export.read_text()  # the ledger's values are erased, the file's not yet
    monkeypatch.setattr(export_module, "read_lines", real)
    again = cli(*command)
    assert again.code == 0, (again.code, again.out, again.err)
    assert "t-17" not in export.read_text()  # finished
    assert "1043" in export.read_text()  # the other subject's values stay
    assert cli("verify", "--db", url, str(export)).code == 0
    with open_store(url) as store:
        assert [e for e in store.executions() if "1043" in e.args_json]  # nothing more erased
    typo = cli(*[a if a != '{"ticket_id": "t-17"}' else '{"ticket_id": "t-99"}' for a in command])
    assert typo.code == 3, (typo.code, typo.out, typo.err)  # a subject never erased: still not found


@pytest.mark.parametrize(
    ("text", "mode", "env"),
    [
        ("not a keyring\n", 0o600, None),
        ("k1:" + "ab" * 32 + "\n", 0o644, None),  # readable by others
        (None, 0o600, None),  # a symbolic link to nothing
        (None, 0o600, "nonsense"),
        (None, 0o600, "k1:00ff"),  # too short a key
    ],
    ids=["garbage", "world-readable", "dangling-link", "env-malformed", "env-short"],
)
def test_setup_refuses_a_keyring_no_command_could_load(
    tmp_path: Path,
    cli: Callable[..., Run],
    monkeypatch: pytest.MonkeyPatch,
    text: str | None,
    mode: int,
    env: str | None,
) -> None:
    db, keys = tmp_path / "new.db", tmp_path / "new.db.keys"
    if env is not None:
        monkeypatch.setenv("EFFECTGATE_KEYRING", env)
    elif text is None:
        keys.symlink_to(tmp_path / "nowhere")
    else:
        keys.write_text(text)
        keys.chmod(mode)
    run = cli("setup", "--db", f"sqlite:///{db}")
    assert run.code == 2, (run.code, run.out, run.err)
    assert "nothing was set up" in run.err
    assert run.out == ""
    assert not db.exists()  # no schema made
    assert not (tmp_path / "nowhere").exists()


def test_mcp_proxy_never_waits_on_a_named_pipe_for_its_config(
    tmp_path: Path, cli: Callable[..., Run]
) -> None:
    pytest.importorskip("mcp")
    fifo = tmp_path / "proxy.toml"
    os.mkfifo(fifo)
    toml = '[servers.files]\ncommand = ["files-server"]\n[servers.files.tools.write]\neffect = "write"\n'

    def writer() -> None:  # without the check the command reads this, then finds no database (3)
        with fifo.open("w") as f:
            f.write(toml)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    db = f"sqlite:///{tmp_path / 'missing.db'}"
    run = cli("mcp", "proxy", "--db", db, "--config", str(fifo), "--agent", "desk", "--user", "u1")
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # lets the writer finish either way
    thread.join()
    os.close(fd)
    assert run.code == 2, run
    assert "not a regular file" in run.err
