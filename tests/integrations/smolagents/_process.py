"""One process of the cross-process continuation: `python -m tests.integrations.smolagents._process`.

    pause  --db URL --state DIR           runs "refund 1042" until it stops for approval; writes the
                                          signed memory and the AwaitingApproval record to DIR
    resume --db URL --state DIR --token T restores both, executes through the gate, continues
           [--awaiting FILE]              reads the AwaitingApproval record from FILE instead of
                                          DIR/awaiting.json (an edited copy, to prove it is refused)

Each process builds its own shop, gate (keyring from $EFFECTGATE_KEYRING) and agent. Prints one
JSON line: what this process saw and how many refunds its own provider made. A record that does
not verify ends the resume with exit code 3 (`TAMPERED`) and the line
`{"error": "TamperedState", "message": ..., "refunds_here": ...}`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from effectgate import Keyring, open_store
from effectgate.examples.shop import Shop, app
from effectgate.testing import Script, call, say
from effectgate_smolagents import Approve, AwaitingApproval, TamperedState, restore_memory, save_memory
from effectgate_smolagents.testing import ScriptedModel

from ._harness import support_agent

REFUND = {"order_id": "1042", "amount": 12000, "currency": "GBP"}
#: The exit code of a resume whose AwaitingApproval record was refused.
TAMPERED = 3


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["pause", "resume"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--token")
    parser.add_argument("--awaiting", help="the AwaitingApproval record (default: STATE/awaiting.json)")
    args = parser.parse_args(argv)
    keyring = Keyring.from_env()
    assert keyring is not None, "EFFECTGATE_KEYRING must be set"
    shop = Shop()
    store = open_store(args.db)
    store.setup()
    gate = app(store, keyring=keyring, shop=shop)
    state = Path(args.state)
    try:
        if args.command == "pause":
            script = Script([call("get_order", order_id="1042"), call("refund_order", **REFUND)])
            gated = support_agent(gate, ScriptedModel(script))
            out = gated.run(
                "Please refund order 1042", session_id="s-ada", origin_message_id="m3", user_id="u1"
            )
            assert isinstance(out, AwaitingApproval)
            blob = save_memory(gated.agent, keyring, session_id="s-ada", user_id="u1", awaiting=out)
            (state / "memory.bin").write_bytes(blob)
            (state / "awaiting.json").write_text(json.dumps(out.to_dict()))
            report = {"awaiting": out.to_dict(), "output": None}
        else:
            script = Script([say("Refunded 120.00 GBP.")])
            gated = support_agent(gate, ScriptedModel(script))
            record = Path(args.awaiting) if args.awaiting else state / "awaiting.json"
            try:
                awaiting = AwaitingApproval.from_dict(json.loads(record.read_text()), gate)
                memory = (state / "memory.bin").read_bytes()
                restore_memory(
                    gated.agent, memory, keyring, session_id="s-ada", user_id="u1", awaiting=awaiting
                )
                [approval_id] = awaiting.approval_ids
                out = gated.resume(awaiting, {approval_id: Approve(args.token)})
            except TamperedState as exc:
                refused = {"error": type(exc).__name__, "message": str(exc)}
                print(json.dumps({**refused, "refunds_here": shop.receiver.count("refund")}))
                return TAMPERED
            seen = script.seen[-1]
            report = {
                "output": getattr(out, "output", None),
                "decided": [type(o).__name__ for _, o in out.decided],
                "memory_kept": any("get_order" in str(m) for m in seen),
            }
        script.assert_complete()
        print(json.dumps({**report, "refunds_here": shop.receiver.count("refund")}))
    finally:
        gate.close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
