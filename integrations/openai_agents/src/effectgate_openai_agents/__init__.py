"""effectgate for openai_agents (in progress)."""

__version__ = "0.1.0"
