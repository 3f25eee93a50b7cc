"""Fixtures for the smolagents suite: the harness, and no real model anywhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from effectgate.testing import Script
from tests._helpers import refuse_remote_sockets
from tests.conformance.adapters import ShopGate

from ._harness import SmolagentsHarness

_MODEL_KEYS = ("OPENAI_API_KEY", "HF_TOKEN", "HUGGINGFACE_API_KEY", "ANTHROPIC_API_KEY")


@pytest.fixture(autouse=True)
def no_real_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """No model keys and no socket off this machine: a real model cannot be reached."""
    for key in _MODEL_KEYS:
        monkeypatch.delenv(key, raising=False)
    refuse_remote_sockets(monkeypatch)


MakeSmolHarness = Callable[..., SmolagentsHarness]


@pytest.fixture
def smol_harness(shop_gate: ShopGate) -> MakeSmolHarness:
    def make(script: Script, **options: Any) -> SmolagentsHarness:
        return SmolagentsHarness(shop_gate.gate, script, **options)

    return make
