"""Fixtures for the OpenAI Agents suite: the harness, and no real model or tracing anywhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from agents import set_tracing_disabled

from effectgate.testing import Script
from tests._helpers import refuse_remote_sockets
from tests.conformance.adapters import ShopGate

from ._harness import OpenAIAgentsHarness

set_tracing_disabled(True)


@pytest.fixture(autouse=True)
def no_real_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """No key, no tracing exporter, no socket off this machine: a real model cannot be reached."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    refuse_remote_sockets(monkeypatch)


MakeOpenAIHarness = Callable[..., OpenAIAgentsHarness]


@pytest.fixture
def oa_harness(shop_gate: ShopGate) -> MakeOpenAIHarness:
    def make(script: Script, **options: Any) -> OpenAIAgentsHarness:
        return OpenAIAgentsHarness(shop_gate.gate, script, **options)

    return make
