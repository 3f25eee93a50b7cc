"""`open_store` given a file path without a scheme (the README names the file `effectgate.db`):
SQLAlchemy's bare "Could not parse SQLAlchemy URL" named no fix. It is a StoreError that names
the URL to give, and quotes no URL that could hold a password; nothing is created."""

from __future__ import annotations

from pathlib import Path

import pytest

from effectgate.errors import StoreError
from effectgate.stores import open_store


def test_a_path_without_a_scheme_names_the_sqlite_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match=r"sqlite:///effectgate\.db"):
        open_store("effectgate.db")
    assert list(tmp_path.iterdir()) == []


def test_an_unparseable_url_with_a_password_is_not_quoted() -> None:
    with pytest.raises(StoreError) as caught:
        open_store("postgresql+psycopg://eve:s3cret@db:notaport/x")
    assert "s3cret" not in str(caught.value)
    assert "postgresql+psycopg://" in str(caught.value)
