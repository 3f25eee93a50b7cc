"""`effectgate demo --framework langgraph`: the shop on a LangGraph graph, checked by its records."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from effectgate import open_store
from effectgate.cli import main


def test_langgraph_demo_runs_and_leaves_exactly_its_effects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo exits 0 twice on its own database; the second run starts afresh, and the records
    hold one refund execution (approved once, by finance), one write with before/after, one
    rejected out-of-scope intent and one denied email, with a clean audit."""
    url = f"sqlite:///{tmp_path}/lg.db"
    assert main(["demo", "--framework", "langgraph", "--db", url]) == 0
    assert main(["demo", "--framework", "langgraph", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "demo failed" not in out
    assert (tmp_path / "lg.db.checkpoints").exists()
    with open_store(url) as store:
        assert len(store.events(kind="demo_started")) == 1
        [refund] = store.executions(tool="refund_order")
        assert refund.status == "succeeded"
        assert json.loads(refund.args_json) == {"order_id": "1042", "amount": 12000, "currency": "GBP"}
        statuses = sorted((a.tool, a.status) for a in store.approvals())
        assert statuses == [
            ("refund_order", "executed"),
            ("refund_order", "rejected"),
            ("send_email", "denied"),
        ]
        assert [d.role for d in store.all_decisions() if d.decision == "approve"] == ["finance"]
        [rejected] = [a for a in store.approvals() if a.status == "rejected"]
        assert json.loads(rejected.args_json)["order_id"] == "2001"
        [write] = store.executions(tool="update_ticket_tags")
        assert json.loads(write.before_json or "null") == ["billing"]
        assert json.loads(write.after_json or "null") == ["billing", "urgent"]
    assert main(["--db", url, "audit"]) == 0


def test_langgraph_demo_without_the_adapter_prints_the_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without effectgate-langgraph installed the demo exits 2 with the extra to install, and
    makes no database."""
    monkeypatch.setitem(sys.modules, "effectgate_langgraph.demo", None)  # import now fails
    url = f"sqlite:///{tmp_path}/lg.db"
    assert main(["demo", "--framework", "langgraph", "--db", url]) == 2
    assert "pip install 'effectgate[langgraph]'" in capsys.readouterr().err
    assert not (tmp_path / "lg.db").exists()
