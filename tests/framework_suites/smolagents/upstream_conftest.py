# ruff: noqa
# Vendored from smolagents 1.26.0, tests/conftest.py (Apache-2.0, see LICENSE beside it), upstream commit
# 12c1bc820eca50ace6f80a21d90426d41d74f845 (tag v1.26.0). Test bodies unchanged.
# `pytest_plugins` (not allowed below the rootdir's conftest) commented out; conftest.py imports
# the two fixture modules instead.
from unittest.mock import patch

import pytest

from smolagents.agents import MultiStepAgent
from smolagents.monitoring import LogLevel


# Import fixture modules as plugins
# pytest_plugins = ["tests.fixtures.agents", "tests.fixtures.tools"]  (imported by conftest.py instead)

original_multi_step_agent_init = MultiStepAgent.__init__


@pytest.fixture(autouse=True)
def patch_multi_step_agent_with_suppressed_logging():
    with patch.object(MultiStepAgent, "__init__", autospec=True) as mock_init:

        def init_with_suppressed_logging(self, *args, verbosity_level=LogLevel.OFF, **kwargs):
            original_multi_step_agent_init(self, *args, verbosity_level=verbosity_level, **kwargs)

        mock_init.side_effect = init_with_suppressed_logging
        yield
