"""Tools the user already has, gated by naming their effects: `GatedAgent(agent, effects=...)`.

The tools are plain smolagents tools (a `@tool` function and a class-based `Tool` with
`forward(self, ...)`); no `ToolSpec` is written. Effects are counted at a receiver inside the
tools, and every gate keeps its database in the test's tmp directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from smolagents import CodeAgent, Tool, ToolCallingAgent, tool
from smolagents.agents import MultiStepAgent
from smolagents.models import ChatMessage, get_tool_json_schema
from smolagents.monitoring import LogLevel

from effectgate import Approver, EffectGate, Executed, Grant, money, read, write
from effectgate.errors import TableError
from effectgate.testing import EffectRecorder, Script, call, say
from effectgate_smolagents import (
    Approve,
    AwaitingApproval,
    Finished,
    GatedAgent,
    GatedTool,
    native_tool,
    native_tools,
)
from effectgate_smolagents.testing import ScriptedModel

FINANCE = Approver("fiona", "finance")
REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
EFFECTS = {"get_order": read(), "refund_order": money("finance", subject="order_id")}


class RefundTool(Tool):
    """A class-based tool: `forward(self, ...)`, a client made in `setup()`, a receiver."""

    name = "refund_order"
    description = "Refund an order, in minor units of its currency."
    inputs = {  # noqa: RUF012 - smolagents documents a Tool's inputs as a class attribute
        "order_id": {"type": "string", "description": "The order to refund."},
        "amount": {"type": "integer", "description": "How much, in minor units."},
        "currency": {"type": "string", "description": "ISO currency code."},
    }
    output_type = "string"

    def __init__(self, receiver: EffectRecorder) -> None:
        super().__init__()
        self.receiver = receiver
        self.setups = 0

    def setup(self) -> None:
        self.setups += 1
        self.is_initialized = True

    def forward(self, order_id: str, amount: int, currency: str) -> str:
        self.receiver.record("refund", order_id=order_id, amount=amount, currency=currency)
        return f"refunded {amount} {currency} on {order_id}"


def order_tool(receiver: EffectRecorder) -> Tool:
    """A `@tool` function that counts its reads at the receiver."""

    @tool
    def get_order(order_id: str) -> dict[str, Any]:
        """Look up an order's status and total.

        Args:
            order_id: The order to look up.
        """
        receiver.record("read_order", order_id=order_id)
        return {"order_id": order_id, "status": "delivered", "total": 12000}

    return get_order


class Seen(ScriptedModel):
    """The scripted model, keeping the tool list each call offered it (what a real API is sent)."""

    def __init__(self, script: Script) -> None:
        super().__init__(script)
        self.offered: list[list[Any]] = []

    def generate(
        self,
        messages: list[ChatMessage | dict[str, Any]],
        stop_sequences: list[str] | None = None,
        response_format: dict[str, str] | None = None,
        tools_to_call_from: list[Any] | None = None,
        **kwargs: Any,
    ) -> ChatMessage:
        if tools_to_call_from is not None:
            self.offered.append(list(tools_to_call_from))
        return super().generate(messages, stop_sequences, response_format, tools_to_call_from, **kwargs)


def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/effectgate.db"


def make_agent(kind: str, tools: list[Tool], model: ScriptedModel) -> MultiStepAgent:
    cls = CodeAgent if kind == "code" else ToolCallingAgent
    return cls(tools=tools, model=model, verbosity_level=LogLevel.OFF, max_steps=6)


def ask(support: GatedAgent, text: str) -> Finished | AwaitingApproval:
    """One user message (m3 of session s-ada, user u1) to the gated agent."""
    return support.run(text, session_id="s-ada", origin_message_id="m3", user_id="u1")


def approve_all(gate: EffectGate, out: AwaitingApproval) -> dict[str, Approve]:
    decisions = {}
    for p in out.pending:
        grant = gate.approve(p.approval_id, version=p.version, approver=FINANCE)
        assert isinstance(grant, Grant)
        decisions[p.approval_id] = Approve(grant)
    return decisions


@pytest.mark.parametrize("kind", ["tool_calling", "code"])
def test_three_lines_gate_the_users_own_tools(kind: str, tmp_path: Path) -> None:
    """With rows named next to its own tools, a read runs, a refund pauses, and approve + resume runs
    it exactly once."""
    receiver = EffectRecorder()
    refund = RefundTool(receiver)
    model = ScriptedModel(
        Script([call("get_order", order_id="1042"), call("refund_order", **REFUND), say("Refunded.")])
    )
    agent = make_agent(kind, [order_tool(receiver), refund], model)
    with GatedAgent(agent, effects=EFFECTS, db=db(tmp_path)) as support:
        out = ask(support, "Please refund order 1042")
        assert isinstance(out, AwaitingApproval)
        assert receiver.count("read_order", order_id="1042") == 1
        assert receiver.count("refund") == 0
        [pending] = out.pending
        assert (pending.card.tool, pending.card.approver_role) == ("refund_order", "finance")
        assert pending.card.subject == {"order_id": "1042"}

        done = support.resume(out, approve_all(support.gate, out))
        assert isinstance(done, Finished)
        assert done.output == "Refunded."
        [(_, outcome)] = done.decided
        assert isinstance(outcome, Executed)
        assert receiver.count("refund", **REFUND) == 1
        assert receiver.count("read_order") == 1
        assert refund.setups == 1
        model.assert_complete()
    assert (tmp_path / "effectgate.db").exists()


def test_the_model_is_shown_each_tools_own_inputs(tmp_path: Path) -> None:
    """A ToolCallingAgent's model is offered each tool's own inputs (no `self`), and the gate validates
    against the same schema."""
    receiver = EffectRecorder()
    model = Seen(Script([say("Nothing to do.")]))
    agent = make_agent("tool_calling", [order_tool(receiver), RefundTool(receiver)], model)
    with GatedAgent(agent, effects=EFFECTS, db=db(tmp_path)) as support:
        assert isinstance(ask(support, "Hello"), Finished)
        [offered] = model.offered
        params = {
            s["function"]["name"]: s["function"]["parameters"] for s in map(get_tool_json_schema, offered)
        }
        assert list(params["refund_order"]["properties"]) == ["order_id", "amount", "currency"]
        assert params["refund_order"]["required"] == ["order_id", "amount", "currency"]
        assert list(params["get_order"]["properties"]) == ["order_id"]
        for name in ("get_order", "refund_order"):
            spec = support.gate.table.get(name)
            assert spec is not None
            assert spec.schema is not None
            assert list(spec.schema["properties"]) == list(params[name]["properties"])
            assert "self" not in json.dumps(params[name]) + json.dumps(dict(spec.schema))
        model.assert_complete()


def test_a_code_agent_is_shown_each_tools_own_signature(tmp_path: Path) -> None:
    """A CodeAgent's prompt presents the class-based tool with its own arguments, not `self`."""
    receiver = EffectRecorder()
    model = ScriptedModel(Script([say("Nothing to do.")]))
    agent = make_agent("code", [order_tool(receiver), RefundTool(receiver)], model)
    with GatedAgent(agent, effects=EFFECTS, db=db(tmp_path)) as support:
        assert isinstance(ask(support, "Hello"), Finished)
        prompt = json.dumps([m.dict() if isinstance(m, ChatMessage) else m for m in model.script.seen[0]])
        assert "def refund_order(order_id: string, amount: integer, currency: string)" in prompt
        assert "def get_order(order_id: string)" in prompt
        assert "self" not in prompt.split("def refund_order(", 1)[1].split(")", 1)[0]


def test_a_bad_argument_is_refused_by_the_tools_own_schema(tmp_path: Path) -> None:
    """An argument the tool's inputs do not allow (wrong type, or unknown) never reaches approval."""
    receiver = EffectRecorder()
    model = ScriptedModel(
        Script(
            [
                call("refund_order", order_id="1042", amount="lots", currency="GBP"),
                call("refund_order", **REFUND, note="urgent"),
                say("I could not refund it."),
            ]
        )
    )
    agent = make_agent("tool_calling", [order_tool(receiver), RefundTool(receiver)], model)
    with GatedAgent(agent, effects=EFFECTS, db=db(tmp_path)) as support:
        out = ask(support, "Refund 1042")
        assert isinstance(out, Finished)
        assert [name for name, _ in out.observations] == ["refund_order", "refund_order"]
        assert all(text.startswith("Invalid arguments") for _, text in out.observations)
        assert support.gate.store.approvals() == []
        assert [e.tool for e in support.gate.store.events(kind="invalid")] == ["refund_order"] * 2
        assert receiver.effects == []


def test_a_tool_without_a_row_is_refused(tmp_path: Path) -> None:
    """A tool with no effect row is a TableError: nothing is wrapped and no database is made."""
    receiver = EffectRecorder()
    agent = make_agent(
        "tool_calling", [order_tool(receiver), RefundTool(receiver)], ScriptedModel(Script([]))
    )
    with pytest.raises(TableError, match="no effect row for 'refund_order'"):
        GatedAgent(agent, effects={"get_order": read()}, db=db(tmp_path))
    assert not any(isinstance(t, GatedTool) for t in agent.tools.values())
    assert not (tmp_path / "effectgate.db").exists()


def test_a_row_without_a_tool_is_refused(tmp_path: Path) -> None:
    """A row naming a tool the agent does not have (a typo) is a TableError."""
    receiver = EffectRecorder()
    agent = make_agent("code", [order_tool(receiver)], ScriptedModel(Script([])))
    with pytest.raises(TableError, match="names no tool"):
        GatedAgent(agent, effects={"get_order": read(), "refund_ordr": write()}, db=db(tmp_path))
    assert not any(isinstance(t, GatedTool) for t in agent.tools.values())


def test_the_gate_is_built_for_the_default_agent_id(tmp_path: Path) -> None:
    """Without an agent_id the table allows exactly the agent's tools to the agent "agent"."""
    receiver = EffectRecorder()
    agent = make_agent(
        "tool_calling", [order_tool(receiver), RefundTool(receiver)], ScriptedModel(Script([]))
    )
    with GatedAgent(agent, effects=EFFECTS, db=db(tmp_path)) as support:
        assert support.agent_id == "agent"
        assert sorted(s.name for s in support.gate.table) == ["get_order", "refund_order"]
        assert support.gate.table.allowed("agent", "refund_order")
        assert "final_answer" not in {s.name for s in support.gate.table}


def test_a_gate_and_effects_together_are_refused(tmp_path: Path) -> None:
    """One source for the table: a gate, or effects (with db), never both, and not neither."""
    receiver = EffectRecorder()
    model = ScriptedModel(Script([]))
    with GatedAgent(
        make_agent("tool_calling", [order_tool(receiver)], model),
        effects={"get_order": read()},
        db=db(tmp_path),
    ) as first:
        other = make_agent("tool_calling", [order_tool(receiver)], model)
        with pytest.raises(TypeError, match="not both"):
            GatedAgent(other, first.gate, effects={"get_order": read()}, agent_id="agent")
        with pytest.raises(TypeError, match="not both"):
            GatedAgent(other, first.gate, agent_id="agent", db=db(tmp_path))
        with pytest.raises(TypeError, match="effects="):
            GatedAgent(other)
        with pytest.raises(ValueError, match="agent_id"):
            GatedAgent(other, first.gate)


def test_an_agent_already_gated_is_refused(tmp_path: Path) -> None:
    """Gating an agent twice would put the first gate inside the second: refused."""
    receiver = EffectRecorder()
    agent = make_agent("tool_calling", [order_tool(receiver)], ScriptedModel(Script([])))
    with (
        GatedAgent(agent, effects={"get_order": read()}, db=db(tmp_path)),
        pytest.raises(TypeError, match="already gated"),
    ):
        native_tools(agent)


def test_the_wrapped_tool_is_kept_out_of_the_agents_reach(tmp_path: Path) -> None:
    """The agent holds only GatedTools whose attributes lead neither to the user's tool nor the gate."""
    receiver = EffectRecorder()
    refund = RefundTool(receiver)
    agent = make_agent("code", [order_tool(receiver), refund], ScriptedModel(Script([])))
    with GatedAgent(agent, effects=EFFECTS, db=db(tmp_path)) as support:
        gated = agent.tools["refund_order"]
        assert isinstance(gated, GatedTool)
        reachable = list(vars(gated).values())
        assert refund not in reachable
        assert support not in reachable
        assert support.gate not in reachable
        assert not any(isinstance(v, Tool | EffectGate | GatedAgent) for v in reachable)


def test_native_tool_reads_smolagents_inputs_as_json_schema() -> None:
    """Each smolagents input type becomes its JSON schema; nullable inputs are optional and may be null,
    `any` allows any value, and no other argument is accepted."""

    class Everything(Tool):
        name = "everything"
        description = "Takes every kind of input."
        inputs = {  # noqa: RUF012 - as smolagents documents it
            "text": {"type": "string", "description": "t"},
            "count": {"type": "integer", "description": "c"},
            "ratio": {"type": "number", "description": "r", "nullable": True},
            "flag": {"type": "boolean", "description": "f"},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "a"},
            "extra": {"type": "object", "description": "o", "nullable": True},
            "anything": {"type": "any", "description": "x", "nullable": True},
            "mode": {"type": "string", "enum": ["fast", "slow"], "description": "m", "nullable": True},
            "either": {"type": ["integer", "string"], "description": "e"},
        }
        output_type = "string"

        def forward(
            self,
            text: str,
            count: int,
            flag: bool,
            tags: list[str],
            either: int | str,
            ratio: float | None = None,
            extra: dict[str, Any] | None = None,
            anything: Any | None = None,
            mode: str | None = None,
        ) -> str:
            return "ok"

    native = native_tool(Everything())
    assert (native.name, native.description) == ("everything", "Takes every kind of input.")
    schema = dict(native.schema)
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["text", "count", "flag", "tags", "either"]
    props = schema["properties"]
    assert props["text"] == {"type": "string", "description": "t"}
    assert props["ratio"] == {"type": ["number", "null"], "description": "r"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "description": "a"}
    assert props["anything"] == {"description": "x"}
    assert props["mode"] == {"type": ["string", "null"], "enum": ["fast", "slow", None], "description": "m"}
    assert props["either"] == {"type": ["integer", "string"], "description": "e"}
    assert native.fn(text="a", count=1, flag=True, tags=[], either=2) == "ok"


def test_native_tool_refuses_image_and_audio_inputs() -> None:
    """An image or audio input is refused: the gate hashes, stores and shows arguments as JSON."""

    class Caption(Tool):
        name = "caption"
        description = "Caption a picture."
        inputs = {"picture": {"type": "image", "description": "p"}}  # noqa: RUF012
        output_type = "string"

        def forward(self, picture: Any) -> str:
            return "a cat"

    with pytest.raises(TableError, match="'image'"):
        native_tool(Caption())


def test_native_tool_runs_setup_once_and_lazily() -> None:
    """The tool's `setup()` runs on its first call through the gate, not when it is read, and once."""
    refund = RefundTool(EffectRecorder())
    native = native_tool(refund)
    assert refund.setups == 0
    assert native.fn(**REFUND) == "refunded 12000 GBP on 1042"
    native.fn(**REFUND)
    assert refund.setups == 1
