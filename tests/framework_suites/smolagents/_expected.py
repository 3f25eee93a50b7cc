"""The vendored tests that do not pass as they are: skipped for a missing package, or strict xfail.

(a) refused by design, (b) inspects internals or identity, "gap:" a fidelity gap the adapter
should close (see the README section "Measured against smolagents' own tests").
"""

#: tests that need packages the dev group may not install: test -> modules, comma-separated
#: (numpy arrives with the `report` extra's matplotlib; pandas never does)
NEEDS: dict[str, str] = {
    "test_agents.py::TestAgent::test_init_agent_with_different_toolsets": "ddgs",
    "test_agents.py::TestAgent::test_function_persistence_across_steps": "numpy",
    "test_agents.py::TestAgent::test_replay_shows_logs": "numpy",
    "test_agents.py::TestAgent::test_transformers_toolcalling_agent": "transformers",
    "test_agents.py::TestCodeAgent::test_from_folder": "pandas",
    "test_agents.py::TestCodeAgent::test_from_dict": "numpy,pandas",
    "test_agents.py::TestMultiAgents::test_multiagents_save": "ddgs",
    "test_agents.py::TestMultiAgents::test_multiagents": "numpy,pandas",
    "test_monitoring.py::MonitoringTester::test_streaming_agent_image_output": "gradio",
    "test_monitoring.py::MonitoringTester::test_streaming_agent_text_output": "gradio",
    "test_monitoring.py::MonitoringTester::test_streaming_with_agent_error": "gradio",
}

_MANAGED = (
    "(a) refused by design: a managed agent runs its own tools, so the gate accepts one only when it "
    "was wrapped first by a GatedAgent on the manager's gate; this test's managed agent is a mock"
)
_IMPORTS = (
    "(a) refused by design: the CodeAgent authorizes additional imports (numpy, pandas), which model "
    "code uses with no tool call, and the swap wraps it without allow_imports="
)
#: strict xfail: test -> reason (one test inspects a tool's identity, and no fidelity gap is left
#: open: the nine once listed here pass, see the README section)
EXPECTED: dict[str, str] = {
    **{
        "test_agents.py::TestMultiStepAgent::test_validate_tools_and_managed_agents"
        f"[tools{i}-managed_agents{i}-test_agent-expectation{i}]": _MANAGED
        for i in (0, 3, 5)
    },
    "test_agents.py::TestToolCallingAgent::test_toolcalling_agent_passes_both_tools_and_managed_agents": _MANAGED,
    "test_agents.py::TestMultiStepAgent::test_instantiation_with_final_answer_tool[tools1-CustomFinalAnswerTool]": (
        "(b) inspects a tool's identity: a tool of the user's named final_answer is gated like any "
        "other (only smolagents' own FinalAnswerTool is left as it is), so the agent holds a "
        "GatedTool standing for CustomFinalAnswerTool, not an instance of it"
    ),
    "test_agents.py::TestCodeAgent::test_local_python_executor_with_custom_functions": (
        "(a) refused by design: functions handed to the CodeAgent's executor (additional_functions) "
        "run from the model's code without the gate"
    ),
    **dict.fromkeys(
        (
            "test_agents.py::TestAgent::test_function_persistence_across_steps",
            "test_agents.py::TestAgent::test_replay_shows_logs",
            # skipped here first (NEEDS), refused the same way where pandas and ddgs are installed
            "test_agents.py::TestCodeAgent::test_from_folder",
            "test_agents.py::TestCodeAgent::test_from_dict",
            "test_agents.py::TestMultiAgents::test_multiagents",
            "test_agents.py::TestMultiAgents::test_multiagents_save",
        ),
        _IMPORTS,
    ),
}

#: skipped when gated: test -> reason (a test whose outcome depends on thread timing, so it can
#: neither pass reliably nor be a strict xfail; counted as not passing)
TIMING: dict[str, str] = {
    "test_agents.py::TestToolCallingAgent::test_process_tool_calls[test_case1]": (
        "expects two parallel calls' outputs in call order, but smolagents yields them in the order "
        "its threads finish; a gated read writes to the store, so either may finish first"
    ),
}
