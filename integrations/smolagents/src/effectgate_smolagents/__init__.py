"""effectgate for smolagents (in progress)."""

__version__ = "0.1.0"
