"""What a tool's own arguments check raises before the tool runs (`_fidelity._check`, `_as_call`).

`InvalidToolArguments`: the tool's pydantic model refused the arguments (a `ValidationError`), or
the values the graph injects could not be supplied. `ArgumentsRefused`: a validator of that model
raised an error pydantic does not wrap. Either way the tool never ran.
"""

from __future__ import annotations

import pydantic
from pydantic_core import ErrorDetails

from effectgate.flow import NotStarted


class InvalidToolArguments(ValueError):
    """The tool's own pydantic model refused the arguments, or the values the graph injects could
    not be supplied (no store, a missing state field); the tool did not run."""

    def __init__(self, tool: str, error: Exception) -> None:
        self.tool = tool
        self.source = error
        self.errors: list[ErrorDetails] = []
        if isinstance(error, pydantic.ValidationError):
            self.errors = error.errors(include_url=False)
            super().__init__(f"{tool}: the tool refused its arguments: {error}")
        else:
            super().__init__(f"{tool}: the arguments the graph injects could not be supplied: {error}")


class ArgumentsRefused(InvalidToolArguments, NotStarted):
    """A validator of the tool's own pydantic model raised an error pydantic does not wrap (it
    wraps only `ValueError` and `AssertionError`): the tool never ran, so the gate records a
    definite failure (`NotStarted`), never an unknown outcome. ToolNode's `handle_tool_errors`
    judges the validator's own error (`source`), as a plain ToolNode does."""

    def __init__(self, tool: str, error: Exception) -> None:
        super().__init__(tool, error)
        self.args = (f"{tool}: the tool refused its arguments: {type(error).__name__}: {error}",)
