"""The proxy's gate on the approving side (`proxy_app`, for `--app effectgate.mcp:proxy_app` with
`effectgate approve`, `deny`, `serve` and `audit`): the table built the way the proxy builds it,
and every approval checked against its upstream as it is when it is decided or run.

**An approval is re-derived from its upstream before it is approved or executed.** The table is
read from the upstreams when the process starts, and an inbox (`effectgate serve --execute`) may
run for days. So `approve` and `execute` first re-list the upstream that serves the approval's
tool (the prefix of its served name) and derive the row again: when its fingerprint is not the
one the approval was proposed under (the upstream changed the tool's description, schema or
annotations since, or no longer serves it), the refusal is recorded (`mismatch`, as the proxy
records a re-issued call whose tool changed), `PolicyViolation(code="reclassified")` is raised,
and nothing is decided or run. An upstream that cannot be listed refuses too
(`PolicyViolation(code="upstream_unreachable")`, from its `UpstreamUnreachable`: a refusal the
inbox and the commands report as such). A denial is not checked: closing an approval is always safe.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from .._ledger import context_of
from .._seal import approval_verifies
from ..context import Approver
from ..effects import Policy
from ..errors import PolicyViolation, TableError, TokenError
from ..gate import EffectGate
from ..outcomes import Decision, Executed
from ..stores.protocol import Store
from ..stores.records import ApprovalRow
from ..table import EffectTable, ToolSpec
from ..tokens import Keyring
from ._config import ENV_AGENT, ENV_CONFIG, ProxyConfig, ProxyConfigError, load_config, split_served
from ._connection import run_apart
from ._upstream import (
    Connection,
    UpstreamListingError,
    UpstreamUnreachable,
    spec_for,
    specs_for,
    table_of,
)

#: The fingerprint of the row a served tool's upstream makes for it now (None: not served now).
CurrentRow = Callable[[str], Coroutine[Any, Any, str | None]]


class ApprovingGate(EffectGate):
    """An `EffectGate` whose `approve` and `execute` first check the approval's row against the
    upstream's listing now (`current_row`; see the module docstring)."""

    def __init__(self, table: EffectTable, store: Store, *, current_row: CurrentRow, **options: Any) -> None:
        super().__init__(table, store, **options)
        self._current_row = current_row

    def approve(self, approval_id: str, *, version: int, approver: Approver) -> Decision:
        row = self._approval(approval_id)
        if row is not None:
            self._compare(row, run_apart(self._row_now(row.tool)))
        return super().approve(approval_id, version=version, approver=approver)

    def execute(self, token: str, args: Mapping[str, Any] | None = None) -> Executed:
        row = self._approval(_approval_id(token))
        if row is not None:
            self._compare(row, run_apart(self._row_now(row.tool)))
        return super().execute(token, args)

    async def aexecute(self, token: str, args: Mapping[str, Any] | None = None) -> Executed:
        row = await asyncio.to_thread(self._approval, _approval_id(token))
        if row is not None:
            current = await self._row_now(row.tool)
            await asyncio.to_thread(self._compare, row, current)
        return await super().aexecute(token, args)

    async def _row_now(self, tool: str) -> str | None:
        """`current_row(tool)`; an upstream that cannot be listed now refuses (nothing decided)."""
        try:
            return await self._current_row(tool)
        except (UpstreamUnreachable, UpstreamListingError) as exc:
            message = f"{exc}: nothing was decided or run; try again once the upstream answers"
            raise PolicyViolation(message, code="upstream_unreachable") from exc

    def _approval(self, approval_id: str | None) -> ApprovalRow | None:
        """The stored approval (None: the gate refuses an unknown one, a bad token, or a record
        that does not verify, itself: nothing is compared or recorded from an edited row)."""
        if approval_id is None:
            return None
        with self.store.reading() as conn:
            row = self.store.approval(conn, approval_id)
        return row if row is not None and approval_verifies(self.keyring, row) else None

    def _compare(self, row: ApprovalRow, current: str | None) -> None:
        """Refuse, recorded, when the upstream's row now is not the one `row` was proposed under."""
        if current == row.row_fingerprint:
            return
        message = (
            f"{row.tool} changed upstream (its schema, description or annotations) since approval "
            f"{row.id} was proposed, or is no longer served: the reviewer did not approve this tool. "
            "Nothing was decided or run; the call needs a fresh proposal."
        )
        self.refuse(row.tool, context_of(row), code="mismatch", message=message, approval_id=row.id)
        raise PolicyViolation(message, code="reclassified")


def _approval_id(token: str) -> str | None:
    try:
        return Keyring.read(token).approval_id
    except TokenError:  # malformed: the gate refuses it, and records that, itself
        return None


def current_row(config: ProxyConfig, policy: Policy) -> CurrentRow:
    """`CurrentRow` over the configured upstreams: the served name's prefix picks the upstream,
    whose listing is read now (a session of its own)."""
    by_prefix = {u.prefix: u for u in config.servers}

    async def row_now(name: str) -> str | None:
        prefix, tool = split_served(name)
        upstream = by_prefix.get(prefix)
        if upstream is None:
            return None
        connection = Connection(upstream)
        listed = [t for t in await connection.list_tools() if t.name == tool]
        if len(listed) != 1:  # not listed, or listed twice (not served either: `specs_for`)
            return None
        try:
            return spec_for(upstream, connection, listed[0], policy).fingerprint
        except TableError:  # listed, but not servable now
            return None

    return row_now


def proxy_app(store: Store, *, keyring: Keyring | None = None, policy: Policy | None = None) -> EffectGate:
    """The proxy's gate for the approving side's commands (`--app effectgate.mcp:proxy_app`
    with `effectgate approve`, `deny`, `serve` and `audit`): the table built the way the proxy
    builds it, from the configuration in $EFFECTGATE_MCP_PROXY_CONFIG and the upstreams' listings
    read now, and each approval checked against its upstream again when it is approved or run
    (see the module docstring). A call it executes (`effectgate serve --execute`) opens a session
    of its own to the upstream."""
    path = os.environ.get(ENV_CONFIG)
    if not path:
        raise ProxyConfigError(f"proxy_app reads the proxy's configuration from ${ENV_CONFIG}: set it")
    config = load_config(path)
    policy = policy or Policy()

    async def listings() -> list[list[ToolSpec]]:
        rows = []
        for upstream in config.servers:
            connection = Connection(upstream)
            rows.append(specs_for(upstream, connection, await connection.list_tools(), policy))
        return rows

    table = table_of(run_apart(listings()), os.environ.get(ENV_AGENT) or config.agent)
    return ApprovingGate(
        table, store, policy=policy, keyring=keyring, current_row=current_row(config, policy)
    )


__all__ = ["ApprovingGate", "CurrentRow", "current_row", "proxy_app"]
