"""The signed AwaitingApproval record across processes: paused in one, resumed in another, and
refused there (TamperedState, nothing refunded) when anything it signs was edited."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from effectgate import Grant, Keyring, open_store
from effectgate.examples.shop import Shop, app
from tests._helpers import ROOT, last_json_line, run_module
from tests.conformance.adapters import FINANCE

from ._process import TAMPERED

MODULE = "tests.integrations.smolagents._process"

Record = dict[str, Any]


def _user(record: Record) -> None:
    record["user_id"] = "u2"


def _paused_call(record: Record) -> None:
    """Another paused call: the next version, other arguments."""
    record["paused"][0]["version"] += 1
    record["paused"][0]["args_hash"] = "0" * 64


def _no_signature(record: Record) -> None:
    del record["signature"]


EDITS: dict[str, Callable[[Record], None]] = {
    "user_id": _user,
    "paused_call": _paused_call,
    "no_signature": _no_signature,
}


def _approve(db: str, keyring: str, approval_id: str) -> str:
    """Finance approves version 1 through the shop's gate on the shared database: the grant."""
    store = open_store(db)
    gate = app(store, keyring=Keyring.parse(keyring), shop=Shop())
    try:
        decision = gate.approve(approval_id, version=1, approver=FINANCE)
        assert isinstance(decision, Grant)
        return decision.token
    finally:
        gate.close()
        store.close()


def test_an_edited_awaiting_record_is_refused_in_another_process(tmp_path: Path) -> None:
    """A resume from an awaiting.json whose user or paused call (version, args hash) was edited, or
    whose signature was removed, exits with TamperedState and refunds nothing, in that process or in
    the database; the record as saved still resumes and refunds once."""
    db = f"sqlite:///{tmp_path}/effectgate.db"
    env = {**os.environ, "EFFECTGATE_KEYRING": Keyring.generate().dumps()}
    env.pop("EFFECTGATE_APP", None)
    paused = last_json_line(run_module(MODULE, "pause", "--db", db, "--state", str(tmp_path), env=env))
    [approval_id] = paused["awaiting"]["approval_ids"]
    token = _approve(db, env["EFFECTGATE_KEYRING"], approval_id)
    saved = json.loads((tmp_path / "awaiting.json").read_text())

    children: dict[str, subprocess.Popen[str]] = {}
    for name, edit in EDITS.items():  # independent resumes, started together (each imports a while)
        record = json.loads(json.dumps(saved))
        edit(record)
        edited = tmp_path / f"awaiting-{name}.json"
        edited.write_text(json.dumps(record))
        children[name] = subprocess.Popen(
            [
                *(sys.executable, "-m", MODULE, "resume", "--db", db, "--state", str(tmp_path)),
                *("--token", token, "--awaiting", str(edited)),
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    for name, child in children.items():
        stdout, stderr = child.communicate(timeout=300)
        assert child.returncode == TAMPERED, (name, stderr)
        refused = last_json_line(stdout)
        assert (refused["error"], refused["refunds_here"]) == ("TamperedState", 0), name
        assert "Nothing ran" in refused["message"] or "no signature" in refused["message"], name

    store = open_store(db)
    try:
        assert store.executions() == []
        row = store.get_approval(approval_id)
        assert row is not None
        assert row.status == "approved"
    finally:
        store.close()

    resumed = last_json_line(
        run_module(MODULE, "resume", "--db", db, "--state", str(tmp_path), "--token", token, env=env)
    )
    assert (resumed["output"], resumed["decided"], resumed["refunds_here"]) == (
        "Refunded 120.00 GBP.",
        ["Executed"],
        1,
    )
    store = open_store(db)
    try:
        assert [(e.tool, e.status) for e in store.executions()] == [("refund_order", "succeeded")]
    finally:
        store.close()
