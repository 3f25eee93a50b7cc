"""Round 10: the governance commands (`export`, `verify`, `hold`, `redact`) through the command
line: an earlier export is never replaced unasked, verify's exit codes follow the documented
table, a hold is placed only on a user id that can match, an erasure that found nothing says so,
and a release records who and why."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from effectgate import open_store
from effectgate.redact import holds

from . import test_cli
from .test_cli import Run
from .test_cli_governance import executed  # noqa: F401 - the fixture

cli = test_cli.cli  # its fixtures: the command run in-process, and a clean environment
_cli_env = test_cli._cli_env


def _export(cli: Callable[..., Run], url: str, out: Path, *more: str) -> Run:
    return cli("export", "--db", url, "--out", str(out), "--settle", "0", *more)


def _events(url: str, kind: str) -> list[dict[str, object]]:
    with open_store(url) as store:
        return [json.loads(e.detail_json) for e in store.events() if e.kind == kind]


# -- 1. export --out never replaces an earlier export unless told to


def test_export_refuses_to_replace_an_earlier_export(
    executed: str,  # noqa: F811
    tmp_path: Path,
    cli: Callable[..., Run],
) -> None:
    """`export --out FILE` over an earlier export replaced it (and its signed manifest): the
    evidence it held was lost. A usage error now, both files untouched; `--force` replaces it."""
    out = tmp_path / "x.jsonl"
    assert _export(cli, executed, out).code == 0
    manifest = Path(f"{out}.manifest.json")
    before = out.read_bytes(), manifest.read_bytes()
    run = _export(cli, executed, out)
    assert run.code == 2, run
    assert "--force" in run.err
    assert (out.read_bytes(), manifest.read_bytes()) == before
    assert not Path(f"{out}.partial").exists()
    forced = _export(cli, executed, out, "--force")
    assert forced.code == 0, forced.err
    assert manifest.read_bytes() != before[1]  # a new signed manifest (a new time)
    assert cli("verify", "--db", executed, str(out)).code == 0


def test_export_refuses_a_path_whose_manifest_is_there(
    executed: str,  # noqa: F811
    tmp_path: Path,
    cli: Callable[..., Run],
) -> None:
    """The export file was moved away, its signed manifest left: writing there replaced it."""
    out = tmp_path / "x.jsonl"
    assert _export(cli, executed, out).code == 0
    out.rename(tmp_path / "kept.jsonl")
    manifest = Path(f"{out}.manifest.json").read_bytes()
    assert _export(cli, executed, out).code == 2
    assert Path(f"{out}.manifest.json").read_bytes() == manifest
    assert not out.exists()


def test_export_jsonl_refuses_to_replace_a_file(
    executed: str,  # noqa: F811
    tmp_path: Path,
    cli: Callable[..., Run],
) -> None:
    """`export --jsonl --out FILE` over a signed export replaced it with an unsigned dump."""
    out = tmp_path / "x.jsonl"
    assert _export(cli, executed, out).code == 0
    before = out.read_bytes()
    assert cli("export", "--db", executed, "--jsonl", "--out", str(out)).code == 2
    assert out.read_bytes() == before
    assert cli("export", "--db", executed, "--jsonl", "--out", str(out), "--force").code == 0
    assert out.read_bytes() != before


def test_export_after_itself_is_still_refused_even_with_force(
    executed: str,  # noqa: F811
    tmp_path: Path,
    cli: Callable[..., Run],
) -> None:
    """`--after X.manifest.json --out X` stays the refusal it was (exit 4, nothing written),
    `--force` or not; `--after` with a new file works."""
    out = tmp_path / "x.jsonl"
    assert _export(cli, executed, out).code == 0
    manifest = Path(f"{out}.manifest.json")
    before = out.read_bytes(), manifest.read_bytes()
    for more in ((), ("--force",)):
        run = _export(cli, executed, out, "--after", str(manifest), *more)
        assert run.code == 4, run
        assert "continues" in run.err
        assert (out.read_bytes(), manifest.read_bytes()) == before
    nxt = tmp_path / "y.jsonl"
    assert _export(cli, executed, nxt, "--after", str(manifest)).code == 0
    assert cli("verify", "--db", executed, str(nxt), "--after", str(manifest)).code == 0


# -- 2. verify: an --after that is no manifest is a broken verdict (1), as a foreign one is


@pytest.mark.parametrize("text", ["not json\n", '{"format": "effectgate-export/2"}\n', "[1]\n"])
def test_verify_after_a_file_that_is_no_manifest_exits_1(
    executed: str,  # noqa: F811
    tmp_path: Path,
    cli: Callable[..., Run],
    text: str,
) -> None:
    out = tmp_path / "x.jsonl"
    assert _export(cli, executed, out).code == 0
    bogus = tmp_path / "bogus.json"
    bogus.write_text(text)
    run = cli("verify", "--db", executed, str(out), "--after", str(bogus))
    assert run.code == 1, run
    as_json = cli("verify", "--db", executed, str(out), "--after", str(bogus), "--json")
    assert as_json.code == 1, as_json
    verdict = json.loads(as_json.out)
    assert verdict["ok"] is False
    assert "manifest" in verdict["problem"]


# -- 3. hold --user: an id that can never match a user's records is refused


@pytest.mark.parametrize("user", ["u1 ", " u1", "", "   ", "u1\n", "u1\x1b[2J", "u1\u200b"])
def test_hold_refuses_a_user_id_that_cannot_match(
    executed: str,  # noqa: F811
    cli: Callable[..., Run],
    user: str,
) -> None:
    run = cli("hold", "--db", executed, "--user", user, "--by", "legal", "--reason", "case 14")
    assert run.code == 2, run
    assert "--user" in run.err
    with open_store(executed) as store:
        assert holds(store, active=False) == []
    assert _events(executed, "hold") == []


# -- 4. redact of a user with no records says so


def test_redact_of_a_user_with_no_records_says_so(
    executed: str,  # noqa: F811
    cli: Callable[..., Run],
) -> None:
    run = cli("redact", "--db", executed, "--user", "u9", "--by", "dpo", "--reason", "r 77")
    assert run.code == 0, run  # nothing to erase is no error
    assert "no records" in run.err
    assert "u9" in run.err
    as_json = cli("redact", "--db", executed, "--user", "u9", "--by", "dpo", "--reason", "r 77", "--json")
    assert as_json.code == 0, as_json
    assert "no records" in as_json.err
    done = json.loads(as_json.out)
    assert done["rows"] == 0
    assert done["found"] is False
    with open_store(executed) as store:  # u1's records untouched
        assert '"1042"' in store.approvals()[0].args_json


def test_redact_of_a_user_already_erased_is_not_reported_as_unknown(
    executed: str,  # noqa: F811
    cli: Callable[..., Run],
) -> None:
    argv = ("redact", "--db", executed, "--user", "u1", "--by", "dpo", "--reason", "r 77", "--json")
    first = cli(*argv)
    assert first.code == 0, first
    assert json.loads(first.out)["found"] is True
    again = cli(*argv)
    assert again.code == 0, again
    done = json.loads(again.out)
    assert (done["rows"], done["found"]) == (0, True)
    assert "no records" not in again.err


# -- 5. a release records who released the hold and why


def test_a_release_needs_a_reason_and_records_it(
    executed: str,  # noqa: F811
    cli: Callable[..., Run],
) -> None:
    placed = cli("hold", "--db", executed, "--user", "u1", "--by", "legal", "--reason", "case 14")
    assert placed.code == 0, placed
    hold_id = placed.out.split()[1]
    for argv in (("--by", "legal"), ("--by", "legal", "--reason", "  "), ("--reason", "settled")):
        run = cli("hold", "--db", executed, "--release", hold_id, *argv)
        assert run.code == 2, run
        with open_store(executed) as store:
            assert [h.id for h in holds(store)] == [hold_id]
    run = cli("hold", "--db", executed, "--release", hold_id, "--by", "legal", "--reason", "case closed")
    assert run.code == 0, run
    with open_store(executed) as store:
        assert holds(store) == []
        [gone] = holds(store, active=False)
    assert gone.released_by == "legal"
    [event] = _events(executed, "hold_released")
    assert event == {"hold_id": hold_id, "by": "legal", "reason": "case closed"}


# -- other defects found in the area


def test_redact_export_through_a_symlink_is_refused_before_erasing(
    executed: str,  # noqa: F811
    tmp_path: Path,
    cli: Callable[..., Run],
) -> None:
    """`redact --export latest.jsonl`, a symlink to the dated export: the rewrite was renamed over
    the link, so the link became a new file without the values while the export it named kept
    every one, and the command said they were erased. Refused (usage error) before the ledger is
    erased; the file named through the link is unchanged."""
    real = tmp_path / "2026-12-04.jsonl"
    assert _export(cli, executed, real).code == 0
    link = tmp_path / "latest.jsonl"
    link.symlink_to(real)
    before = real.read_bytes()
    run = cli(
        "redact", "--db", executed, "--user", "u1", "--by", "dpo", "--reason", "r 77", "--export", str(link)
    )
    assert run.code == 2, run
    assert link.is_symlink()
    assert real.read_bytes() == before
    with open_store(executed) as store:  # nothing erased: the same command, given the file, works
        assert '"1042"' in store.approvals()[0].args_json
    assert _events(executed, "redacted") == []


def test_a_hold_on_a_user_with_no_records_says_so(
    executed: str,  # noqa: F811
    cli: Callable[..., Run],
) -> None:
    """`hold --user u11` (meant: u1) placed a hold and said so like any other: u1 stayed
    unprotected and a retention pass erased what the hold was for. The hold is still placed (a
    hold may come before the records), but stderr says no record of that user was found."""
    run = cli("hold", "--db", executed, "--user", "u11", "--by", "legal", "--reason", "case 14", "--json")
    assert run.code == 0, run
    assert "no records" in run.err
    assert json.loads(run.out)["found"] is False
    known = cli("hold", "--db", executed, "--user", "u1", "--by", "legal", "--reason", "case 14", "--json")
    assert known.code == 0, known
    assert "no records" not in known.err
    assert json.loads(known.out)["found"] is True
    with open_store(executed) as store:
        assert sorted(h.user_id for h in holds(store)) == ["u1", "u11"]


def test_hold_on_a_user_with_a_lone_surrogate_stays_the_documented_refusal(
    executed: str,  # noqa: F811
    cli: Callable[..., Run],
) -> None:
    """README: a user holding NUL or a lone surrogate is refused with exit 4 (not 2)."""
    run = cli("hold", "--db", executed, "--user", "u\udcff", "--by", "legal", "--reason", "case 14")
    assert run.code == 4, run
    with open_store(executed) as store:
        assert holds(store, active=False) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["redact", "--user", "", "--by", "dpo", "--reason", "r 77"],
        ["redact", "--user", "u1", "--by", " ", "--reason", "r 77"],
        ["redact", "--user", "u1", "--by", "dpo", "--reason", ""],
        ["retain", "--rule", "write=0", "--by", ""],
    ],
)
def test_an_empty_user_by_or_reason_is_a_usage_error_for_redact_and_retain(
    executed: str,  # noqa: F811
    cli: Callable[..., Run],
    argv: list[str],
) -> None:
    """`redact --by ""` exited 4 (refused) where `hold --by ""` and `seal-rules --by ""` exit 2:
    an empty option is bad input (the exit code table's 2), nothing erased."""
    run = cli(argv[0], "--db", executed, *argv[1:])
    assert run.code == 2, run
    assert _events(executed, "redacted") == []
    with open_store(executed) as store:
        assert '"1042"' in store.approvals()[0].args_json
