"""The adapter contract on the OpenAI Agents SDK: gate_agent, every pause through a serialized RunState."""

from __future__ import annotations

import pytest

from tests.conformance.adapters import AdapterContract, MakeHarness

from .conftest import MakeOpenAIHarness


class TestOpenAIAgents(AdapterContract):
    @pytest.fixture
    def make_harness(self, oa_harness: MakeOpenAIHarness) -> MakeHarness:
        return oa_harness
