from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar, cast

from .._rules import _context_params

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Effect:
    """One effect as the receiver saw it."""

    kind: str
    payload: Mapping[str, Any] = field(default_factory=dict[str, Any])
    idempotency_key: str | None = None


class EffectRecorder:
    """Counts effects where they land (the receiver), not where they were asked for. Thread-safe."""

    def __init__(self) -> None:
        self._effects: list[Effect] = []
        self._lock = threading.Lock()

    def record(self, kind: str, /, *, idempotency_key: str | None = None, **payload: Any) -> Effect:
        effect = Effect(kind, dict(payload), idempotency_key)
        with self._lock:
            self._effects.append(effect)
        return effect

    def wrap(self, kind: str, fn: Callable[P, R]) -> Callable[P, R]:
        """A function that records `kind` (with its keyword arguments) and then calls `fn`; for an
        async `fn`, an async function that records when it runs (an unawaited call ran nothing).
        A ToolContext argument is not a field: its idempotency key is the effect's key."""
        context_params, hints = _context_params(fn)

        def note(kwargs: Mapping[str, Any]) -> None:
            keys = [getattr(kwargs.get(name), "idempotency_key", None) for name in context_params]
            payload = {k: v for k, v in kwargs.items() if not k.startswith("_") and k not in context_params}
            with self._lock:
                self._effects.append(Effect(kind, payload, next((k for k in keys if k is not None), None)))

        def called(*args: P.args, **kwargs: P.kwargs) -> R:
            note(kwargs)
            return fn(*args, **kwargs)

        async def awaited(*args: P.args, **kwargs: P.kwargs) -> Any:
            note(kwargs)
            return await cast(Callable[P, Awaitable[Any]], fn)(*args, **kwargs)

        # async stays async: the gate refuses an async tool on a running loop before claiming it
        is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
        recorded = cast(Callable[P, R], awaited) if is_async else called
        recorded.__name__ = getattr(fn, "__name__", kind)
        recorded.__doc__ = fn.__doc__
        recorded.__wrapped__ = fn  # type: ignore[attr-defined]
        # fn's hints, resolved: a row derives fn's typed schema and its ToolContext parameters
        # from the wrapper (not untyped arguments the model would have to supply)
        recorded.__annotations__ = hints
        return recorded

    @property
    def effects(self) -> list[Effect]:
        with self._lock:
            return list(self._effects)

    def count(self, kind: str | None = None, /, **match: Any) -> int:
        """Effects of `kind` whose fields (the payload and `idempotency_key`) equal `match`; a
        field an effect never recorded matches nothing, not None. `kind` is positional: a field
        named "kind" is matched like any other."""

        def fields(e: Effect) -> Mapping[str, Any]:
            return {"idempotency_key": e.idempotency_key, **e.payload}

        return sum(
            1
            for e in self.effects
            if (kind is None or e.kind == kind)
            and all(k in (f := fields(e)) and f[k] == v for k, v in match.items())
        )

    def clear(self) -> None:
        with self._lock:
            self._effects.clear()
