"""Optional OpenTelemetry spans around the gate's operations: call, approve, execute.

Telemetry is never the record: the ledger is. Every touch of OpenTelemetry is guarded, so a
tracer, span processor or exporter that raises changes nothing the gate returns, raises or records
(the failure is logged at DEBUG and the operation goes on without its span).

`opentelemetry-api` is optional (`pip install "effectgate[otel]"`) and imported in one place,
`_api()`. Without it, or when the tracer does not record (no SDK configured, not sampled), a span
costs a function call or two and nothing else: attributes are built only for a recording span.

Spans: "effectgate.call" (`effectgate.tool`, `effectgate.effect`, `effectgate.outcome`
executed/pending/refused/invalid, `effectgate.refusal_code`, `effectgate.replay`, and the approval
id and version of a gated call), "effectgate.approve" (approval id, version, outcome grant/partial)
and "effectgate.execute" (approval id and version as the token claims them, outcome executed or
`error.type`). An exception is recorded on the span (an "exception" event with its type, never its
text: a tool's error may quote its arguments), which ends with status ERROR; a refusal is a value,
not an error. Never an argument value, a result or a token.

The facade's spans (`EffectGate.call`, `approve`, `execute` and their async forms) are current while
the operation runs, so a tool's own spans nest under them. The flows handed to adapters
(`gate.flows`, and each call of `call_step`) are traced too, without making their span current: a
flow's steps may run in different threads (the async driver), and a context attached in one step
cannot be detached in another.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

from ._logging import logger
from .errors import TokenError
from .outcomes import Decision, Executed, Grant, Outcome, Pending, Recorded, Refused
from .table import EffectTable
from .tokens import Keyring

log = logger(__name__)

T = TypeVar("T")
Attributes = dict[str, str | int | bool]

_UNSET: Any = object()
_otel: Any = _UNSET  # the opentelemetry API (trace, context modules), or None: looked up once


def _api() -> Any:
    """The OpenTelemetry API modules, or None when `opentelemetry-api` is not installed."""
    global _otel
    if _otel is _UNSET:
        try:
            from opentelemetry import context, trace
        except ImportError:
            _otel = None
        else:
            _otel = (trace, context)
    return _otel


def _outcome_attributes(outcome: Outcome) -> Attributes:
    attrs: Attributes = {"effectgate.outcome": type(outcome).__name__.lower()}
    if isinstance(outcome, Refused):
        attrs["effectgate.refusal_code"] = outcome.code
    if isinstance(outcome, (Executed, Pending)):
        attrs["effectgate.replay"] = outcome.replay
    approval_id = getattr(outcome, "approval_id", None)
    version = getattr(outcome, "version", None)
    if approval_id is not None:
        attrs["effectgate.approval_id"] = approval_id
    if version is not None:
        attrs["effectgate.version"] = version
    return attrs


def _decision_attributes(decision: Decision) -> Attributes:
    if isinstance(decision, Recorded):
        return {"effectgate.outcome": "shadow"}
    return {"effectgate.outcome": "grant" if isinstance(decision, Grant) else "partial"}


def _executed_attributes(executed: Executed) -> Attributes:
    return {"effectgate.outcome": "executed", "effectgate.replay": executed.replay}


def _abandoned(_: object) -> Attributes:
    return {"effectgate.outcome": "abandoned"}


def _token_attributes(token: str) -> Attributes:
    """The approval a token claims to be for (its public part; never the token itself)."""
    try:
        claims = Keyring.read(token)
    except TokenError:
        return {}
    return {"effectgate.approval_id": claims.approval_id, "effectgate.version": claims.version}


def _tracer(provider: Any) -> Any:
    """The tracer for effectgate's spans, or None without OpenTelemetry. With `provider` None it is
    the global provider's proxy, which follows a provider set later."""
    api = _api()
    if api is None:
        return None
    try:
        return api[0].get_tracer("effectgate", tracer_provider=provider)
    except Exception:
        log.debug("telemetry: no tracer", exc_info=True)
        return None


class Spans:
    """The gate's spans, on `provider`'s tracer (the global tracer provider when None)."""

    def __init__(self, table: EffectTable, provider: Any = None) -> None:
        self.table = table
        self.tracer = _tracer(provider)
        api = _api()
        proxy = None if api is None else getattr(api[0], "ProxyTracer", None)
        # the global provider's proxy: while no provider is set it can only answer no-op spans
        self._proxied = api[0] if proxy is not None and isinstance(self.tracer, proxy) else None

    def _silent(self) -> bool:
        """No span can record: no OpenTelemetry, or the global proxy before a provider is set.
        This reads the API's own module global (a start_span and is_recording() call cost a
        read about 1 us); were that name ever gone, spans are started as before."""
        if self.tracer is None:
            return True
        module = self._proxied
        return module is not None and getattr(module, "_TRACER_PROVIDER", _UNSET) is None

    # -- the operations

    def call(self, name: str, run: Callable[[], Outcome]) -> Outcome:
        if self._silent():
            return run()
        return self._run("effectgate.call", self._call_attributes, name, _outcome_attributes, run)

    async def acall(self, name: str, run: Callable[[], Awaitable[Outcome]]) -> Outcome:
        return await self._arun("effectgate.call", self._call_attributes, name, _outcome_attributes, run)

    def call_flow(self, name: str, inner: Generator[Any, Any, Outcome]) -> Generator[Any, Any, Outcome]:
        return self._flow("effectgate.call", self._call_attributes, name, _outcome_attributes, inner)

    def approve(self, approval_id: str, version: int, run: Callable[[], Decision]) -> Decision:
        if self._silent():
            return run()

        def attributes(_: object) -> Attributes:
            return {"effectgate.approval_id": approval_id, "effectgate.version": version}

        return self._run("effectgate.approve", attributes, None, _decision_attributes, run)

    def execute(self, token: str, run: Callable[[], Executed]) -> Executed:
        if self._silent():
            return run()
        return self._run("effectgate.execute", _token_attributes, token, _executed_attributes, run)

    async def aexecute(self, token: str, run: Callable[[], Awaitable[Executed]]) -> Executed:
        return await self._arun("effectgate.execute", _token_attributes, token, _executed_attributes, run)

    def execute_flow(self, token: str, inner: Generator[Any, Any, Executed]) -> Generator[Any, Any, Executed]:
        return self._flow("effectgate.execute", _token_attributes, token, _executed_attributes, inner)

    def refused_call(self, refused: Refused) -> None:
        """A call refused before it had a flow (a step's parallel calls): a span that ends at once."""
        span = self._start("effectgate.call", self._call_attributes, refused.tool)
        if span is not None:
            self._end(span, refused, _outcome_attributes)

    def _call_attributes(self, name: str) -> Attributes:
        attrs: Attributes = {"effectgate.tool": name}
        spec = self.table.get(name)
        if spec is not None:
            attrs["effectgate.effect"] = str(spec.effect)
        return attrs

    # -- guarded span handling: nothing here may change what the operation returns or raises

    def _start(self, name: str, attributes: Callable[[Any], Attributes], subject: Any) -> Any:
        """A started span that records, or None (no OpenTelemetry, not recording, or failing)."""
        if self._silent():
            return None
        try:
            span = self.tracer.start_span(name)
            if not span.is_recording():
                return None
        except Exception:
            log.debug("telemetry: starting span %s failed", name, exc_info=True)
            return None
        try:  # a span started is ended on every path: one not described goes on without
            span.set_attributes(attributes(subject))
        except Exception:
            log.debug("telemetry: describing span %s failed", name, exc_info=True)
        return span

    @staticmethod
    def _attach(span: Any) -> Any:
        try:
            trace, context = _api()
            return context.attach(trace.set_span_in_context(span))
        except Exception:
            log.debug("telemetry: making the span current failed", exc_info=True)
            return None

    @staticmethod
    def _detach(token: Any) -> None:
        if token is None:
            return
        try:
            _api()[1].detach(token)
        except Exception:
            log.debug("telemetry: detaching the span failed", exc_info=True)

    @staticmethod
    def _end(span: Any, value: Any, describe: Callable[[Any], Attributes]) -> None:
        try:
            span.set_attributes(describe(value))
        except Exception:
            log.debug("telemetry: describing the outcome failed", exc_info=True)
        try:
            span.end()
        except Exception:
            log.debug("telemetry: ending the span failed", exc_info=True)

    @staticmethod
    def _fail(span: Any, exc: BaseException) -> None:
        try:
            trace = _api()[0]
            span.set_attribute("error.type", type(exc).__qualname__)
            if isinstance(exc, TokenError):
                span.set_attribute("effectgate.token_refusal", exc.reason)
            # its type only: an exception's text (and its traceback's) may quote arguments
            span.add_event("exception", {"exception.type": type(exc).__qualname__})
            span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__qualname__))
        except Exception:
            log.debug("telemetry: recording the exception failed", exc_info=True)
        try:
            span.end()
        except Exception:
            log.debug("telemetry: ending the span failed", exc_info=True)

    def _run(
        self,
        name: str,
        attributes: Callable[[Any], Attributes],
        subject: Any,
        describe: Callable[[T], Attributes],
        run: Callable[[], T],
    ) -> T:
        span = self._start(name, attributes, subject)
        if span is None:
            return run()
        token = self._attach(span)
        try:
            value = run()
        except BaseException as exc:
            self._detach(token)
            self._fail(span, exc)
            raise
        self._detach(token)
        self._end(span, value, describe)
        return value

    async def _arun(
        self,
        name: str,
        attributes: Callable[[Any], Attributes],
        subject: Any,
        describe: Callable[[T], Attributes],
        run: Callable[[], Awaitable[T]],
    ) -> T:
        span = self._start(name, attributes, subject)
        if span is None:
            return await run()
        token = self._attach(span)  # this task's context: the worker threads copy it
        try:
            value = await run()
        except BaseException as exc:
            self._detach(token)
            self._fail(span, exc)
            raise
        self._detach(token)
        self._end(span, value, describe)
        return value

    def _flow(
        self,
        name: str,
        attributes: Callable[[Any], Attributes],
        subject: Any,
        describe: Callable[[T], Attributes],
        inner: Generator[Any, Any, T],
    ) -> Generator[Any, Any, T]:
        if self._silent():
            return inner  # no wrapper at all while no span can record
        return self._traced(name, attributes, subject, describe, inner)

    def _traced(
        self,
        name: str,
        attributes: Callable[[Any], Attributes],
        subject: Any,
        describe: Callable[[T], Attributes],
        inner: Generator[Any, Any, T],
    ) -> Generator[Any, Any, T]:
        span = self._start(name, attributes, subject)
        if span is None:
            return (yield from inner)
        try:
            value = yield from inner
        except GeneratorExit:  # the driver abandoned the flow (e.g. a framework's interrupt)
            self._end(span, None, _abandoned)
            raise
        except BaseException as exc:
            self._fail(span, exc)
            raise
        self._end(span, value, describe)
        return value
