"""The adapter contract on smolagents: a ToolCallingAgent behind GatedAgent."""

from __future__ import annotations

import pytest

from tests.conformance.adapters import AdapterContract, MakeHarness

from .conftest import MakeSmolHarness


class TestSmolagentsToolCalling(AdapterContract):
    @pytest.fixture
    def make_harness(self, smol_harness: MakeSmolHarness) -> MakeHarness:
        return smol_harness
