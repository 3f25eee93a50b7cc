"""One process of the cross-process scenario: `python -m tests.integrations.langgraph._process`.

    pause  --db URL --checkpoints FILE   runs "refund 1042" until it pauses; prints the payload
    resume --db URL --checkpoints FILE --token T --approval ID
                                         resumes the paused thread from the checkpoint file

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

from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver

from effectgate import Keyring, open_store
from effectgate.examples.shop import Shop, app
from effectgate.testing import Script, call, say
from effectgate_langgraph import approve, resume
from effectgate_langgraph.testing import ScriptedChatModel

from ._graph import shop_graph

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
CONFIG = {"configurable": {"thread_id": "s-ada"}}
CONTEXT = {"user_id": "u1"}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["pause", "resume"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--checkpoints", required=True)
    parser.add_argument("--token")
    parser.add_argument("--approval")
    args = parser.parse_args(argv)
    keyring = Keyring.from_env()
    assert keyring is not None, "EFFECTGATE_KEYRING must be set"
    shop = Shop()
    store = open_store(args.db)
    store.setup()
    gate = app(store, keyring=keyring, shop=shop)
    conn = sqlite3.connect(args.checkpoints, check_same_thread=False)
    checkpointer = SqliteSaver(conn)
    if args.command == "pause":
        script = Script([call("refund_order", id="call-refund", **REFUND)])
        value: object = {"messages": [HumanMessage("Please refund order 1042", id="m3")]}
    else:
        # The pending interrupt, read from the checkpoint file; once none is left, the same
        # answer sent again (a client retry) must change nothing and ask the model nothing.
        decisions = {args.approval: approve(args.token)}
        model = ScriptedChatModel(script=Script([]))
        pending = shop_graph(gate, model, checkpointer=checkpointer).get_state(CONFIG).interrupts
        script = Script([say("Refunded.")] if pending else [])
        value = resume(decisions, pending[0]) if pending else resume(decisions)
    graph = shop_graph(gate, ScriptedChatModel(script=script), checkpointer=checkpointer)
    out = graph.invoke(value, CONFIG, context=CONTEXT, version="v2")
    script.assert_complete()
    print(
        json.dumps(
            {
                "interrupts": [i.value for i in out.interrupts],
                "tool_results": [m.status for m in out.value["messages"] if isinstance(m, ToolMessage)],
                "refunds_here": shop.receiver.count("refund"),
            }
        )
    )
    gate.close()
    store.close()
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
