"""The public surface: `effectgate.__all__`, the error tree, lockstep versions, the install hint."""

from __future__ import annotations

import importlib.metadata
import inspect
import sys
import tomllib
from pathlib import Path

import pytest

import effectgate
from effectgate import errors
from effectgate.errors import EffectGateError, MissingDependency

ROOT = Path(__file__).resolve().parent.parent

PUBLIC = [
    "Approver",
    "CallContext",
    "Card",
    "Confirmation",
    "Effect",
    "EffectGate",
    "EffectTable",
    "Escalate",
    "Executed",
    "Grant",
    "Invalid",
    "Keyring",
    "Outcome",
    "PartialApproval",
    "Pending",
    "Policy",
    "Reconciled",
    "ReconciliationNotice",
    "Recorded",
    "Refused",
    "Reversibility",
    "Row",
    "SchemaError",
    "SubjectEntry",
    "ToolContext",
    "ToolSpec",
    "__version__",
    "destructive",
    "idempotency_headers",
    "money",
    "open_store",
    "read",
    "send",
    "set_idempotency_key",
    "write",
]

ERRORS = [
    "AlreadyDecided",
    "ApprovalError",
    "ApprovalExpired",
    "ArgumentError",
    "ConfirmFailed",
    "IdempotencyConflict",
    "IdempotencyError",
    "InProgress",
    "LeaseLost",
    "MissingDependency",
    "MissingKeyring",
    "NeedsReconciliation",
    "OutcomeUnknown",
    "PolicyViolation",
    "StaleApproval",
    "StoreError",
    "TableError",
    "TamperedRecord",
    "TokenError",
    "UnknownApproval",
    "WebhookSignatureError",
    "WrongApprover",
]


def test_all_is_pinned() -> None:
    """`effectgate.__all__` is exactly the curated list; adding or dropping a name is a decision."""
    assert effectgate.__all__ == PUBLIC


@pytest.mark.parametrize("name", PUBLIC)
def test_each_public_name_is_importable(name: str) -> None:
    """Every name in `__all__` is an attribute of the package, importable with `from effectgate import`."""
    namespace: dict[str, object] = {}
    exec(f"from effectgate import {name}", namespace)
    assert namespace[name] is getattr(effectgate, name)


def test_star_import_gives_exactly_all() -> None:
    """`from effectgate import *` binds the names of `__all__` and nothing else."""
    namespace: dict[str, object] = {}
    exec("from effectgate import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(PUBLIC)


def test_version_is_a_string() -> None:
    """`__version__` is a plain version string."""
    assert isinstance(effectgate.__version__, str)
    assert effectgate.__version__.count(".") >= 2


@pytest.mark.parametrize("name", ERRORS)
def test_every_error_is_an_effectgate_error(name: str) -> None:
    """Each public error subclasses `EffectGateError`, so one `except` catches them all."""
    cls = getattr(errors, name)
    assert inspect.isclass(cls)
    assert issubclass(cls, EffectGateError)


def test_the_error_list_covers_the_module() -> None:
    """Every exception class errors.py defines is in its `__all__` and in the list above."""
    defined = {
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    }
    assert defined - {"EffectGateError"} == set(ERRORS)
    assert defined <= set(errors.__all__)


def test_errors_split_by_who_is_at_fault() -> None:
    """The approver's, the token holder's and the operation key's errors sit under their own roots."""
    approver: tuple[type[Exception], ...] = (
        errors.StaleApproval,
        errors.WrongApprover,
        errors.ApprovalExpired,
        errors.UnknownApproval,
    )
    key: tuple[type[Exception], ...] = (
        errors.IdempotencyConflict,
        errors.InProgress,
        errors.NeedsReconciliation,
        errors.LeaseLost,
    )
    assert all(issubclass(cls, errors.ApprovalError) for cls in approver)
    assert all(issubclass(cls, errors.IdempotencyError) for cls in key)
    assert issubclass(errors.ConfirmFailed, errors.PolicyViolation)
    assert issubclass(MissingDependency, ImportError)


def _pyprojects() -> list[Path]:
    return [
        ROOT / "pyproject.toml",
        ROOT / "core" / "pyproject.toml",
        *sorted(ROOT.glob("integrations/*/pyproject.toml")),
    ]


@pytest.mark.parametrize("path", _pyprojects(), ids=lambda p: str(p.relative_to(ROOT)))
def test_distribution_versions_are_in_lockstep(path: Path) -> None:
    """Every distribution in the workspace carries `effectgate.__version__`."""
    project = tomllib.loads(path.read_text())["project"]
    assert project["version"] == effectgate.__version__, project["name"]


def test_workspace_pins_are_in_lockstep() -> None:
    """Every requirement on a workspace distribution pins exactly `effectgate.__version__`."""
    projects = [tomllib.loads(p.read_text())["project"] for p in _pyprojects()]
    members = {p["name"] for p in projects}
    requirements = [
        req
        for p in projects
        for req in [
            *p.get("dependencies", []),
            *(r for rs in p.get("optional-dependencies", {}).values() for r in rs),
        ]
    ]
    pins = [r for r in requirements if r.split("[")[0].split("=")[0].strip() in members]
    assert pins, "the meta-package depends on effectgate-core"
    for req in pins:
        assert req.endswith(f"=={effectgate.__version__}"), req


def test_installed_metadata_matches() -> None:
    """The installed effectgate-core distribution reports the same version as the package."""
    assert importlib.metadata.version("effectgate-core") == effectgate.__version__


@pytest.mark.parametrize(
    "url", ["postgresql+psycopg://eg@127.0.0.1:5432/eg", "postgresql://eg@127.0.0.1:5432/eg"]
)
def test_postgres_without_psycopg_names_the_extra(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a PostgreSQL URL without psycopg raises MissingDependency with the install command."""
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(MissingDependency) as caught:
        effectgate.open_store(url)
    assert 'pip install "effectgate[postgres]"' in str(caught.value)
    assert (caught.value.package, caught.value.extra) == ("psycopg", "postgres")
    assert isinstance(caught.value.__cause__, ImportError)
