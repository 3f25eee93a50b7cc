"""Review round 11 of the smolagents adapter. Each test reproduced a defect before its fix; effects
are counted at the receiver (a counter in the tool)."""

from __future__ import annotations

from typing import Any

import pytest
from smolagents import CodeAgent
from smolagents.local_python_executor import CodeOutput
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import RemotePythonExecutor

from effectgate.adapter import UnknownTool
from effectgate.testing import Script, call, say, step
from effectgate_smolagents import Finished, GatedAgent, table_tools
from effectgate_smolagents.testing import ScriptedCodeModel, ScriptedModel
from tests.conformance.adapters import REFUND, ShopGate

from ._harness import support_agent


def test_a_reused_call_id_keeps_the_bad_argument_error_in_the_observations(shop_gate: ShopGate) -> None:
    """The model answers two tool calls under one id (some providers number ids per response):
    a refund and a `get_order` missing its argument. smolagents runs only the last call under an
    id, so the step has one call and its bad argument is raised as the step's error, which the
    model reads. `Finished.observations` (what the model was given, per call) must hold it, as
    for any step with one call; before the fix the adapter counted the step's announced calls
    (two), not the calls smolagents ran, and the error was missing from the record."""
    script = Script([step(call("refund_order", id="c1", **REFUND), call("get_order", id="c1")), say("Done.")])
    gated = support_agent(shop_gate.gate, ScriptedModel(script))
    out = gated.run("Refund order 1042", session_id="s-ada", origin_message_id="m3", user_id="u1")
    assert isinstance(out, Finished)
    assert [name for name, _ in out.observations] == ["get_order"]
    assert "order_id" in out.observations[0][1]
    assert shop_gate.shop.receiver.count("refund") == 0
    assert shop_gate.shop.receiver.count("get_order") == 0


class Sandbox(RemotePythonExecutor):
    """A remote sandbox (E2B, Docker, Modal, Blaxel) as smolagents drives one, run in a namespace
    of its own here: the code it is sent, tool definitions included, runs there."""

    def __init__(self) -> None:
        self.logger = AgentLogger(level=LogLevel.OFF)
        self.installed_packages: list[str] = []
        self.additional_imports: list[str] = []
        self.allow_pickle = False
        self.sent: list[str] = []

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        self.sent.append(code)
        return CodeOutput(output=None, logs="", is_final_answer=False)

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        return additional_imports


def test_a_code_agent_in_a_remote_sandbox_is_refused_when_it_is_wrapped(shop_gate: ShopGate) -> None:
    """A CodeAgent whose code runs in a remote sandbox, its imports acknowledged
    (`allow_imports="*"`). smolagents defines the agent's tools inside the sandbox from their
    source, which a gated tool cannot be (its call goes through the gate in this process): every
    run failed at its start with smolagents' raw `ValueError: Tool validation failed for
    GatedTool` after the task was already logged and put in memory. The wrap must refuse it,
    naming why (`UnknownTool`), before anything is sent to the sandbox."""
    sandbox = Sandbox()
    model = ScriptedCodeModel(['refund_order(order_id="1042", amount=500)', 'final_answer("ok")'])
    tools: list[Any] = table_tools(shop_gate.gate, agent_id="support")
    agent = CodeAgent(tools=tools, model=model, executor=sandbox, verbosity_level=LogLevel.OFF)
    with pytest.raises(UnknownTool, match="Sandbox"):
        GatedAgent(agent, shop_gate.gate, agent_id="support", allow_imports="*")
    assert sandbox.sent == []
    assert shop_gate.shop.receiver.count("refund") == 0
