"""A newcomer's first hour, followed literally from the README (round 6).

Each test is a step the README tells a newcomer to take, done as they would do it: a file of
their own in the working directory, the installed `effectgate` command run from there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectgate import open_store
from effectgate.cli import main

# The user's own file, as the README's quick start and "A script's tools fingerprint as
# imported" describe it: tools, table and a factory for `--app`, run as a script to propose.
SHOP = textwrap.dedent(
    """
    import sys
    from typing import Any

    from effectgate import CallContext, Effect, EffectGate, EffectTable, Pending, ToolSpec, open_store


    def refund_order(order_id: str, amount: int) -> dict[str, Any]:
        return {"refund_id": "re_1", "order_id": order_id, "amount": amount}


    def factory(store: Any, *, keyring: Any = None) -> EffectGate:
        table = EffectTable(
            [ToolSpec(name="refund_order", effect=Effect.MONEY, fn=refund_order, approver_role="finance")]
        )
        table.allow("support", ["refund_order"])
        return EffectGate(table, store, keyring=keyring)


    if __name__ == "__main__":
        store = open_store(sys.argv[1])
        store.setup()
        with factory(store) as gate:
            ctx = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="support")
            out = gate.call("refund_order", {"order_id": "1042", "amount": 500}, ctx)
            assert isinstance(out, Pending), out
            print(out.approval_id)
        store.close()
    """
)

# The "three lines per framework" path (LangGraph), with a factory over the middleware's table.
LANGGRAPH_AGENT = textwrap.dedent(
    '''
    from dataclasses import dataclass
    from typing import Any

    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver

    from effectgate import EffectGate, money, read
    from effectgate.testing import Script, call, say
    from effectgate_langgraph import gated_middleware
    from effectgate_langgraph.testing import ScriptedChatModel


    @tool
    def get_order(order_id: str) -> str:
        """Look up an order."""
        return f"order {order_id}: delivered"


    @tool
    def refund_order(order_id: str, amount: int) -> str:
        """Refund part of an order, in pence."""
        return f"refunded {amount} on order {order_id}"


    @dataclass
    class User:
        user_id: str


    effects = {"get_order": read(), "refund_order": money("finance", subject="order_id")}
    middleware = gated_middleware([get_order, refund_order], effects)  # effectgate.db, here


    def factory(store: Any, *, keyring: Any = None) -> EffectGate:
        return EffectGate(middleware.gate.table, store, keyring=keyring)


    if __name__ == "__main__":
        script = Script([call("refund_order", order_id="1042", amount=500), say("ok")])
        agent = create_agent(
            ScriptedChatModel(script=script), middleware=[middleware], checkpointer=InMemorySaver(),
            context_schema=User,
        )
        cfg = {"configurable": {"thread_id": "s1"}}
        message = {"messages": [HumanMessage("refund", id="m1")]}
        out = agent.invoke(message, cfg, context=User("u1"), version="v2")
        [request] = [r for pause in out.interrupts for r in pause.value["requests"]]
        print(request["approval_id"])
        middleware.gate.close()
    '''
)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The newcomer's directory, the command's working directory, and not on `sys.path`: the
    installed `effectgate` script's `sys.path[0]` is its own bin directory, not the cwd."""
    for name in ("EFFECTGATE_DB", "EFFECTGATE_APP", "EFFECTGATE_KEYRING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("eg_newcomer_"):
            del sys.modules[name]


def _propose(workdir: Path, module: str, source: str, url: str) -> str:
    """`python MODULE.py URL` in the working directory: the approval id it proposed."""
    (workdir / f"{module}.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k not in ("EFFECTGATE_KEYRING", "EFFECTGATE_DB")}
    done = subprocess.run(
        [sys.executable, f"{module}.py", url],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def _status(url: str, approval_id: str) -> str:
    with open_store(url) as store:
        row = store.get_approval(approval_id)
        assert row is not None
        return row.status


def test_app_module_in_the_working_directory_is_found(workdir: Path) -> None:
    """README: `python myshop.py` proposes, and `effectgate --app myshop:factory approve` in
    another terminal (same directory) accepts it. The installed command did not look in the
    working directory (`cannot load --app myshop:factory: No module named 'myshop'`, exit 2), so
    the approval stayed pending; `python -m effectgate.cli` found it."""
    url = f"sqlite:///{workdir / 'effectgate.db'}"
    approval_id = _propose(workdir, "eg_newcomer_shop", SHOP, url)
    approve = ["approve", approval_id, "--version", "1", "--as", "finance", "--approver", "fiona"]
    code = main(["--db", url, "--app", "eg_newcomer_shop:factory", *approve, "--execute"])
    assert code == 0
    assert _status(url, approval_id) == "executed"


def test_a_langgraph_agent_run_as_a_script_is_approved_through_app(workdir: Path) -> None:
    """README "A script's tools fingerprint as imported", on the "three lines" LangGraph path:
    the agent file run as a script proposes; `--app agent:factory` over the middleware's table
    approves and runs it (it was refused as reclassified, nothing approved)."""
    pytest.importorskip("effectgate_langgraph")
    url = f"sqlite:///{workdir / 'effectgate.db'}"
    approval_id = _propose(workdir, "eg_newcomer_agent", LANGGRAPH_AGENT, url)
    sys.path.insert(0, str(workdir))  # independent of the --app lookup above
    approve = ["approve", approval_id, "--version", "1", "--as", "finance", "--approver", "fiona"]
    code = main(["--db", url, "--app", "eg_newcomer_agent:factory", *approve, "--execute"])
    assert _status(url, approval_id) == "executed"
    assert code == 0


def test_demo_help_names_the_database_the_demo_writes(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`effectgate demo --help` said `--db ... (default $EFFECTGATE_DB or sqlite:///effectgate.db)`,
    but the demo writes sqlite:///effectgate-demo.db (the README's CLI section reads it there)
    and ignores $EFFECTGATE_DB."""
    assert main(["demo", "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "effectgate-demo.db" in shown
    assert "sqlite:///effectgate.db" not in shown


def test_a_database_path_without_a_scheme_names_the_url_to_give(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`effectgate --db effectgate.db pending` (a path, as the README names the file) said only
    "Could not parse SQLAlchemy URL" (exit 5): the error now names the URL to give. Nothing is
    created."""
    assert main(["--db", "effectgate.db", "pending"]) == 5
    err = capsys.readouterr().err
    assert "sqlite:///effectgate.db" in err
    assert list(workdir.iterdir()) == []


def test_approve_execute_prints_the_result_as_json_not_as_an_escaped_string(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`approve --execute` printed the result as a JSON string of its JSON text
    (`"{\\"refund_id\\": ...`); it prints the result itself, as `pending` prints arguments."""
    url = f"sqlite:///{workdir / 'effectgate.db'}"
    approval_id = _propose(workdir, "eg_newcomer_shop2", SHOP, url)
    sys.path.insert(0, str(workdir))
    approve = ["approve", approval_id, "--version", "1", "--as", "finance", "--approver", "fiona"]
    assert main(["--db", url, "--app", "eg_newcomer_shop2:factory", *approve, "--execute"]) == 0
    out = capsys.readouterr().out
    assert _status(url, approval_id) == "executed"
    assert '\\"' not in out
    assert json.dumps("re_1") in out


def test_an_effect_given_as_a_label_is_a_table_error_naming_the_row_builders() -> None:
    """ "Name each tool's effect next to it": a newcomer writes `{"get_order": "read"}` (TOML and
    `Effect.from_label` take labels). That must be a TableError naming read()/money(...), as a
    missing row is, not `AttributeError: 'str' object has no attribute 'options'`."""
    from effectgate.errors import TableError
    from effectgate.rows import NativeTool, table_for

    def get_order(order_id: str) -> str:
        return order_id

    tool = NativeTool("get_order", "Look up an order.", {"type": "object", "properties": {}}, get_order)
    with pytest.raises(TableError, match=r"read\(\)"):
        table_for([tool], {"get_order": "read"}, agent_id="agent")  # type: ignore[dict-item]


OPENAI_AGENT = textwrap.dedent(
    '''
    import asyncio
    from typing import Any

    from agents import Agent, Runner, function_tool, set_tracing_disabled

    from effectgate import EffectGate, money, read
    from effectgate.testing import Script, call, say
    from effectgate_openai_agents import gate_agent, gate_of, pending_approvals
    from effectgate_openai_agents.testing import ScriptedModel

    set_tracing_disabled(True)


    @function_tool
    def get_order(order_id: str) -> str:
        """Look up an order."""
        return f"order {order_id}: delivered"


    @function_tool
    def refund_order(order_id: str, amount: int) -> str:
        """Refund part of an order, in pence."""
        return f"refunded {amount} on order {order_id}"


    effects = {"get_order": read(), "refund_order": money("finance", subject="order_id")}
    script = Script([call("refund_order", order_id="1042", amount=500), say("ok")])
    support = gate_agent(
        Agent(name="support", model=ScriptedModel(script), tools=[get_order, refund_order]), effects=effects
    )


    def factory(store: Any, *, keyring: Any = None) -> EffectGate:
        return EffectGate(gate_of(support).table, store, keyring=keyring)


    if __name__ == "__main__":
        context = {"session_id": "s1", "origin_message_id": "m1", "user_id": "u1"}
        result = asyncio.run(Runner.run(support, "refund 500 on 1042", context=context))
        [paused] = pending_approvals(result.to_state())
        print(paused.approval_id)
        gate_of(support).close()
    '''
)


def test_approve_execute_of_an_openai_agents_call_leaves_no_unknown_outcome(workdir: Path) -> None:
    """`effectgate --app agent:factory approve ID ... --execute` on a call an OpenAI Agents agent
    proposed: the tool refuses to run outside its gated SDK call, so nothing happened, yet the
    execution was recorded `needs_reconciliation` (the grant spent, finance paged, the subject
    held until a person settles it). Either `--execute` is refused before the grant is spent or
    the record says it did not run."""
    pytest.importorskip("effectgate_openai_agents")
    url = f"sqlite:///{workdir / 'effectgate.db'}"
    approval_id = _propose(workdir, "eg_newcomer_openai", OPENAI_AGENT, url)
    sys.path.insert(0, str(workdir))
    approve = ["approve", approval_id, "--version", "1", "--as", "finance", "--approver", "fiona"]
    code = main(["--db", url, "--app", "eg_newcomer_openai:factory", *approve, "--execute"])
    with open_store(url) as store:
        statuses = [e.status for e in store.executions(approval_id=approval_id)]
        idempotency = store.idempotency_records()
        (row,) = [a for a in store.approvals() if a.id == approval_id]
    assert code == 4  # approved (recorded), the run refused before it started: nothing ran
    assert statuses == []  # nothing ran, nothing claimed: the grant is kept for the SDK's run
    assert idempotency == []
    assert (row.status, row.token_used_at) == ("approved", None)


def test_the_demo_names_the_pending_command_it_suggests_whole(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make demo` ends: "decide it ... or `uv run effectgate --db ... pending`", a literal `...`
    that, pasted, is an unparseable URL (exit 5). The command it prints runs as printed and lists
    the refund left waiting."""
    monkeypatch.setenv("COLUMNS", "400")  # one line per sentence: the command is not wrapped
    assert main(["demo"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    command = out.split("or `uv run effectgate ", 1)[1].split("`", 1)[0].split()
    assert main([*command, "--json"]) == 0
    waiting = json.loads(capsys.readouterr().out)
    assert [(w["tool"], w["status"]) for w in waiting if w["tool"] == "refund_order"] == [
        ("refund_order", "pending")
    ]


def test_an_effect_given_as_a_label_to_a_langgraph_node_is_a_table_error(workdir: Path) -> None:
    """The LangGraph "three lines" path reads each row's effect and options before building the
    table: a label there was the same raw AttributeError."""
    pytest.importorskip("effectgate_langgraph")
    from langchain_core.tools import tool

    from effectgate.errors import TableError
    from effectgate_langgraph import gated_node

    @tool
    def get_order(order_id: str) -> str:
        """Look up an order."""
        return order_id

    with pytest.raises(TableError, match=r"read\(\)"):
        gated_node([get_order], effects={"get_order": "read"}, db=f"sqlite:///{workdir / 'eg.db'}")  # type: ignore[dict-item]
    assert not (workdir / "eg.db").exists()
