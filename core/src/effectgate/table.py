"""The effect table: one row per tool, the agents' allowlists, and the table's fingerprint.

A row says what a tool does (`effect`), who must approve it (`approver_role`), which argument
names the thing it acts on (`subject`), and the checks around it (`scope`, `confirm`, `escalate`).
The table is deny-by-default: a tool that is not a row, or not on the calling agent's allowlist,
does not run.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import fastjsonschema
import pydantic

from . import _rowcheck
from ._rules import Escalate as Escalate
from ._rules import Reconciled as Reconciled
from ._rules import _context_params, _qualname, check_fingerprint, read_context, with_defaults
from ._validators import _compile, fast_validates, full_validator
from .canonical import canonical_json, digest, plain_checker
from .context import CallContext, Confirmation
from .effects import Effect, Policy, Reversibility
from .errors import TableError

if typing.TYPE_CHECKING:
    from jsonschema import Draft202012Validator

ScopeCheck = Callable[[Mapping[str, Any], CallContext], bool]
ConfirmCheck = Callable[[Mapping[str, Any], Confirmation], str | None]
Snapshot = Callable[[Mapping[str, Any]], Any]
Reconcile = Callable[[str], "Reconciled | None"]


def _as_set(value: Any) -> Any:
    """A list as the set it names: distinct items sorted by their canonical JSON text (items of
    any JSON type order the same way on every run); any other value as it is."""
    if not isinstance(value, list):
        return value
    items = {canonical_json(item): item for item in value}
    return [items[text] for text in sorted(items)]


@dataclass(frozen=True)
class SchemaError:
    """One argument problem: where (a JSON pointer into the arguments) and what."""

    pointer: str
    message: str


def derive_schema(name: str, fn: Callable[..., Any]) -> dict[str, Any]:
    """A JSON schema for `fn`'s keyword arguments, from its type hints, extra arguments refused."""
    context_names, hints = _context_params(fn)
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.name in context_names:
            continue
        if param.name == "self":
            raise TableError(
                name,
                "fn",
                "the function takes `self`: pass a bound method (obj.method) or the framework's tool "
                "object to its adapter, not the class's unbound function",
            )
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TableError(name, "schema", "cannot derive a schema from *args/**kwargs; pass schema=")
        hint = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hint, default)
    model = pydantic.create_model(f"{name}_args", __config__=pydantic.ConfigDict(extra="forbid"), **fields)
    schema: dict[str, Any] = model.model_json_schema()
    schema.pop("title", None)
    return schema


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """One row of the effect table. See the module docstring and the README for each field."""

    name: str
    effect: Effect
    fn: Callable[..., Any]
    schema: Mapping[str, Any] | None = None
    approver_role: str | None = None
    owner: str | None = None
    reversibility: Reversibility = Reversibility.IRREVERSIBLE
    subject: tuple[str, ...] = ()
    snapshot: Snapshot | None = None
    scope: ScopeCheck | None = None
    confirm: ConfirmCheck | None = None
    escalate: tuple[Escalate, ...] = ()
    transient: tuple[type[Exception], ...] = ()
    unknown_outcome: tuple[type[Exception], ...] = ()
    # Gated rows: the exceptions that mean nothing happened downstream (e.g. a provider's
    # "card declined"); every other exception from a gated tool is an unknown outcome.
    definite_failures: tuple[type[Exception], ...] = ()
    reconcile: Reconcile | None = None
    # Display only (reviewer cards): what is left on the subject, e.g. the refundable balance.
    balance: Callable[[Mapping[str, Any], Confirmation], Any] | None = None
    description: str = ""
    # The description is part of the row's fingerprint (approvals are bound to it): for rows built
    # from a tool definition someone else controls, e.g. an upstream MCP server's, where a changed
    # description is a different tool to the reviewer. Off by default: rewording your own tool's
    # docstring is not a reclassification.
    pin_description: bool = False
    # Shadow mode (gated rows): a call is recorded as an approval with its card and decided by
    # reviewers as usual, but never paused for and never executed; the agent is told it was
    # recorded, not executed (Refused, code "shadow"). Part of the fingerprint, so a call proposed
    # in shadow can never be approved or run once the row goes live.
    shadow: bool = False
    _derived: dict[str, Any] = field(default_factory=dict[str, Any], init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        _rowcheck.check_text(str(self.name), "name", self.name)  # plain text (a TOML reviewer reads it)
        effect: object = self.effect  # callers may pass a label from another taxonomy
        if not isinstance(effect, Effect):
            if not isinstance(effect, str):
                raise TableError(self.name, "effect", f'{effect!r} is not an effect (e.g. "money")')
            try:
                set_(self, "effect", Effect.from_label(effect))
            except ValueError as exc:
                raise TableError(self.name, "effect", str(exc)) from exc
        _rowcheck.check_fn(self.name, self.effect, self.fn)  # callable; an effect's no generator
        set_(self, "subject", _rowcheck.subject_of(self.name, self.subject))
        _rowcheck.check_snapshot(self.name, self.snapshot)  # taken synchronously, before and after
        _rowcheck.check_confirm(self.name, self.confirm)  # run synchronously, in the decision's transaction
        for role in ("approver_role", "owner"):  # whom the calls wait for: text that reads as it is
            _rowcheck.check_text(self.name, role, getattr(self, role), optional=True)
        _rowcheck.check_flags(self.name, shadow=self.shadow, pin_description=self.pin_description)
        reversibility: object = self.reversibility
        if not isinstance(reversibility, Reversibility):
            set_(self, "reversibility", Reversibility(str(reversibility)))
        set_(self, "escalate", _rowcheck.escalations(self.name, self.escalate))
        for name in ("transient", "unknown_outcome", "definite_failures"):
            value: object = getattr(self, name)
            types = (value,) if isinstance(value, type) else tuple(value)  # type: ignore[arg-type]
            if not all(isinstance(t, type) and issubclass(t, Exception) for t in types):
                raise TableError(self.name, name, "must be exception types (subclasses of Exception)")
            set_(self, name, types)
        if self.schema is None:
            set_(self, "schema", derive_schema(self.name, self.fn))
        schema = self.schema
        if not isinstance(schema, Mapping) or schema.get("type") != "object":
            raise TableError(
                self.name, "schema", 'the schema must be a JSON object schema ("type": "object")'
            )
        schema = _rowcheck.own_copy(self.name, schema)  # validated and fingerprinted as given
        set_(self, "schema", schema)
        _rowcheck.check_by_name(self.name, self.fn, schema)  # called as fn(**arguments)
        # the validator fetches nothing; built here, as jsonschema is imported only by a tool's row
        self._derived["validator"] = full_validator(self.name, schema)
        _rowcheck.check_named_args(
            self.name, schema, self.subject, self.escalate, self.fn
        )  # else never matched
        if not self.description:
            set_(self, "description", inspect.getdoc(self.fn) or "")
        self.check_policy(Policy())
        self._derived["context_params"] = read_context(self.name, self.effect, self.fn)
        self._derived["names"] = _rowcheck.accepted(self.fn)  # None: any name (a **kwargs)
        self._derived["fast"] = _compile(schema) if fast_validates(schema) else None
        self._derived["plain_text"] = plain_checker(schema)  # None unless the schema is simple
        check_fingerprint(self.name, self.canonical())

    def check_policy(self, policy: Policy) -> None:
        """Refuse a gated row (under this policy) that names no approver role, or whose
        escalation rule names a role its own approvers outrank (`_rowcheck.check_raises`)."""
        if policy.gates(self.effect) and not self.approver_role:
            raise TableError(self.name, "approver_role", f"a {self.effect} tool needs an approver_role")
        _rowcheck.check_raises(self.name, self.approver_role, self.escalate, policy)
        if self.shadow and not policy.gates(self.effect):
            raise TableError(
                self.name, "shadow", f"shadow mode is for gated rows; a {self.effect} row runs at once"
            )

    @property
    def context_params(self) -> frozenset[str]:
        return self._derived["context_params"]  # type: ignore[no-any-return]

    def validate(self, args: Any) -> list[SchemaError]:
        """Schema errors of `args` (an empty list when they are valid); else an argument the
        function does not take is one (`_rowcheck.accepted`), where an open schema admits it."""
        extra = [SchemaError(*e) for e in _rowcheck.unaccepted(self.name, self._derived["names"], args)]
        fast = self._derived["fast"]
        if fast is not None:
            try:
                fast(args)
                return extra
            except fastjsonschema.JsonSchemaException:
                pass
        validator: Draft202012Validator = self._derived["validator"]
        errors = sorted(validator.iter_errors(args), key=lambda e: list(map(str, e.absolute_path)))
        return [SchemaError(_rowcheck.pointer(e.absolute_path), e.message) for e in errors] or extra

    def role_for(self, args: Mapping[str, Any]) -> tuple[str | None, list[str]]:
        """The approver role after escalation, and the notes of the rule that matched. A rule
        that cannot decide (its predicate raises on what the model wrote) escalates, as a scope
        check that cannot decide denies: the arguments' type never lowers the role."""
        filled = with_defaults(self.schema, args)  # what the tool runs with, left-out arguments too
        for rule in self.escalate:
            tested = filled if "arg" in rule.rule else args  # a `when` predicate sees what was given
            try:
                matched = rule.predicate(tested)
            except Exception as exc:
                return rule.role, [f"{rule.note}: could not be checked ({type(exc).__name__})"]
            if matched:
                detail = rule.describe(tested) if rule.describe else ""
                return rule.role, [f"{rule.note}: {detail}" if detail else rule.note]
        return self.approver_role, []

    def subject_of(self, args: Mapping[str, Any]) -> dict[str, Any] | None:
        """The aggregate root this call acts on, e.g. {"order_id": "1042"}; None if undeclared.

        A subject argument that is a list names a set (an email's recipients): its items in one
        order, each once (`_as_set`), so a model that writes the same recipients in another
        order, or one twice, names the same subject, and a replay of its message finds the same
        operation (the subject is part of the intent key) and the same history. A call with none
        of its subject arguments names no subject (None): it is keyed by its arguments, not by
        one subject {arg: null} that every such call of every session would share (an empty list, an
        empty set, names none either). An argument
        left out names its schema's default: what the tool runs with (as `role_for`)."""
        filled = with_defaults(self.schema, args) if self.subject else args
        subject = {arg: _as_set(filled.get(arg)) for arg in self.subject}
        return subject if any(v is not None and v != [] for v in subject.values()) else None

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of the row's canonical form: effect, roles, subject, schema, checks by name (and
        the description when `pin_description`)."""
        return digest(self.canonical())

    def canonical(self) -> dict[str, Any]:
        pinned: dict[str, Any] = {"description": self.description} if self.pin_description else {}
        if self.shadow:
            pinned["shadow"] = True
        return {
            "name": self.name,
            "effect": str(self.effect),
            "reversibility": str(self.reversibility),
            "approver_role": self.approver_role,
            "owner": self.owner,
            "subject": list(self.subject),
            "schema": self.schema,
            "escalate": [{"role": r.role, **r.rule} for r in self.escalate],
            "fn": _qualname(self.fn),
            "scope": _qualname(self.scope),
            "confirm": _qualname(self.confirm),
            "snapshot": _qualname(self.snapshot),
            "definite_failures": sorted(_qualname(t) or "" for t in self.definite_failures),
            "unknown_outcome": sorted(_qualname(t) or "" for t in self.unknown_outcome),
            **pinned,
        }


class EffectTable:
    """The registry of tools and of which agent may call which."""

    def __init__(
        self,
        specs: Iterable[ToolSpec] = (),
        *,
        allow: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        self._specs: dict[str, ToolSpec] = {}
        self._allow: dict[str, frozenset[str]] = {}
        self._policies: list[Policy] = []  # of the gates built over it (`bind`)
        for spec in specs:
            self.register(spec)
        for agent, names in (allow or {}).items():
            self.allow(agent, names)

    def register(self, spec: ToolSpec) -> ToolSpec:
        if not isinstance(spec, ToolSpec):  # a dict or a `rows` Row: no row's checks have run on it
            raise TypeError(f"an EffectTable holds ToolSpec rows, not {type(spec).__name__}: {spec!r}")
        if spec.name in self._specs:
            raise TableError(spec.name, "name", "a tool of this name is already registered")
        for policy in self._policies:  # a row added after a gate was built meets its policy too
            spec.check_policy(policy)
        self._specs[spec.name] = spec
        self.__dict__.pop("fingerprint", None)
        return spec

    def bind(self, policy: Policy) -> None:
        """Check every row against a gate's `policy`, and every row registered from now on."""
        for spec in self:
            spec.check_policy(policy)
        if policy not in self._policies:  # one table under many gates: each policy once
            self._policies.append(policy)

    def allow(self, agent_id: str, names: Iterable[str]) -> None:
        """Set the tools `agent_id` may call; each must already be a row of the table."""
        if isinstance(names, str):  # its letters would be the names
            raise TypeError(f"allow takes a list of tool names: allow({agent_id!r}, [{names!r}])")
        wanted = frozenset(names)
        if not (isinstance(agent_id, str) and agent_id and all(isinstance(n, str) for n in wanted)):
            raise TableError(repr(agent_id), "allowlist", "an agent id and its tool names must be text")
        for name in sorted(wanted - self._specs.keys()):
            raise TableError(
                name, "allowlist", f"agent {agent_id!r} is allowed a tool the table does not have"
            )
        self._allow[agent_id] = wanted
        self.__dict__.pop("fingerprint", None)

    def allow_all(self, agent_id: str) -> None:
        """Let `agent_id` call every tool registered so far."""
        self.allow(agent_id, self._specs)

    def get(self, name: str) -> ToolSpec | None:
        try:
            return self._specs.get(name)
        except TypeError:  # an unhashable name (a list or dict a caller passed through) names no row
            return None

    def __getitem__(self, name: str) -> ToolSpec:
        return self._specs[name]

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> typing.Iterator[ToolSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def allowed(self, agent_id: str, name: str) -> bool:
        """Deny by default: an agent without an allowlist may call nothing."""
        names = self._allow.get(agent_id)
        return names is not None and name in names

    def allowlist(self, agent_id: str) -> frozenset[str]:
        return self._allow.get(agent_id, frozenset())

    def agents(self) -> list[str]:
        """The agents that have an allowlist, sorted."""
        return sorted(self._allow)

    def shadowed(self, names: Iterable[str] | None = None, *, shadow: bool = True) -> EffectTable:
        """A copy of this table with the gated rows `names` (default: every gated row) in shadow
        mode, or live again with `shadow=False`. A call proposed in shadow never runs live."""
        if isinstance(names, str):  # its letters would be the names
            raise TypeError(f"shadowed takes a list of tool names: shadowed([{names!r}])")
        wanted = None if names is None else frozenset(names)
        for name in sorted((wanted or frozenset()) - self._specs.keys()):
            raise TableError(name, "shadow", "the table has no row of this name")
        for name in sorted(n for n in wanted or () if not Policy().gates(self._specs[n].effect)):
            raise TableError(name, "shadow", f"a {self._specs[name].effect} row runs at once: no shadow mode")
        table = EffectTable(
            dataclasses.replace(s, shadow=shadow)
            if (wanted is None or s.name in wanted) and Policy().gates(s.effect)
            else s
            for s in self._specs.values()
        )
        for agent, names_ in self._allow.items():
            table.allow(agent, names_)
        return table

    def replace(self, spec: ToolSpec) -> EffectTable:
        """A copy of this table with one row replaced (e.g. a tool reclassified)."""
        if spec.name not in self._specs:  # a misspelt name: the row it meant is not reclassified
            raise TableError(spec.name, "replace", "the table has no row of this name")
        table = EffectTable([spec if s.name == spec.name else s for s in self._specs.values()])
        for agent, names in self._allow.items():
            table.allow(agent, names)
        return table

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of every row's fingerprint and every allowlist."""
        return digest(
            {
                "rows": {name: spec.fingerprint for name, spec in sorted(self._specs.items())},
                "allow": {agent: sorted(names) for agent, names in sorted(self._allow.items())},
            }
        )

    @classmethod
    def from_toml(cls, source: str | Path, bindings: Mapping[str, Callable[..., Any]]) -> EffectTable:
        """Load a table from TOML owned by the downstream teams, binding names to callables.

        ``source`` is a path, or TOML text when it contains a newline. Each ``[tools.NAME]``
        takes ``effect`` (or a foreign label), ``fn`` (a name in ``bindings``, default NAME),
        ``approver_role``, ``owner``, ``reversibility``, ``subject``, ``schema``, ``scope``,
        ``confirm``, ``snapshot``, ``reconcile`` (names in ``bindings``), and ``escalate``
        (a list of rules, see `Escalate.from_rule`). ``[agents]`` maps agent ids to tool lists.
        """
        from ._toml import load_toml  # TOML loading builds rows; it imports this module

        return load_toml(source, bindings)
