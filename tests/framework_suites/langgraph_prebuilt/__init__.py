"""langgraph-prebuilt's own ToolNode tests, run with the gated node swapped in (see conftest.py)."""
