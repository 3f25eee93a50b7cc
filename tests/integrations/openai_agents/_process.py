"""One process of the cross-process scenario: `python -m tests.integrations.openai_agents._process`.

    pause  --db URL --state FILE       runs "refund 1042" until it pauses; writes RunState.to_string()
    resume --db URL --state FILE --token T [--read ORDER]
                                       restores the snapshot, attaches the grant, approves, resumes
                                       (with --read, the model's next turn reads that order)

Each process builds its own shop, gate (keyring from $EFFECTGATE_KEYRING, as the CLI reads it),
scripted model and agent, so nothing but the database, the snapshot file and the environment is
shared. Prints one JSON line: what this process saw, how many refunds its own provider made and
how many order reads its own shop served, or the name of the error that refused the resume.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from agents import Runner, RunState, set_tracing_disabled

from effectgate import Keyring, open_store
from effectgate.adapter import DecisionMismatch, TamperedState
from effectgate.examples.shop import app
from effectgate.testing import Script, call, say
from effectgate_openai_agents import approve, pending_approvals
from effectgate_openai_agents.testing import ScriptedModel
from tests.conformance.adapters import CountingShop

from ._harness import context, support_agent, tool_results

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}


async def run(args: argparse.Namespace) -> dict[str, object]:
    keyring = Keyring.from_env()
    assert keyring is not None, "EFFECTGATE_KEYRING must be set"
    shop = CountingShop()
    store = open_store(args.db)
    store.setup()
    gate = app(store, keyring=keyring, shop=shop)
    state_file = Path(args.state)
    try:
        if args.command == "pause":
            script = Script([call("refund_order", id="call-refund", **REFUND)])
            agent = support_agent(gate, ScriptedModel(script))
            result = await Runner.run(agent, "Please refund order 1042", context=context("m3"))
            state_file.write_text(result.to_state().to_string())
            paused = [p.__dict__ | {"item": None} for p in pending_approvals(result)]
        else:
            turns = [call("get_order", order_id=args.read)] if args.read else []
            script = Script([*turns, say("Refunded.")])
            agent = support_agent(gate, ScriptedModel(script))
            state = await RunState.from_string(agent, state_file.read_text())
            try:
                [waiting] = pending_approvals(state)
                approve(state, waiting, args.token)
                result = await Runner.run(agent, state)
            except (TamperedState, DecisionMismatch) as exc:
                return {
                    "refused": type(exc).__name__,
                    "refunds_here": shop.receiver.count("refund"),
                    "reads_here": shop.reads["get_order"],
                }
            paused = []
        script.assert_complete()
        return {
            "paused": paused,
            "results": [r.result.__dict__ for r in tool_results(result)],
            "final_output": result.final_output,
            "refunds_here": shop.receiver.count("refund"),
            "reads_here": shop.reads["get_order"],
        }
    finally:
        gate.close()
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["pause", "resume"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--token")
    parser.add_argument("--read")
    set_tracing_disabled(True)
    print(json.dumps(asyncio.run(run(parser.parse_args(argv)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
