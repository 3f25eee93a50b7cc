"""Fixtures for the LangGraph suite: checkpointers, the harness, and no real model anywhere."""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver

from effectgate import EffectGate
from effectgate.testing import Script
from effectgate_langgraph.testing import ScriptedChatModel
from tests._helpers import refuse_remote_sockets
from tests.conformance.adapters import ShopGate

from ._graph import LangGraphHarness

_MODEL_KEYS = (
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "GOOGLE_API_KEY",
    "MISTRAL_API_KEY",
    "GROQ_API_KEY",
    "LANGSMITH_API_KEY",
    "LANGCHAIN_API_KEY",
)


@pytest.fixture(autouse=True)
def no_real_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real model clients cannot be built or reach anything: no keys, no tracing, no remote socket."""
    for key in _MODEL_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("LANGSMITH_TRACING", "false")
    monkeypatch.setenv("LANGCHAIN_TRACING_V2", "false")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a real chat model was requested in a test; use ScriptedChatModel")

    import langchain.chat_models

    monkeypatch.setattr(langchain.chat_models, "init_chat_model", refuse)
    refuse_remote_sockets(monkeypatch)


@pytest.fixture(params=["memory", "sqlite"])
def checkpointer(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BaseCheckpointSaver[Any]]:
    if request.param == "memory":
        yield InMemorySaver()
        return
    conn = sqlite3.connect(tmp_path / "checkpoints.db", check_same_thread=False)
    yield SqliteSaver(conn)
    conn.close()


MakeLangGraphHarness = Callable[..., LangGraphHarness]


@pytest.fixture
def lg_harness(shop_gate: ShopGate, checkpointer: BaseCheckpointSaver[Any]) -> MakeLangGraphHarness:
    def make(script: Script, **options: Any) -> LangGraphHarness:
        return LangGraphHarness(shop_gate.gate, ScriptedChatModel(script=script), checkpointer, **options)

    return make


@pytest.fixture(params=["node", "agent"])
def node_or_agent(request: pytest.FixtureRequest, lg_harness: MakeLangGraphHarness) -> MakeLangGraphHarness:
    """The shop on the hand-built graph (GatedToolNode) or on create_agent (EffectGateMiddleware)."""

    def make(script: Script, **options: Any) -> LangGraphHarness:
        return lg_harness(script, agent=request.param == "agent", **options)

    return make


@pytest.fixture
def gates() -> Iterator[list[EffectGate]]:
    """Gates a test built, closed when it ends."""
    built: list[EffectGate] = []
    yield built
    for gate in built:
        gate.close()


@pytest.fixture
def keyed_db(store_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The store (SQLite file or PostgreSQL); PostgreSQL keeps no key file, so the key is set."""
    monkeypatch.setenv("EFFECTGATE_KEYRING", "k1:" + secrets.token_hex(32))
    return store_url
