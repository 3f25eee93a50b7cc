"""Round 15: an approver id that shows no character is refused where approvers are registered."""

from __future__ import annotations

from pathlib import Path

import pytest

from effectgate.errors import TableError
from effectgate.web import ApproverRegistry, RegisteredApprover

from .conftest import _hashed


@pytest.mark.parametrize("blank", [" ", "\u200b", "\u3164"])
def test_an_approvers_file_whose_id_shows_no_character_does_not_load(tmp_path: Path, blank: str) -> None:
    """Such an id signed in, then every approval it made raised (Approver refuses it): a 500."""
    path = tmp_path / "approvers.toml"
    path.write_text(f'[[approver]]\nid = "{blank}"\nrole = "finance"\nsecret = "{_hashed("pw")}"\n')
    with pytest.raises(ValueError, match=r"approvers.toml:1: .*shows no character"):
        len(ApproverRegistry.from_toml(path))


def test_a_registry_built_in_python_refuses_the_same_id() -> None:
    with pytest.raises(TableError, match="shows no character"):
        ApproverRegistry([RegisteredApprover(" ", "finance", _hashed("pw"))])
