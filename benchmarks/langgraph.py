"""LangGraph: the gated node against a plain ToolNode, and an interrupt + resume round trip.

`python -m benchmarks.langgraph [--smoke] [--json FILE] [--dir DIR]`

(e) Per tool call: one model step with one read call through `GatedToolNode` (the gate validates,
    checks scope, runs the row's function and logs the read) against the same function as a
    `@tool` through a plain `ToolNode`. Both nodes are invoked the same way, outside a compiled
    graph, so the graph's own per-step cost (the same for both) is not in the ratio.
    Target: at most 1.10x.
(f) One approval round trip on a compiled graph with InMemorySaver: invoke until the pause, then
    resume. With effectgate: the gated node proposes a money call, `gate.approve` mints the grant,
    the resume executes it. Without: an `interrupt()` node before a plain ToolNode. No target: the
    difference is what exactly-once costs next to a person's latency.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt

from effectgate import Approver, Effect, EffectGate, EffectTable, Grant, Keyring, ToolSpec, open_store
from effectgate_langgraph import GatedToolNode, approve, resume

from . import _adapter
from ._timing import Plan, Stats, interleaved, paired_ratio

READ_RATIO_TARGET = 1.10
AGENT = "bench"
FULL = {"node": Plan(n=200, repeats=15, warmup=2), "roundtrip": Plan(n=20, repeats=11, warmup=1)}
SMOKE = {"node": Plan(n=20, repeats=3, warmup=1), "roundtrip": Plan(n=3, repeats=3, warmup=1)}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def pay(amount: int) -> dict[str, int]:
    """Pay an amount (a no-op provider)."""
    return {"paid": amount}


@tool("add")
def add_tool(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool("pay")
def pay_tool(amount: int) -> dict[str, int]:
    """Pay an amount (a no-op provider)."""
    return {"paid": amount}


@dataclass(frozen=True)
class LangGraphResult:
    plain_node: Stats
    gated_node: Stats
    plain_roundtrip: Stats
    gated_roundtrip: Stats

    @property
    def node_ratio(self) -> float:
        return paired_ratio(self.gated_node, self.plain_node)

    @property
    def roundtrip_ratio(self) -> float:
        return paired_ratio(self.gated_roundtrip, self.plain_roundtrip)


def _gate(directory: Path) -> EffectGate:
    store = open_store(f"sqlite:///{directory / 'langgraph.db'}")
    store.setup()
    table = EffectTable(
        [
            ToolSpec(name="add", effect=Effect.READ, fn=add),
            ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance"),
        ]
    )
    table.allow(AGENT, ["add", "pay"])
    return EffectGate(table, store, keyring=Keyring.generate())


def _step(name: str, args: dict[str, Any], message_id: str) -> dict[str, Any]:
    call = {"name": name, "args": args, "id": f"call-{message_id}", "type": "tool_call"}
    return {"messages": [HumanMessage("go", id=message_id), AIMessage("", tool_calls=[call])]}


def _node_blocks(gate: EffectGate) -> dict[str, Any]:
    config: Any = {
        "configurable": {"thread_id": "bench", "__pregel_runtime": Runtime(context={"user_id": "u1"})}
    }
    plain, gated = ToolNode([add_tool]), GatedToolNode(gate, agent_id=AGENT)
    step = _step("add", {"a": 1, "b": 2}, "m1")
    for node in (plain, gated):
        [message] = node.invoke(step, config)["messages"]
        if message.status != "success" or message.content != "3":
            raise RuntimeError(f"{type(node).__name__} did not run the read: {message!r}")

    def block(node: ToolNode, after: Callable[[], None] | None = None) -> Any:
        def run(n: int) -> int:
            invoke = node.invoke
            start = time.perf_counter_ns()
            for _ in range(n):
                invoke(step, config)
            if after is not None:
                after()
            return time.perf_counter_ns() - start

        return run

    # the gated block's read records are written inside its timer (as in (a))
    return {"plain_node": block(plain), "gated_node": block(gated, gate.flush)}


def _roundtrip_blocks(gate: EffectGate) -> dict[str, Any]:
    def ask(state: MessagesState) -> dict[str, Any]:
        interrupt({"tool": "pay"})
        return {}

    plain_builder = StateGraph(MessagesState)
    plain_builder.add_node("ask", ask)
    plain_builder.add_node("tools", ToolNode([pay_tool]))
    plain_builder.add_edge(START, "ask")
    plain_builder.add_edge("ask", "tools")
    plain = plain_builder.compile(checkpointer=InMemorySaver())
    gated_builder = StateGraph(MessagesState)
    gated_builder.add_node("tools", GatedToolNode(gate, agent_id=AGENT))
    gated_builder.add_edge(START, "tools")
    gated = gated_builder.compile(checkpointer=InMemorySaver())
    finance = Approver("fiona", "finance")
    context = {"user_id": "u1"}
    counter = iter(range(10**9))

    def run_plain(n: int) -> int:
        start = time.perf_counter_ns()
        for _ in range(n):
            i = next(counter)
            config: Any = {"configurable": {"thread_id": f"p{i}"}}
            plain.invoke(_step("pay", {"amount": i}, f"m{i}"), config, context=context, version="v2")
            out = plain.invoke(Command(resume="approve"), config, context=context, version="v2")
            if out.interrupts or not out.value["messages"][-1].content:
                raise RuntimeError("the plain round trip did not finish")
        return time.perf_counter_ns() - start

    def run_gated(n: int) -> int:
        start = time.perf_counter_ns()
        for _ in range(n):
            i = next(counter)
            config: Any = {"configurable": {"thread_id": f"g{i}"}}
            paused = gated.invoke(_step("pay", {"amount": i}, f"m{i}"), config, context=context, version="v2")
            [pending] = paused.interrupts
            [request] = pending.value["requests"]
            decision = gate.approve(request["approval_id"], version=request["version"], approver=finance)
            assert isinstance(decision, Grant)
            out = gated.invoke(
                resume({request["approval_id"]: approve(decision.token)}, pending),
                config,
                context=context,
                version="v2",
            )
            if out.interrupts or out.value["messages"][-1].status != "success":
                raise RuntimeError("the gated round trip did not execute the payment")
        return time.perf_counter_ns() - start

    return {"plain_roundtrip": run_plain, "gated_roundtrip": run_gated}


def run(directory: Path, plans: dict[str, Plan]) -> LangGraphResult:
    gate = _gate(directory)
    try:
        node = interleaved(_node_blocks(gate), plans["node"])
        roundtrip = interleaved(_roundtrip_blocks(gate), plans["roundtrip"])
    finally:
        gate.close()
        gate.store.close()
    return LangGraphResult(
        plain_node=node["plain_node"],
        gated_node=node["gated_node"],
        plain_roundtrip=roundtrip["plain_roundtrip"],
        gated_roundtrip=roundtrip["gated_roundtrip"],
    )


def report(result: LangGraphResult) -> tuple[list[str], bool]:
    """The lines to print, and whether the read-path target was met."""
    met = result.node_ratio <= READ_RATIO_TARGET
    rows = [
        ("(e) plain ToolNode, one read call", result.plain_node),
        ("(e) GatedToolNode, the same read through the gate", result.gated_node),
        ("(f) interrupt + resume, plain ToolNode", result.plain_roundtrip),
        ("(f) interrupt + approve + resume, effectgate", result.gated_roundtrip),
    ]
    lines = _adapter.rows(rows)
    lines += [
        f"ratio (e) langgraph read, GatedToolNode / ToolNode per call: {result.node_ratio:.2f}x "
        f"(target: <= {READ_RATIO_TARGET:.2f}x) {'met' if met else 'MISSED'}",
        f"ratio (f) langgraph interrupt + resume, with effectgate / without: {result.roundtrip_ratio:.2f}x "
        "(no target)",
    ]
    return lines, met


def to_json(result: LangGraphResult) -> dict[str, Any]:
    return {
        "cases": {
            "plain_node": result.plain_node.to_dict(),
            "gated_node": result.gated_node.to_dict(),
            "plain_roundtrip": result.plain_roundtrip.to_dict(),
            "gated_roundtrip": result.gated_roundtrip.to_dict(),
        },
        "ratios": {
            "node": {
                "ratio": result.node_ratio,
                "target": READ_RATIO_TARGET,
                "met": result.node_ratio <= READ_RATIO_TARGET,
            },
            "roundtrip": {"ratio": result.roundtrip_ratio, "target": None},
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    return _adapter.main(sys.modules[__name__], "LangGraph", argv)


if __name__ == "__main__":
    sys.exit(main())
