"""Round 23: $EFFECTGATE_KEYRING set but empty (a secret store that injected nothing) is refused
with a clear error; it used to fall back, silently, to a key file beside a SQLite database, which
the gate then created (grants signed with a key no other host holds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from effectgate import EffectGate, Keyring, open_store
from effectgate.cli import main
from effectgate.examples.shop import Shop


@pytest.mark.parametrize("value", ["", "  ", "\n"])
def test_an_empty_variable_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("EFFECTGATE_KEYRING", value)
    with pytest.raises(ValueError, match=r"\$EFFECTGATE_KEYRING is set but empty"):
        Keyring.from_env()


def test_an_unset_variable_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EFFECTGATE_KEYRING", raising=False)
    assert Keyring.from_env() is None


def test_a_gate_with_an_empty_variable_makes_no_key_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("EFFECTGATE_KEYRING", "")
    db = tmp_path / "shop.db"
    store = open_store(f"sqlite:///{db}")
    store.setup()
    try:
        with pytest.raises(ValueError, match="set but empty"):
            EffectGate(Shop().table(), store)
    finally:
        store.close()
    assert not Path(f"{db}.keys").exists()


def test_setup_with_an_empty_variable_sets_nothing_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EFFECTGATE_KEYRING", "")
    db = tmp_path / "shop.db"
    assert main(["--db", f"sqlite:///{db}", "setup"]) == 2
    err = capsys.readouterr().err
    assert "$EFFECTGATE_KEYRING is set but empty" in err
    assert "nothing was set up" in err
    assert err.count("$EFFECTGATE_KEYRING") == 1
    assert not db.exists()
    assert not Path(f"{db}.keys").exists()
