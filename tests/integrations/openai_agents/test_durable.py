"""Durable RunState: pause in one process, approve with the CLI, resume in another; replays and tampering."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, RunState, function_tool
from agents._tool_invocation import tool_invocation_identity
from agents.exceptions import ModelBehaviorError

from effectgate import Approver, Keyring, open_store
from effectgate.testing import Script, call, say
from effectgate_openai_agents import approve, pending_approvals
from effectgate_openai_agents.testing import ScriptedModel
from tests._helpers import last_json_line, run_checked, run_module
from tests.conformance.adapters import REFUND, ShopGate, grant

from ._harness import tool_results
from ._snapshots import EDITS, tampered
from .conftest import MakeOpenAIHarness


def _process(command: str, env: dict[str, str], *extra: str) -> dict[str, Any]:
    return last_json_line(
        run_module(
            "tests.integrations.openai_agents._process",
            command,
            "--db",
            env["EG_TEST_DB"],
            "--state",
            env["EG_TEST_STATE"],
            *extra,
            env=env,
        )
    )


def _env(tmp_path: Path) -> dict[str, str]:
    """What every process of one scenario shares: the database, the snapshot file, the keyring."""
    env = {
        **os.environ,
        "EFFECTGATE_KEYRING": Keyring.generate().dumps(),
        "EG_TEST_DB": f"sqlite:///{tmp_path}/effectgate.db",
        "EG_TEST_STATE": str(tmp_path / "state.json"),
    }
    env.pop("EFFECTGATE_APP", None)
    return env


def _cli_approve(env: dict[str, str], request: dict[str, Any]) -> str:
    """`effectgate approve` as finance, in its own process; its last line is the grant token."""
    cli = Path(sys.executable).with_name("effectgate")
    approved = run_checked(
        [
            str(cli),
            *("--db", env["EG_TEST_DB"], "--app", "effectgate.examples.shop:app"),
            *("approve", request["approval_id"], "--version", str(request["version"])),
            *("--as", "finance", "--approver", "fiona"),
        ],
        env,
    )
    return approved.strip().splitlines()[-1]


def test_pause_approve_with_the_cli_and_resume_in_another_process(tmp_path: Path) -> None:
    """to_string() in one process, `effectgate approve` in a second, resume in a third: one refund."""
    env = _env(tmp_path)
    db = env["EG_TEST_DB"]
    paused = _process("pause", env)
    [request] = paused["paused"]
    assert (request["tool"], paused["refunds_here"]) == ("refund_order", 0)
    token = _cli_approve(env, request)
    resumed = _process("resume", env, "--token", token)
    assert [(r["tool"], r["ok"]) for r in resumed["results"]] == [("refund_order", True)]
    assert resumed["refunds_here"] == 1
    again = _process("resume", env, "--token", token)  # the same paused snapshot, a second time
    assert again["refunds_here"] == 0
    assert [(r["tool"], r["ok"]) for r in again["results"]] == [("refund_order", True)]
    store = open_store(db)
    try:
        assert [(e.tool, e.status, e.approval_id) for e in store.executions()] == [
            ("refund_order", "succeeded", request["approval_id"])
        ]
        row = store.get_approval(request["approval_id"])
        assert row is not None
        assert row.status == "executed"
    finally:
        store.close()


def test_a_snapshot_tampered_between_processes_is_refused(tmp_path: Path) -> None:
    """Paused in one process, approved with the CLI, the stored snapshot's user_id edited to u2,
    resumed in another process whose next turn would read u2's order 2001: refused with
    TamperedState, nothing refunded or read there, the grant unspent; the original snapshot then
    resumes in a fourth process and refunds once. (Every other edit: test_tampering.)"""
    env = _env(tmp_path)
    [request] = _process("pause", env)["paused"]
    token = _cli_approve(env, request)
    state_file = Path(env["EG_TEST_STATE"])
    original = state_file.read_text()
    state_file.write_text(tampered(original, EDITS["user_id"]))
    refused = _process("resume", env, "--token", token, "--read", "2001")
    assert refused == {"refused": "TamperedState", "refunds_here": 0, "reads_here": 0}
    store = open_store(env["EG_TEST_DB"])
    try:
        assert store.executions() == []
        row = store.get_approval(request["approval_id"])
        assert row is not None
        assert (row.status, row.token_used_at) == ("approved", None)
    finally:
        store.close()
    state_file.write_text(original)
    resumed = _process("resume", env, "--token", token)
    assert [(r["tool"], r["ok"]) for r in resumed["results"]] == [("refund_order", True)]
    assert resumed["refunds_here"] == 1


def _approved_snapshot(oa_harness: MakeOpenAIHarness, shop_gate: ShopGate, *later: Any) -> tuple[Any, str]:
    """A harness paused on the refund, and the snapshot string taken after approving it."""
    h = oa_harness(Script([call("refund_order", **REFUND), *later]))
    [paused] = h.send("Please refund order 1042", message_id="m3").paused
    state = h.restore()
    [waiting] = pending_approvals(state)
    approve(state, waiting, grant(shop_gate.gate, paused))
    return h, state.to_string()


def test_resuming_one_approved_snapshot_twice_executes_once(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate
) -> None:
    """Two restores of the same approved snapshot: the second gets the stored result, no second refund."""
    h, approved = _approved_snapshot(oa_harness, shop_gate, say("Refunded."), say("Refunded again?"))
    outputs = []
    for _ in range(2):
        h.resume(asyncio.run(RunState.from_string(h.agent, approved)))
        assert h.last is not None
        outputs.append([o.result for o in tool_results(h.last)])
    first, second = outputs
    assert [(r.tool, r.ok) for r in first] == [("refund_order", True)]
    assert second == first  # the stored result, word for word
    assert shop_gate.shop.receiver.count("refund") == 1
    assert [e.status for e in shop_gate.store.executions()] == ["succeeded"]
    assert shop_gate.gate.audit().clean
    h.script.assert_complete()


def test_the_sdk_alone_executes_an_approved_snapshot_twice() -> None:
    """The hazard the gate removes: without effectgate, two resumes of one approved snapshot run twice."""
    runs: list[int] = []

    @function_tool(needs_approval=True)
    def refund(amount: int) -> str:
        """Refund."""
        runs.append(amount)
        return "ok"

    model = ScriptedModel(Script([call("refund", amount=5), say("done"), say("done")]))
    agent = Agent(name="plain", model=model, tools=[refund])
    result = Runner.run_sync(agent, "refund 5")
    state = result.to_state()
    state.approve(state.get_interruptions()[0])
    snapshot = state.to_string()
    for _ in range(2):
        Runner.run_sync(agent, asyncio.run(RunState.from_string(agent, snapshot)))
    assert runs == [5, 5]


def _tamper(snapshot: str, old: str, new: str, *, refingerprint: bool) -> str:
    tampered = snapshot.replace(old.replace('"', '\\"'), new.replace('"', '\\"'))
    if refingerprint:
        data = json.loads(tampered)
        for item in data["generated_items"]:
            if item["type"] == "tool_call_item":
                _, call_id, fingerprint = tool_invocation_identity(item["raw_item"])  # type: ignore[misc]
                data["context"]["tool_invocations"][call_id]["fingerprint"] = fingerprint
        tampered = json.dumps(data)
    assert tampered != snapshot
    return tampered


@pytest.mark.parametrize("refingerprint", [False, True], ids=["args-only", "args-and-fingerprint"])
def test_a_tampered_snapshot_refunds_nothing(
    oa_harness: MakeOpenAIHarness, shop_gate: ShopGate, refingerprint: bool
) -> None:
    """Arguments raised in an approved snapshot (and its unkeyed fingerprint recomputed): no refund runs,
    the approval stays unexecuted, and the grant never moves to the new arguments."""
    h, approved = _approved_snapshot(oa_harness, shop_gate, say("Sorry."))
    tampered = _tamper(approved, '"amount":12000', '"amount":99000', refingerprint=refingerprint)
    try:
        turn = h.resume(asyncio.run(RunState.from_string(h.agent, tampered)))
    except ModelBehaviorError:
        assert not refingerprint  # the SDK's own check caught the plain edit
    else:
        assert [(r.tool, r.ok) for r in turn.results] == [("refund_order", False)]
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.store.executions() == []
    [original, *_] = shop_gate.store.approvals()
    assert (original.status, original.token_used_at) == ("approved", None)


def test_a_grant_of_another_approval_is_refused(oa_harness: MakeOpenAIHarness, shop_gate: ShopGate) -> None:
    """`approve()` will not attach a token minted for a different approval to this call."""
    h = oa_harness(Script([call("refund_order", **REFUND)]))
    h.send("Please refund order 1042", message_id="m3")
    other = oa_harness(Script([call("send_email", to=["ada@example.com"], subject="Hi", body="Refund soon")]))
    [elsewhere] = other.send("email me", message_id="m9").paused
    state = h.restore()
    [waiting] = pending_approvals(state)
    with pytest.raises(ValueError, match="not"):
        approve(state, waiting, grant(shop_gate.gate, elsewhere, Approver("sam", "support_lead")))
    assert state.get_interruptions()  # still pending in the SDK
    assert shop_gate.shop.receiver.count("refund") == 0
