"""The adapter contract on LangGraph: the gated node in a hand-built graph, on both checkpointers."""

from __future__ import annotations

import pytest

from tests.conformance.adapters import AdapterContract, MakeHarness

from .conftest import MakeLangGraphHarness


class TestLangGraphNode(AdapterContract):
    @pytest.fixture
    def make_harness(self, lg_harness: MakeLangGraphHarness) -> MakeHarness:
        return lg_harness
