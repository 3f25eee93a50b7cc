"""One process of the cross-process scenario: `python -m tests.integrations.langgraph._process`.

    pause  --db URL --checkpoints FILE   runs "refund 1042" until it pauses; prints the payload
    resume --db URL --checkpoints FILE --approval ID (--token T | --deny REASON)
                                         resumes the paused thread from the checkpoint file
    tamper --db URL --checkpoints FILE --amount N
                                         edits the paused refund's amount in the checkpoint file
                                         (as an attacker with write access to it would)

Each run builds its own shop, gate (keyring from $EFFECTGATE_KEYRING, as the CLI reads it),
scripted model and SqliteSaver, so nothing but the two files and the environment is shared.
Prints one JSON line: what this process saw and how many refunds its own provider made.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver

from effectgate import EffectGate, Keyring, open_store
from effectgate.examples.shop import Shop, app
from effectgate.testing import Script, call, say
from effectgate_langgraph import approve, deny, resume
from effectgate_langgraph.testing import ScriptedChatModel

from ._graph import edit_paused_call, shop_graph

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
CONFIG: RunnableConfig = {"configurable": {"thread_id": "s-ada"}}
CONTEXT = {"user_id": "u1"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["pause", "resume", "tamper"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--checkpoints", required=True)
    parser.add_argument("--token")
    parser.add_argument("--approval")
    parser.add_argument("--deny")
    parser.add_argument("--amount", type=int)
    args = parser.parse_args(argv)
    keyring = Keyring.from_env()
    assert keyring is not None, "EFFECTGATE_KEYRING must be set"
    shop = Shop()
    store = open_store(args.db)
    store.setup()
    gate = app(store, keyring=keyring, shop=shop)
    conn = sqlite3.connect(args.checkpoints, check_same_thread=False)
    try:
        print(json.dumps(_run(args, gate, shop, SqliteSaver(conn))))
    finally:
        gate.close()
        store.close()
        conn.close()
    return 0


def _run(args: argparse.Namespace, gate: EffectGate, shop: Shop, checkpointer: SqliteSaver) -> dict[str, Any]:
    if args.command == "tamper":
        graph = shop_graph(gate, ScriptedChatModel(script=Script([])), checkpointer=checkpointer)
        edit_paused_call(graph, CONFIG, {"amount": args.amount})
        return {"tampered": {"amount": args.amount}}
    if args.command == "pause":
        script = Script([call("refund_order", id="call-refund", **REFUND)])
        value: object = {"messages": [HumanMessage("Please refund order 1042", id="m3")]}
    else:
        # The pending interrupt, read from the checkpoint file; once none is left, the same
        # answer sent again (a client retry) must change nothing and ask the model nothing. A
        # checkpoint edited since the pause has none pending either: its step runs anew.
        decisions = {args.approval: deny(args.deny) if args.deny else approve(args.token)}
        model = ScriptedChatModel(script=Script([]))
        pending = shop_graph(gate, model, checkpointer=checkpointer).get_state(CONFIG).interrupts
        script = Script([say("Done.")] if pending else [])
        value = resume(decisions, pending[0]) if pending else resume(decisions)
    graph = shop_graph(gate, ScriptedChatModel(script=script), checkpointer=checkpointer)
    out = graph.invoke(value, CONFIG, context=CONTEXT, version="v2")
    if args.command == "resume" and out.interrupts:
        assert not script.seen, "the model was asked while the step still waits"
    else:
        script.assert_complete()
    return {
        "interrupts": [i.value for i in out.interrupts],
        "tool_results": [m.status for m in out.value["messages"] if isinstance(m, ToolMessage)],
        "refunds_here": shop.receiver.count("refund"),
    }


if __name__ == "__main__":
    sys.exit(main())
