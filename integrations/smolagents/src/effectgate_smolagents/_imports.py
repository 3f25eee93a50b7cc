"""A CodeAgent's authorized imports: modules its code uses directly, with no tool call at all.

smolagents lets a CodeAgent's code import the modules of `BASE_BUILTIN_MODULES` and those named
in `additional_authorized_imports`. `requests.post(...)`, `os.remove(...)`, `subprocess.run(...)`
or `smtplib.SMTP(...)` from an imported module is no tool call, so the gate never sees it. So a
`GatedAgent` takes a CodeAgent only when every module its code may import is smolagents' own
default or one of `EFFECT_FREE` (pure computation), or was acknowledged by the user with
`allow_imports=`: each acknowledged module is the user's decision that model code may use it
ungated. Anything else raises `UnknownTool` naming the modules, whatever `unknown=` says, before
anything is changed; each run checks again before the model is asked anything.

Where the list lives (smolagents 1.26): `CodeAgent.__init__` keeps `additional_authorized_imports`
and `authorized_imports` (its defaults and those: the prompt and `to_dict`, so a saved folder);
its `LocalPythonExecutor` keeps its own `additional_authorized_imports` and `authorized_imports`,
the list `check_import_authorized` enforces. There an entry "os.path" lets code import `os`
itself, "numpy.*" any numpy submodule, and "*" any module at all. A remote executor (E2B, Docker,
Modal, Blaxel) or any other executor runs the code as plain Python, which imports anything; its
`additional_imports` are packages it installs. All of them are read, fail closed: an executor
that is not a `LocalPythonExecutor` counts as "*", and a list that is not a list is refused.

An entry is accepted as it is only when it is exactly one of smolagents' defaults or of
`EFFECT_FREE` ("heapq" is, "heapq.*" and "os.path" are not). It is acknowledged when
`allow_imports` names it exactly, or names its top-level module ("numpy" acknowledges "numpy",
"numpy.linalg" and "numpy.*"), or is "*" (every module, acknowledged).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from smolagents.agents import CodeAgent, MultiStepAgent
from smolagents.local_python_executor import LocalPythonExecutor
from smolagents.utils import BASE_BUILTIN_MODULES

from effectgate.adapter import UnknownTool

#: standard-library modules that only compute, written in C: functions and immutable types only.
#: Left out: any module with a pure-Python class the process itself uses (smolagents' interpreter
#: hands model code the real `setattr` and classes are shared: `json.JSONEncoder.encode` patched
#: from model code changed what every card printed), `string` (`Formatter().get_field` follows
#: dunder attributes: `open`), `operator` (`attrgetter`), and modules with a command-line `main`.
EFFECT_FREE: frozenset[str] = frozenset({"bisect", "cmath", "decimal", "hashlib", "heapq"})
ACCEPTED: frozenset[str] = frozenset(BASE_BUILTIN_MODULES) | EFFECT_FREE
_NAME = re.compile(r"\*|[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(\.\*)?")


def acknowledged(allow_imports: object) -> frozenset[str]:
    """The modules `allow_imports` acknowledges: none, "*", or module names (as in smolagents'
    `additional_authorized_imports`: "numpy", "numpy.linalg", "numpy.*"). Bad input raises
    `TypeError` or `ValueError`."""
    if allow_imports is None:
        return frozenset()
    if isinstance(allow_imports, str):
        if allow_imports == "*":
            return frozenset({"*"})
        raise TypeError(
            f"allow_imports takes a list of module names or '*', not the string {allow_imports!r}: "
            f"write allow_imports=[{allow_imports!r}]"
        )
    if isinstance(allow_imports, bytes | Mapping) or not isinstance(allow_imports, Iterable):
        raise TypeError(f"allow_imports takes a list of module names or '*', not {allow_imports!r}")
    names = list(allow_imports)
    for name in names:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(
                f"allow_imports: {name!r} is not a module name (e.g. 'numpy', 'numpy.linalg', 'numpy.*', '*')"
            )
    return frozenset(names)


def _entries(agent: MultiStepAgent, who: str) -> list[object]:
    """Every import the agent's code may make, from each place smolagents keeps one."""
    executor = getattr(agent, "python_executor", None)
    if not isinstance(agent, CodeAgent) and executor is None:
        return []  # no code runs
    lists = [
        ("additional_authorized_imports", getattr(agent, "additional_authorized_imports", None)),
        ("authorized_imports", getattr(agent, "authorized_imports", None)),
    ]
    entries: list[object] = []
    if isinstance(executor, LocalPythonExecutor):
        lists += [
            ("its executor's additional_authorized_imports", executor.additional_authorized_imports),
            ("its executor's authorized_imports", executor.authorized_imports),
        ]
    elif executor is not None:  # remote or custom: the code is plain Python
        entries.append("*")
        lists.append(("its executor's additional_imports", getattr(executor, "additional_imports", None)))
    for where, value in lists:
        if value is None:
            continue
        if not isinstance(value, list | tuple | set | frozenset):
            raise UnknownTool(
                f"{who}'s {where} is a {type(value).__name__}, not a list of module names: refused "
                "(the gate cannot tell what its code may import)"
            )
        entries.extend(value)
    return entries


def freeze(agent: MultiStepAgent) -> None:
    """Make the local executor's import lists tuples once they are checked: code that reaches
    the list object (a generator's frame reads the interpreter's locals) cannot append to it. A
    hardening only: smolagents' local interpreter is not a security boundary (see the README)."""
    executor = getattr(agent, "python_executor", None)
    if isinstance(executor, LocalPythonExecutor):
        executor.authorized_imports = tuple(executor.authorized_imports)
        executor.additional_authorized_imports = tuple(executor.additional_authorized_imports)


def check_imports(agent: MultiStepAgent, who: str, allowed: frozenset[str]) -> None:
    """`UnknownTool` if the agent's code may import a module beyond smolagents' defaults and
    `EFFECT_FREE` that `allowed` (the wrapping `GatedAgent`'s `allow_imports`) does not name."""
    if "*" in allowed:
        return
    refused = set()
    for entry in _entries(agent, who):
        if not isinstance(entry, str):
            refused.add(repr(entry))
        elif entry not in ACCEPTED and entry not in allowed and entry.split(".")[0] not in allowed:
            refused.add(entry)
    if not refused:
        return
    names = sorted(refused)
    executor = getattr(agent, "python_executor", None)
    plain = (
        ""
        if executor is None or isinstance(executor, LocalPythonExecutor)
        else f" (its {type(executor).__name__} runs the code as plain Python: any module)"
    )
    acknowledge = "'*'" if "*" in names else repr(names)
    raise UnknownTool(
        f"{who}'s code may import {', '.join(names)}{plain}: model code uses an imported module "
        "directly, with no tool call, so the gate never sees what it does (it can send, write or "
        "delete). Take it out of additional_authorized_imports and give the agent a tool for what "
        f"it does, or acknowledge it where the agent is wrapped, GatedAgent(..., allow_imports="
        f"{acknowledge}): your decision that model code may use it ungated"
    )
