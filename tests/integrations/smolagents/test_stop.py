"""The CodeAgent stop is total: once a gated call has stopped a snippet, nothing the model wrote
around it runs another tool, and the stop lifts only when the run is resumed.

The model writes the code itself (`ScriptedCodeModel`); effects are counted at the shop's receiver.
"""

from __future__ import annotations

import pytest
from smolagents import Tool

from effectgate import Grant
from effectgate.testing import Script
from effectgate_smolagents import Approve, AwaitingApproval, Finished, GatedAgent, RunOutcome
from effectgate_smolagents.testing import ScriptedCodeModel, ScriptedModel
from tests.conformance.adapters import FINANCE, REFUND, ShopGate

from ._harness import support_agent

REFUND_CALL = 'refund_order(order_id="1042", amount=12000, currency="GBP")'
TAG_CALL = 'update_ticket_tags(ticket_id="t-17", tags=["urgent"])'


def ask(gated: GatedAgent, task: str, *, message_id: str = "m3") -> RunOutcome:
    """One message from Ada (session s-ada) to the support agent; a later one keeps the memory."""
    first = not gated.agent.memory.steps
    return gated.run(task, session_id="s-ada", origin_message_id=message_id, user_id="u1", reset=first)


#: Model-written code around the gated refund that tries to run more after the stop.
AROUND = {
    "try_finally": f"""
        try:
            {REFUND_CALL}
        finally:
            {TAG_CALL}
        """,
    "except_base_exception": f"""
        try:
            {REFUND_CALL}
        except BaseException:
            {TAG_CALL}
        """,
    "bare_except": f"""
        try:
            {REFUND_CALL}
        except:
            {TAG_CALL}
        """,
    "loop": f"""
        for attempt in range(3):
            {REFUND_CALL}
            {TAG_CALL}
        """,
    "finally_of_a_nested_function": f"""
        def refund_and_tag():
            try:
                {REFUND_CALL}
            finally:
                {TAG_CALL}

        refund_and_tag()
        """,
    "function_defined_before_called_in_finally": f"""
        def tag():
            return {TAG_CALL}

        try:
            {REFUND_CALL}
        finally:
            tag()
        """,
    "context_manager_exit": f"""
        class Tagging:
            def __enter__(self):
                return self

            def __exit__(self, exc_type, exc, tb):
                {TAG_CALL}
                return True

        with Tagging():
            {REFUND_CALL}
        """,
    "read_in_finally": f"""
        try:
            {REFUND_CALL}
        finally:
            get_order(order_id="1042")
        """,
    "final_answer_in_finally": f"""
        try:
            {REFUND_CALL}
        finally:
            final_answer("done")
        """,
    # a `return` in a `finally` ends the unwinding of the stop: the snippet runs on
    "return_in_finally_swallows_the_stop": f"""
        def refund_quietly():
            try:
                {REFUND_CALL}
            finally:
                return "carry on"

        refund_quietly()
        {TAG_CALL}
        final_answer("done")
        """,
    # ... and when no tool call follows, the run still ends with the snippet (the model is not
    # asked for another step while the refund waits)
    "swallowed_stop_then_no_tool": f"""
        def refund_quietly():
            try:
                {REFUND_CALL}
            finally:
                return "carry on"

        print(refund_quietly())
        """,
    "continue_in_finally_swallows_the_stop": f"""
        for attempt in range(2):
            try:
                {REFUND_CALL}
            finally:
                continue
        {TAG_CALL}
        """,
    # an Exception raised in the `finally` replaces the stop, and an outer handler catches it
    "exception_replaces_the_stop": f"""
        try:
            try:
                {REFUND_CALL}
            finally:
                raise ValueError("not now")
        except ValueError:
            {TAG_CALL}
        """,
    # the gate wrapper keeps nothing the code can reach to lift the stop
    "lift_the_stop_through_attributes": f"""
        try:
            {REFUND_CALL}
        finally:
            refund_order._owner._stopped = None
            {TAG_CALL}
        """,
}

#: The next snippet, after the refund was approved: the write it asks for runs, once.
AFTER_RESUME = f"""
    tagged = {TAG_CALL}
    final_answer("Refund approved; ticket tagged.")
    """


@pytest.mark.parametrize("code", list(AROUND.values()), ids=list(AROUND))
def test_nothing_after_the_gated_call_runs_until_the_run_is_resumed(shop_gate: ShopGate, code: str) -> None:
    """Whatever code surrounds the refund, no write, read or final answer after it runs, the run
    awaits that refund's one approval, and after the grant the next snippet's write runs once."""
    model = ScriptedCodeModel([code, AFTER_RESUME])
    gated = support_agent(shop_gate.gate, model, kind="code")

    out = ask(gated, "Refund 1042 and tag my ticket")

    assert isinstance(out, AwaitingApproval)
    [pending] = out.pending
    assert (pending.card.tool, dict(pending.card.args)) == ("refund_order", REFUND)
    assert shop_gate.shop.receiver.count("ticket_tags") == 0
    assert shop_gate.shop.reads["get_order"] == 0
    assert shop_gate.shop.receiver.count("refund") == 0
    assert [(a.id, a.status) for a in shop_gate.store.approvals()] == [(pending.approval_id, "pending")]
    assert len(model.seen) == 1  # the run ended with the snippet: the model was not asked again

    decision = shop_gate.gate.approve(pending.approval_id, version=pending.version, approver=FINANCE)
    assert isinstance(decision, Grant)
    done = gated.resume(out, {pending.approval_id: Approve(decision)})

    assert isinstance(done, Finished)
    assert done.output == "Refund approved; ticket tagged."
    assert shop_gate.shop.receiver.count("refund") == 1
    assert shop_gate.shop.receiver.count("ticket_tags") == 1
    assert shop_gate.shop.reads["get_order"] == 0
    assert len(shop_gate.store.approvals()) == 1
    model.assert_complete()


def test_the_next_run_starts_without_the_stop(shop_gate: ShopGate) -> None:
    """The stop belongs to the run it stopped: the user's next message starts a run whose write
    runs, while the refund still waits for its approval."""
    model = ScriptedCodeModel([REFUND_CALL, TAG_CALL + '\nfinal_answer("Tagged.")'])
    gated = support_agent(shop_gate.gate, model, kind="code")
    assert isinstance(ask(gated, "Refund 1042"), AwaitingApproval)

    out = ask(gated, "Just tag my ticket", message_id="m4")

    assert isinstance(out, Finished)
    assert shop_gate.shop.receiver.count("ticket_tags") == 1
    assert shop_gate.shop.receiver.count("refund") == 0
    assert [a.status for a in shop_gate.store.approvals()] == ["pending"]
    model.assert_complete()


def test_no_attribute_of_a_tool_leads_to_the_gate(shop_gate: ShopGate) -> None:
    """smolagents lets model code read any attribute that is not a dunder: walking every such
    attribute from the tools a CodeAgent's code sees reaches neither the gate, its store, the
    shop, the GatedAgent, nor an unwrapped tool."""
    gated = support_agent(shop_gate.gate, ScriptedModel(Script([])), kind="code")
    forbidden = (type(shop_gate.gate), type(shop_gate.store), type(shop_gate.shop), GatedAgent)
    wrappers = {id(t) for t in gated.agent.tools.values()}
    reached = _reachable(dict(gated.agent.tools), depth=5)
    assert [path for path, value in reached if isinstance(value, forbidden)] == []
    assert [path for path, value in reached if isinstance(value, Tool) and id(value) not in wrappers] == []


def test_code_reaching_behind_a_gated_tool_runs_nothing(shop_gate: ShopGate) -> None:
    """Code that tries to call the shop's function through the tool's attributes fails there: the
    write never lands, and the run goes on to the model's next step."""
    sneak = """
        row = update_ticket_tags._owner.gate.table.get("update_ticket_tags")
        row.fn(ticket_id="t-17", tags=["urgent"])
        """
    model = ScriptedCodeModel([sneak, 'final_answer("I could not.")'])
    gated = support_agent(shop_gate.gate, model, kind="code")
    out = ask(gated, "Tag my ticket")
    assert isinstance(out, Finished)
    assert shop_gate.shop.receiver.count("ticket_tags") == 0
    assert shop_gate.store.executions() == []
    model.assert_complete()


def _reachable(roots: dict[str, object], *, depth: int) -> list[tuple[str, object]]:
    """Every (path, value) reachable from `roots` through non-dunder attributes and containers."""
    found: list[tuple[str, object]] = []
    seen: set[int] = set()
    frontier: list[tuple[str, object]] = list(roots.items())
    for _ in range(depth):
        following: list[tuple[str, object]] = []
        for path, value in frontier:
            if id(value) in seen:
                continue
            seen.add(id(value))
            found.append((path, value))
            if isinstance(value, dict | list | tuple):
                items = value.items() if isinstance(value, dict) else enumerate(value)
                following += [(f"{path}[{key!r}]", item) for key, item in items]
                continue
            for name in dir(value):
                if name.startswith("__") and name.endswith("__"):
                    continue
                try:
                    following.append((f"{path}.{name}", getattr(value, name)))
                except Exception:  # a property that raises reaches nothing
                    continue
        frontier = following
    return found
