"""Durability: pause, approve and resume in three processes; replays and forks from old checkpoints."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from effectgate import Keyring, open_store
from effectgate.testing import Script, call, say
from tests._helpers import last_json_line, run_checked, run_module
from tests.conformance.adapters import REFUND, ShopGate, grant

from .conftest import MakeLangGraphHarness


def _process(command: str, env: dict[str, str], *extra: str) -> dict[str, Any]:
    return last_json_line(
        run_module(
            "tests.integrations.langgraph._process",
            command,
            "--db",
            env["EG_TEST_DB"],
            "--checkpoints",
            env["EG_TEST_CHECKPOINTS"],
            *extra,
            env=env,
        )
    )


def _env(tmp_path: Path) -> dict[str, str]:
    """One keyring, one effectgate database and one checkpoint file, shared by the processes."""
    env = {
        **os.environ,
        "EFFECTGATE_KEYRING": Keyring.generate().dumps(),
        "EG_TEST_DB": f"sqlite:///{tmp_path}/effectgate.db",
        "EG_TEST_CHECKPOINTS": str(tmp_path / "checkpoints.db"),
    }
    env.pop("EFFECTGATE_APP", None)
    return env


def _cli_approve(env: dict[str, str], request: dict[str, Any]) -> str:
    """`effectgate approve` in its own process, as finance; the grant token it prints."""
    cli = Path(sys.executable).with_name("effectgate")
    approved = run_checked(
        [
            str(cli),
            "--db",
            env["EG_TEST_DB"],
            "--app",
            "effectgate.examples.shop:app",
            "approve",
            request["approval_id"],
            "--version",
            str(request["version"]),
            "--as",
            "finance",
            "--approver",
            "fiona",
        ],
        env,
    )
    return approved.strip().splitlines()[-1]


def test_pause_approve_with_the_cli_and_resume_in_three_processes(tmp_path: Path) -> None:
    """Paused in one process, approved by `effectgate approve` in another, resumed in a third: one refund."""
    env = _env(tmp_path)
    db = env["EG_TEST_DB"]
    paused = _process("pause", env)
    [payload] = paused["interrupts"]
    [request] = payload["requests"]
    assert paused["refunds_here"] == 0
    token = _cli_approve(env, request)
    resumed = _process("resume", env, "--approval", request["approval_id"], "--token", token)
    assert resumed["interrupts"] == []
    assert resumed["tool_results"] == ["success"]
    assert resumed["refunds_here"] == 1
    again = _process("resume", env, "--approval", request["approval_id"], "--token", token)
    assert again["refunds_here"] == 0
    store = open_store(db)
    try:
        executions = store.executions()
        assert [(e.tool, e.status, e.approval_id) for e in executions] == [
            ("refund_order", "succeeded", request["approval_id"])
        ]
        row = store.get_approval(request["approval_id"])
        assert row is not None
        assert row.status == "executed"
    finally:
        store.close()


def test_checkpoint_edited_after_approval_is_refused_by_the_resuming_process(tmp_path: Path) -> None:
    """A checkpoint file whose paused refund was edited after approval refunds nothing when a fresh
    process resumes it: the approve is refused, the payload names the mismatch (deny only), and a
    deny from another process closes the call as denied."""
    env = _env(tmp_path)
    [payload] = _process("pause", env)["interrupts"]
    [request] = payload["requests"]
    token = _cli_approve(env, request)
    assert _process("tamper", env, "--amount", "1") == {"tampered": {"amount": 1}}

    refused = _process("resume", env, "--approval", request["approval_id"], "--token", token)
    assert refused["refunds_here"] == 0
    assert refused["tool_results"] == []
    [again] = refused["interrupts"]
    [waiting] = again["requests"]
    assert (waiting["approval_id"], waiting["version"], waiting["args_hash"]) == (
        request["approval_id"],
        request["version"],
        request["args_hash"],
    )
    assert waiting["mismatch"]
    assert waiting["allowed_decisions"] == ["deny"]
    assert waiting["call_args_hash"] != request["call_args_hash"]
    [refusal] = again["refused"]  # the approve arrived and was refused (not only the step's note)
    assert refusal["approval_id"] == request["approval_id"]
    assert refusal["reason"] != waiting["mismatch"]
    assert again["signature"] != payload["signature"]

    denied = _process("resume", env, "--approval", request["approval_id"], "--deny", "changed after approval")
    assert (denied["interrupts"], denied["tool_results"], denied["refunds_here"]) == ([], ["error"], 0)
    store = open_store(env["EG_TEST_DB"])
    try:
        assert store.executions() == []
        row = store.get_approval(request["approval_id"])
        assert row is not None
        assert (row.status, row.version) == ("denied", 1)
    finally:
        store.close()


def _approved_refund(lg_harness: MakeLangGraphHarness, shop_gate: ShopGate, *later: Any) -> Any:
    h = lg_harness(Script([call("refund_order", id="call-1", **REFUND), say("Refunded."), *later]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    h.approve(paused, grant(shop_gate.gate, paused))
    assert shop_gate.shop.receiver.count("refund") == 1
    return h


def test_replay_from_the_paused_checkpoint_does_not_refund_again(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """Re-running the tools step from the checkpoint it paused at serves the stored result, no pause."""
    h = _approved_refund(lg_harness, shop_gate, say("Refunded, as I said."))
    [before_tools] = [s for s in h.graph.get_state_history(h.config) if s.next == ("tools",)]
    replay = h.invoke(None, before_tools.config)
    assert replay.paused == ()
    assert [(r.tool, r.ok) for r in replay.results] == [("refund_order", True)]
    assert shop_gate.shop.receiver.count("refund") == 1
    assert len(shop_gate.store.executions()) == 1
    h.script.assert_complete()


def test_fork_before_the_model_step_does_not_refund_again(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate
) -> None:
    """A fork re-running the model, which calls the refund again under a new call id, refunds nothing."""
    h = _approved_refund(lg_harness, shop_gate, call("refund_order", id="call-2", **REFUND), say("Done."))
    history = list(h.graph.get_state_history(h.config))
    first_model_step = [s for s in history if s.next == ("agent",)][-1]
    fork = h.graph.update_state(first_model_step.config, None)
    turn = h.invoke(None, fork)
    assert turn.paused == ()
    assert [(r.tool, r.ok) for r in turn.results] == [("refund_order", True)]
    assert [c["id"] for m in h.ai_messages() for c in m.tool_calls] == ["call-2"]
    assert shop_gate.shop.receiver.count("refund") == 1
    assert len(shop_gate.store.executions()) == 1
    assert len(shop_gate.store.approvals()) == 1
    h.script.assert_complete()


@pytest.mark.parametrize("answered", [False, True])
def test_fork_of_a_paused_thread_finds_the_same_approval(
    lg_harness: MakeLangGraphHarness, shop_gate: ShopGate, answered: bool
) -> None:
    """Forking the paused step re-registers nothing: the fork's pause names the same approval."""
    h = lg_harness(Script([call("refund_order", **REFUND)]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    [at_tools] = [s for s in h.graph.get_state_history(h.config) if s.next == ("tools",)]
    if answered:
        grant(shop_gate.gate, paused)
    fork = h.invoke(None, h.graph.update_state(at_tools.config, None))
    assert [(p.approval_id, p.version) for p in fork.paused] == [(paused.approval_id, 1)]
    assert len(shop_gate.store.approvals()) == 1
    assert shop_gate.shop.receiver.count("refund") == 0
