"""A tool's own exception, shown to the model as smolagents shows a plain tool's.

The gate runs a read or a write and records its failure; then the exception goes back the way
smolagents would have taken it:

- In a `CodeAgent` the tool's exception is raised again, unchanged, at the call: smolagents'
  executor stops the snippet there and the model reads "Code execution failed at line '...' due
  to: ValueError: ..." (with the print output before it), as for an ungated tool.
- In a `ToolCallingAgent` step with one call, `AgentToolExecutionError` with smolagents' own
  text ("Error executing tool 'get_order' with arguments {...}: ValueError: ...\\nPlease try
  again or use another tool"): the step records it as its error and the model reads it as
  "Error: ... Now let's retry", as for an ungated tool.
- In a `ToolCallingAgent` step with parallel calls, that same text comes back as the failing
  call's observation instead. smolagents would raise and drop the observations of the step's
  other calls (smolagents#2457), and those may have been writes that ran; the model is better
  told what they did.
"""

from __future__ import annotations

from typing import Any

from smolagents.monitoring import AgentLogger
from smolagents.utils import AgentToolExecutionError

from effectgate import Refused
from effectgate.errors import LeaseLost, NeedsReconciliation


def tool_error_text(name: str, arguments: Any, exc: BaseException) -> str:
    """smolagents' text for a tool that raised (`ToolCallingAgent.execute_tool_call`)."""
    return (
        f"Error executing tool '{name}' with arguments {arguments!s}: {type(exc).__name__}: {exc}\n"
        "Please try again or use another tool"
    )


def tool_failed(
    name: str, arguments: Any, exc: Exception, *, code: bool, parallel: bool, logger: AgentLogger
) -> str:
    """Raise the tool's failure as smolagents would (see the module docstring), or, for a call of
    a parallel ToolCallingAgent step, return smolagents' error text as its observation."""
    if code:
        raise exc
    text = tool_error_text(name, arguments, exc)
    if parallel:
        return text
    raise AgentToolExecutionError(text, logger) from exc


class GateRefusal(Exception):
    """A gated call the gate refused (nothing ran), raised in a CodeAgent's code at the call."""


class Snippet:
    """The refusal raised in a CodeAgent's code block in progress, if any. Code can catch it (it is
    an Exception, as a plain tool's failure is), so the block's `final_answer` is refused after
    it: the run does not end on an answer written before the model read the refusal. Cleared at
    each step (`keep_logs_at_a_stop`)."""

    refusal = ""

    def check_answer(self) -> None:
        if self.refusal:
            raise GateRefusal(
                f"final_answer did not run: a call of this code block was refused ({self.refusal}); "
                "read that before answering"
            )


def refused(text: str, *, code: Snippet | None) -> str:
    """A refusal as the call's result, so the model can correct the call. In a CodeAgent's code
    (`code`: its block in progress) it is raised (`GateRefusal`): the snippet stops there, as at a
    plain tool's failure, and the model reads it before it answers (the rest of the snippet, or
    code that catches it, cannot claim the call done unread: `Snippet`)."""
    if code is not None:
        code.refusal = text
        raise GateRefusal(text)
    return text


class UnknownOutcome(Exception):
    """A gated call whose outcome is unknown (it may have happened), raised in a CodeAgent's code
    at the call, as a refusal is (`Snippet` holds it: the block's `final_answer` waits for it)."""


def gate_refused(name: str, what: Exception | Refused, *, code: Snippet | None) -> str:
    """What the model is told of a call the gate refused or raised for: a refusal (nothing ran,
    `refused`), or for an unknown outcome (`NeedsReconciliation`, `LeaseLost`, or a call of one
    already awaiting reconciliation) no refusal: it may have happened and is not to be called
    again, as the other adapters say. Raised in a CodeAgent's code, as a refusal is."""
    if isinstance(what, Refused):
        if what.code != "needs_reconciliation":
            return refused(what.for_model(), code=code)
        cause = what.message
    elif isinstance(what, NeedsReconciliation | LeaseLost):
        cause = getattr(what, "reason", None) or str(what)
    else:
        return refused(f"Refused: {what}", code=code)
    text = f"{name}: its outcome is unknown ({cause}), so it may have happened; a person will reconcile it."
    text += " Do not call it again."
    if code is not None:
        code.refusal = text
        raise UnknownOutcome(text)
    return text
