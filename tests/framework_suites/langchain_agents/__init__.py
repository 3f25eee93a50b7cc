"""langchain's own create_agent tests, run with effectgate's middleware swapped in (see conftest.py)."""
