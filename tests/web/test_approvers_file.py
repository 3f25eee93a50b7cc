"""approvers.toml is validated when it is loaded: a bad entry names the file, its line and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from effectgate.cli import main
from effectgate.web import ApproverRegistry, hash_secret

GOOD = hash_secret("a long secret")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "approvers.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ('id = "fiona"\nrole = "finance"\nsecret = "hunter2"', "expected scrypt"),
        ('id = "fiona"\nrole = "finance"\nsecret = "scrypt$16384$8$1$zz$00"', "hex"),
        ('id = "fiona"\nrole = "finance"\nsecret = "scrypt$16384$8$1$00$00"', "32 bytes"),
        ('id = "fiona"\nrole = ""', "non-empty role"),
        ('role = "finance"', "non-empty id"),
        ('id = "fiona"\nrole = "finance"\npassword = "x"', "unknown keys"),
    ],
    ids=["plain-password", "not-hex", "short-hash", "no-role", "no-id", "unknown-key"],
)
def test_a_bad_entry_names_its_line_and_the_fix(tmp_path: Path, entry: str, problem: str) -> None:
    """The second entry is bad: the error names the file and the line of its [[approver]] header,
    what is wrong, and never echoes the secret's value."""
    path = write(
        tmp_path,
        f'[[approver]]\nid = "sam"\nrole = "support_lead"\nsecret = "{GOOD}"\n\n[[approver]]\n{entry}\n',
    )
    with pytest.raises(ValueError, match=r"approvers\.toml") as raised:
        ApproverRegistry.from_toml(path)
    message = str(raised.value)
    assert f"{path}:6:" in message
    assert problem in message
    assert "hunter2" not in message


def test_serve_refuses_a_bad_file_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`effectgate serve` with a malformed secret exits 2 naming the line, before it listens."""
    path = write(tmp_path, '[[approver]]\nid = "fiona"\nrole = "finance"\nsecret = "hunter2"\n')
    code = main(["--db", f"sqlite:///{tmp_path}/x.db", "serve", "--approvers", str(path)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{path}:1:" in err
    assert "effectgate hash-secret" in err


def test_a_good_file_loads(tmp_path: Path) -> None:
    """A well-formed file loads every approver with its role."""
    path = write(
        tmp_path, f'[[approver]]\nid = "fiona"\nrole = "finance"\nsecret = "{GOOD}"\nname = "Fiona"\n'
    )
    registry = ApproverRegistry.from_toml(path)
    found = registry.check_secret("fiona", "a long secret")
    assert found is not None
    assert found.role == "finance"
