"""The vendored tests that do not pass with effectgate's middleware: each a strict xfail with its reason.

(a) refused by design, (b) inspects internals, "gap:" a fidelity gap the adapter should close
(see the section "Measured against create_agent's own tests" in integrations/langgraph/README.md).
A key without "[...]" covers every parametrization of that test.
"""

A_DYNAMIC = (
    "(a) a middleware adds a tool to the model request and runs it through the handler with "
    "request.override(tool=...); the gate runs only rows of its effect table, so it refuses the "
    "call (deny-by-default), in its own words"
)
A_NO_CHECK = (
    "(a) create_agent checks the tools a middleware adds to the model request (ValueError) only "
    "when no middleware has wrap_tool_call; the gate's middleware has one, so the check is skipped "
    "and a call to such a tool is refused by the gate when the model makes it"
)

#: test id (file::name[params]) -> reason
EXPECTED: dict[str, str] = {
    # (a) refused by design: a tool the gate has no row for
    "test_dynamic_tools.py::test_dynamic_tool_basic[with_static_tools-False]": A_DYNAMIC,
    "test_dynamic_tools.py::test_dynamic_tool_basic[with_static_tools-True]": A_DYNAMIC,
    "test_dynamic_tools.py::test_multiple_dynamic_tools_with_static": A_DYNAMIC,
    "test_dynamic_tools.py::test_conditional_dynamic_tool": A_DYNAMIC,
    # (a) refused by design: the gate is a wrap_tool_call middleware
    "test_dynamic_tools.py::test_dynamic_tool_without_handler_raises_error[with_static_tools-False]": A_NO_CHECK,
    "test_dynamic_tools.py::test_dynamic_tool_without_handler_raises_error[with_static_tools-True]": A_NO_CHECK,
    "test_tools.py::test_unknown_tool_raises_error": A_NO_CHECK,
}
