"""Round 17: approvers.toml errors name the line of the entry at fault whatever the header's
spelling TOML allows (`[[approver]]  # note`, `[[ approver ]]`, `[["approver"]]`), and a duplicate
id names its file and line (it named neither: "tool 'fiona': approver: registered twice").
Reproduced first: the first entry's header was missed, so the second entry's error named line 5
of the third entry, or ":?"."""

from __future__ import annotations

from pathlib import Path

import pytest

from effectgate.web import ApproverRegistry, hash_secret

GOOD = hash_secret("a long secret")


@pytest.mark.parametrize(
    "header", ["[[approver]]  # sam", "[[ approver ]]", '[["approver"]]', "  [[approver]]"]
)
def test_a_bad_entry_is_named_by_its_own_line_whatever_the_header_spelling(
    tmp_path: Path, header: str
) -> None:
    path = tmp_path / "approvers.toml"
    path.write_text(
        f'{header}\nid = "sam"\nrole = "lead"\nsecret = "{GOOD}"\n'
        '[[approver]]\nid = "fiona"\nrole = ""\n'
        '[[approver]]\nid = "frank"\nrole = "finance"\n'
    )
    with pytest.raises(ValueError, match="non-empty role") as raised:
        ApproverRegistry.from_toml(path)
    assert f"{path}:5:" in str(raised.value)


def test_a_duplicate_id_names_its_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "approvers.toml"
    path.write_text(
        '[[approver]]\nid = "fiona"\nrole = "finance"\n\n[[approver]]\nid = "fiona"\nrole = "ops"\n'
    )
    with pytest.raises(ValueError, match="listed twice") as raised:
        ApproverRegistry.from_toml(path)
    assert f"{path}:5:" in str(raised.value)
