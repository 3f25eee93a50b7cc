"""What every adapter suite shares: the shop behind its gate on a fresh SQLite store, and no real
model for the tests that drive more than one framework (each framework's folder has its own
`no_real_models`, which overrides this one there)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from effectgate.testing import FakeClock
from tests._helpers import refuse_remote_sockets
from tests.conformance.adapters import ShopGate, open_shop_gate

_MODEL_KEYS = ("OPENAI_API_KEY", "HF_TOKEN", "HUGGINGFACE_API_KEY", "ANTHROPIC_API_KEY")


@pytest.fixture(autouse=True)
def no_real_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """No model key, no tracing export, no socket off this machine: a real model cannot be reached."""
    try:  # the OpenAI Agents SDK may be absent (a compat run installs one framework)
        from agents import set_tracing_disabled
    except ImportError:
        pass
    else:
        set_tracing_disabled(True)
    for key in _MODEL_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("LANGSMITH_TRACING", "false")
    monkeypatch.setenv("LANGCHAIN_TRACING_V2", "false")
    refuse_remote_sockets(monkeypatch)


@pytest.fixture
def shop_gate(sqlite_url: str, clock: FakeClock) -> Iterator[ShopGate]:
    with open_shop_gate(sqlite_url, clock) as parts:
        yield parts
