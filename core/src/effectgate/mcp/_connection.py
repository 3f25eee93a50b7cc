"""An upstream MCP server's client session (`Connection`), its listing, and how its failures
are told apart.

**Errors.** A transport failure (connection lost, no answer within the server's `timeout`, a
protocol error) is `UpstreamUnreachable`, an `OutcomeUnknown`: the call may or may not have
reached the upstream. An error result (`isError`) of a write or gated call is
`UpstreamToolError`; what either means for the call is the row's (`_upstream`).

**A session that closed is started again.** The proxy holds one session per upstream, in a task
of its own. A request that finds it closed (the upstream's process exited between two calls, or
during this one) starts it again for the requests after it (once, whichever requests found it
closed). A listing is then sent once more, on the new session, and every call lists its upstream
first, so a call made after the upstream exited reaches a restarted one (and is routed by what
that one lists), never the dead session. A call that found the session closed is not resent: a
write or gated call may have reached the upstream (its outcome is unknown), and a read would reach
a process whose listing no call was checked against (it may have been upgraded).

**Listings are bounded** (`MAX_PAGES` pages, `MAX_TOOLS` tools, no repeated cursor), and a
failure to connect or list raises an error naming the server (`UpstreamListingError`,
`UpstreamUnreachable`), never the SDK's exception group.

An upstream process sees the configured `env` and the SDK's minimal safe environment (PATH,
HOME, ...), never the proxy's own environment, so never $EFFECTGATE_KEYRING.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from typing import Any, TypeVar, cast

import anyio
import mcp.types as types
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from .._flowjobs import NotStarted
from .._logging import logger
from ..errors import EffectGateError, OutcomeUnknown
from ._config import Http, Stdio, Upstream

log = logger(__name__)
T = TypeVar("T")

#: The `_meta` key that carries the idempotency key of a write or gated call upstream.
IDEMPOTENCY_META = "effectgate/idempotency_key"


class UpstreamToolError(EffectGateError):
    """The upstream answered a call with an error result (`isError`); `result` is it as stored."""

    def __init__(self, server: str, tool: str, result: dict[str, Any]) -> None:
        self.server, self.tool, self.result = server, tool, result
        texts = [b.get("text", "") for b in result.get("content", []) if isinstance(b, dict)]
        # The upstream's words as repr: the message is logged, and may hold control characters.
        super().__init__(f"{server}: {tool!r} answered with an error: {' '.join(texts)[:200]!r}")


class UpstreamUnreachable(OutcomeUnknown):
    """The upstream could not be reached (started, connected to, answered): a call's outcome is
    unknown. The message names the server."""


class UpstreamListingError(EffectGateError):
    """An upstream's tool listing is out of bounds (more than `MAX_PAGES` pages or `MAX_TOOLS`
    tools, or a page cursor that repeats): none of it is used. The message names the server."""

    def __init__(self, server: str, problem: str) -> None:
        self.server = server
        super().__init__(f"upstream {server!r}: {problem}; its listing was not used")


#: Bounds on one upstream's `tools/list`: every call re-reads its upstream's listing first, so an
#: upstream that pages forever must not hold its calls (or the proxy's memory) for ever.
MAX_PAGES = 100
MAX_TOOLS = 10_000


def _leaf(exc: BaseException) -> BaseException:
    """The first exception inside the SDK's (nested) exception groups: what actually failed."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _closed(exc: BaseException) -> bool:
    """Whether `exc` says the session itself is gone (not a slow or failing request)."""
    leaf = _leaf(exc)
    lost = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)
    return isinstance(leaf, lost) or (isinstance(leaf, MCPError) and leaf.code == types.CONNECTION_CLOSED)


def unreachable(server: str, doing: str, exc: BaseException) -> UpstreamUnreachable:
    """`UpstreamUnreachable` naming the server and what failed (its text as repr: control chars)."""
    leaf = _leaf(exc)
    text = str(leaf) or ("no answer within the server's timeout" if isinstance(leaf, TimeoutError) else "")
    return UpstreamUnreachable(f"upstream {server!r}: {doing} failed: {type(leaf).__name__}: {text!r}")


def client_for(target: Any, timeout: float | None = None) -> Client:
    """An `mcp.Client` for a configured upstream (or an in-process server, in tests), each of
    whose requests waits at most `timeout` seconds for its answer (the SDK sends the upstream a
    cancellation, and the session stays usable). Responses are never cached: every listing is the
    upstream's current one."""
    if isinstance(target, Stdio):
        target = StdioServerParameters(
            command=target.command, args=list(target.args), env=dict(target.env) or None, cwd=target.cwd
        )
    elif isinstance(target, Http):
        target = target.url
    return Client(target, cache=None, read_timeout_seconds=timeout)


def _payload(result: types.CallToolResult) -> dict[str, Any]:
    """The part of an upstream result the proxy stores and forwards (never its own `_meta`)."""
    return {
        "content": [
            block.model_dump(by_alias=True, mode="json", exclude_none=True) for block in result.content
        ],
        "structuredContent": result.structured_content,
        "isError": result.is_error,
    }


class Connection:
    """One upstream's client session: held open while the proxy runs (`open`), by a task of its
    own, and started again when it closed (its process exited); or, unopened (an approving
    process's table, `proxy_app`), a session of its own for each request."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self._client: Client | None = None
        self._held: set[asyncio.Task[None]] | None = None  # the sessions' tasks, once opened
        self._scope: anyio.CancelScope | None = None  # ends the held session (replaced, or on exit)
        self._lock, self._closing = anyio.Lock(), False
        self._loop: asyncio.AbstractEventLoop | None = None  # the held session's, once opened

    @property
    def name(self) -> str:
        return self.upstream.name

    async def open(self, stack: AsyncExitStack) -> None:
        """Connect (start the process, or reach the URL); else `UpstreamUnreachable`. The session,
        and any started again, is closed when `stack` is."""
        self._held, self._loop = set(), asyncio.get_running_loop()
        stack.push_async_callback(self._close)
        await self._connect()

    async def _close(self) -> None:
        self._closing = True
        if self._scope is not None:
            self._scope.cancel()
        await asyncio.gather(*self._held or ())

    async def _connect(self) -> None:
        assert self._held is not None
        started: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._hold(started))
        self._held.add(task)
        task.add_done_callback(self._held.discard)
        failed = await started
        if failed is not None:  # the SDK raises an ExceptionGroup, or OSError for a bad command
            raise unreachable(self.name, "connecting", failed) from failed

    async def _hold(self, started: asyncio.Future[Exception | None]) -> None:
        """Hold one session until its scope is cancelled (a failure to open it goes to `started`)."""
        scope = anyio.CancelScope()
        try:
            async with client_for(self.upstream.target, self.upstream.timeout) as client:
                self._client, self._scope = client, scope
                if not started.done():  # (its waiter may be gone: cancelled)
                    started.set_result(None)
                with scope:
                    if not self._closing:
                        await anyio.sleep_forever()
        except Exception as exc:  # or a session that broke, closing: nothing is left to lose
            if not started.done():
                started.set_result(exc)
            log.info("upstream %r: a session ended: %s", self.name, type(_leaf(exc)).__name__)

    async def _request(self, send: Callable[[Client], Awaitable[T]], *, resend: bool) -> T:
        """`send` on the session. A held session found closed is started again (once, whichever
        requests found it), and with `resend` (a listing) sent again on the new one."""
        if self._held is None:
            async with client_for(self.upstream.target, self.upstream.timeout) as fresh:
                return await send(fresh)
        for attempt in (1, 2) if resend else (2,):
            client = self._client
            assert client is not None
            try:
                return await send(client)
            except Exception as exc:
                if not _closed(exc):
                    raise
                async with self._lock:  # the first to find it closed starts it again
                    if self._client is client and self._scope is not None:
                        self._scope.cancel()
                        await self._connect()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def list_tools(self) -> list[types.Tool]:
        """Every tool the upstream lists now (all pages); `UpstreamListingError` past the bounds
        (see `_pages`), `UpstreamUnreachable` when it fails or outlasts the server's `timeout`."""
        try:
            with anyio.fail_after(self.upstream.timeout):
                return await self._request(lambda client: _pages(self.name, client), resend=True)
        except UpstreamListingError:
            raise
        except Exception as exc:
            leaf = _leaf(exc)
            if isinstance(leaf, UpstreamListingError):  # ours, wrapped by the session's task group
                raise leaf from None
            raise unreachable(self.name, "listing its tools", exc) from exc

    async def call(self, tool: str, arguments: dict[str, Any], *, key: str | None) -> dict[str, Any]:
        """Call one upstream tool (once: never resent, see the module docstring); with `key` (a
        write or gated call) an error result raises `UpstreamToolError`; a transport failure or no
        answer in `timeout`, `UpstreamUnreachable`."""
        meta = cast(types.RequestParamsMeta, {IDEMPOTENCY_META: key}) if key is not None else None
        try:
            result = await self._request(
                lambda client: client.call_tool(tool, arguments, meta=meta), resend=False
            )
        except Exception as exc:  # anything between here and the upstream: the outcome is unknown
            raise unreachable(self.name, f"calling {tool!r}", exc) from exc
        payload = _payload(result)
        if result.is_error and key is not None:
            raise UpstreamToolError(self.name, tool, payload)
        return payload

    def call_blocking(self, tool: str, arguments: dict[str, Any], *, key: str | None) -> dict[str, Any]:
        """`call`, from a worker thread (the gate runs a proxied tool in one): on the held
        session's loop, where a client's cancellation of the gate's call never reaches it (the
        upstream's request is not cancelled half-way; the gate stores its outcome), else on a loop
        of its own (an unopened connection: a session per request). `NotStarted` (nothing sent) on
        the loop's own thread, which would wait on itself (a synchronous gate call from the proxy's
        loop), or once that loop no longer runs (the proxy has exited)."""
        loop = self._loop
        if loop is None:
            return run_apart(self.call(tool, arguments, key=key))
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop or self._closing or not loop.is_running():
            raise NotStarted(f"{tool!r} not sent: call it through the running proxy (acall, aexecute)")
        return asyncio.run_coroutine_threadsafe(self.call(tool, arguments, key=key), loop).result()


def run_apart(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion from synchronous code, on a loop of its own (on a thread of its own
    when this thread already runs an event loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def _pages(server: str, client: Client) -> list[types.Tool]:
    """Follow `tools/list` pages within the bounds: `MAX_PAGES`, `MAX_TOOLS`, no repeated cursor."""
    tools: list[types.Tool] = []
    cursors: set[str] = set()
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        if len(tools) > MAX_TOOLS:
            raise UpstreamListingError(server, f"it lists more than {MAX_TOOLS} tools")
        cursor = page.next_cursor
        if not cursor:
            return tools
        if cursor in cursors:
            raise UpstreamListingError(server, f"its tools/list cursor {cursor[:40]!r} repeats")
        cursors.add(cursor)
    raise UpstreamListingError(server, f"its tools/list has more than {MAX_PAGES} pages")


__all__ = [
    "IDEMPOTENCY_META",
    "MAX_PAGES",
    "MAX_TOOLS",
    "Connection",
    "UpstreamListingError",
    "UpstreamToolError",
    "UpstreamUnreachable",
    "client_for",
    "unreachable",
]
