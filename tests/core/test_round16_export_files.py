"""Round 16 review of the files the governance commands write and read back.

- `export --jsonl --out LINK`, LINK a symlink to a file already there (a signed export), wrote
  through the link without `--force`: the evidence behind it was replaced.
- A file written whole (`_export_file.rewrite`: the export, its manifest, `redact --export`'s
  rewrite, the HTML report) was renamed into place unflushed: after a power loss the name could
  hold an empty file, for `redact --export` the only copy of the export's records. Now fsynced.
- `redact --export`: a legal hold placed after the ledger's erasure did not stop the file's.
- An empty file option (`audit --pinned ""`, `verify --after ""`, `export --after ""`, `report
  --html ""`) silently skipped the check or the file it names: a usage error now.
- `verify_export` of a named pipe in the export's place blocked for ever.
- `redact --export x --export x` reported the second pass's count (0 records).
- `--keep ""` erased the financial facts with the rest: a usage error now.
- `report --html` over an export or its manifest replaced the evidence: refused now.
- Left as a strict xfail: the library's `redact_export` cannot see a legal hold."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from effectgate import _export_file
from effectgate.cli import _governance as governance_module
from effectgate.cli import keyring_for
from effectgate.export import export_chain, manifest_path, redact_export, verify_export
from effectgate.redact import RedactionError, entries, hold
from effectgate.stores import open_store

from . import test_cli
from .test_cli import Run
from .test_cli_round4 import two_users as two_users

cli = test_cli.cli  # the command run in-process, and a clean environment
_cli_env = test_cli._cli_env


def test_export_jsonl_through_a_symlink_to_an_earlier_export_is_refused_without_force(
    two_users: str,
    tmp_path: Path,
    cli: Callable[..., Run],
) -> None:
    """A symlink to a signed export is a file already there: `export --jsonl --out` refuses it
    (exit 2) and the export behind it still verifies; `--force` writes through it."""
    signed = tmp_path / "signed.jsonl"
    assert cli("export", "--db", two_users, "--out", str(signed), "--settle", "0").code == 0
    before = signed.read_bytes()
    link = tmp_path / "latest.jsonl"
    link.symlink_to(signed)
    run = cli("export", "--db", two_users, "--jsonl", "--out", str(link))
    assert run.code == 2, run.err
    assert "exists" in run.err
    assert signed.read_bytes() == before
    assert verify_export(signed, keyring_for(two_users, create=False)).ok
    assert link.is_symlink()
    assert cli("export", "--db", two_users, "--jsonl", "--out", str(link), "--force").code == 0
    assert link.is_symlink()
    assert signed.read_bytes() != before
    assert '"table": "approvals"' in signed.read_text()


def test_a_dangling_or_empty_symlink_target_is_still_written_through(
    two_users: str,
    tmp_path: Path,
    cli: Callable[..., Run],
) -> None:
    """Nothing is there to lose behind a symlink to an empty file (`> dump` then `--out
    /dev/stdout`): it is written through, as before."""
    real = tmp_path / "real.jsonl"
    real.write_text("")
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    assert cli("export", "--db", two_users, "--jsonl", "--out", str(link)).code == 0
    assert real.read_text().count("\n") > 2


def test_a_rewritten_file_reaches_the_disk_before_it_is_renamed_into_place(
    two_users: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each file the export writes (the records, then the manifest) is fsynced whole while it is
    still the partial, before its rename; the directory is fsynced after, so the rename lasts."""
    synced: list[tuple[str, int]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        where = os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else "?"
        synced.append((where, os.fstat(fd).st_size))
        real_fsync(fd)

    monkeypatch.setattr(_export_file.os, "fsync", fsync)
    out = tmp_path / "x.jsonl"
    with open_store(two_users) as store:
        export_chain(store, keyring_for(two_users, create=False), out, settle=0)
    if not os.path.exists("/proc/self/fd"):  # pragma: no cover - where fds cannot be named
        assert len(synced) >= 2
        return
    files = {where: size for where, size in synced if where.endswith(".partial")}
    assert files == {
        f"{out}.partial": out.stat().st_size,
        f"{manifest_path(out)}.partial": manifest_path(out).stat().st_size,
    }
    assert str(tmp_path) in [where for where, _ in synced]  # the directory, after the renames
    assert [where for where, _ in synced][-1] == str(tmp_path)


def test_a_hold_placed_after_the_ledger_erasure_keeps_the_export_file(
    two_users: str,
    tmp_path: Path,
    cli: Callable[..., Run],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`redact --user u1 --export x` erases the ledger, then the file: a legal hold placed on u1
    in between (legal acts while a large file is being read) must stop the file's erasure, whose
    copy is then the only one left. Refused (exit 4), the file untouched, and said."""
    export = tmp_path / "x.jsonl"
    assert cli("export", "--db", two_users, "--out", str(export), "--settle", "0").code == 0
    before = export.read_bytes()
    real = governance_module.redact

    def then_a_hold(store: Any, *args: Any, **kwargs: Any) -> Any:
        done = real(store, *args, **kwargs)
        hold(store, user_id="u1", by="legal", reason="case 14")
        return done

    monkeypatch.setattr(governance_module, "redact", then_a_hold)
    run = cli(
        "redact", "--db", two_users, "--user", "u1", "--by", "dpo", "--reason", "r", "--export", str(export)
    )
    assert run.code == 4, run.err
    assert "hold" in run.err
    assert export.read_bytes() == before
    assert not (tmp_path / "x.jsonl.partial").exists()
    with open_store(two_users) as store:  # the ledger's erasure (before the hold) stands
        assert all(a.args_json.startswith('{"$redacted"') for a in store.approvals() if a.user_id == "u1")


@pytest.mark.parametrize(
    "argv",
    [
        ["audit", "--pinned", ""],
        ["verify", "{export}", "--after", ""],
        ["export", "--out", "{tmp}/next.jsonl", "--after", ""],
        ["export", "--jsonl", "--out", ""],
        ["report", "--html", ""],
    ],
    ids=["audit-pinned", "verify-after", "export-after", "export-jsonl-out", "report-html"],
)
def test_an_empty_file_option_is_a_usage_error_not_a_check_skipped(
    two_users: str,
    tmp_path: Path,
    cli: Callable[..., Run],
    argv: list[str],
) -> None:
    """`audit --pinned "$MANIFEST"` with the variable unset ran the audit without the pins and
    exited 0 (clean); `verify F --after ""` said ok without the continuity check; `export --after
    ""` restarted the chain from its genesis; `report --html ""` printed instead of writing. An
    empty file name is bad input (exit 2), and nothing is written."""
    export = tmp_path / "one.jsonl"
    assert cli("export", "--db", two_users, "--out", str(export), "--settle", "0").code == 0
    before = sorted(p.name for p in tmp_path.iterdir())
    given = [a.format(export=export, tmp=tmp_path) for a in argv]
    run = cli(given[0], "--db", two_users, *given[1:])
    assert run.code == 2, (run.code, run.out, run.err)
    assert "empty file name" in run.err
    assert run.out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_verify_of_a_named_pipe_in_place_of_the_export_answers_and_never_blocks(
    two_users: str,
    tmp_path: Path,
) -> None:
    """An export file swapped for a named pipe (beside its genuine manifest): `verify_export`
    promises a verdict, never an exception, and it blocked for ever waiting for a writer. A file
    that is not a regular file is a broken export, as the manifest's reader already refuses one."""
    export = tmp_path / "one.jsonl"
    keyring = keyring_for(two_users, create=False)
    with open_store(two_users) as store:
        export_chain(store, keyring, export, settle=0)
    export.unlink()
    os.mkfifo(export)
    answers: list[Any] = []
    worker = threading.Thread(target=lambda: answers.append(verify_export(export, keyring)), daemon=True)
    worker.start()
    worker.join(timeout=10)
    if worker.is_alive():  # let it go: open the pipe's other end
        os.close(os.open(export, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(timeout=10)
        pytest.fail("verify_export blocked on a named pipe")
    [verdict] = answers
    assert not verdict.ok
    assert "not a regular file" in str(verdict.problem)


def test_an_export_file_named_twice_is_rewritten_once_and_its_count_kept(
    two_users: str,
    tmp_path: Path,
    cli: Callable[..., Run],
) -> None:
    """`redact --export x --export x` rewrote the file twice and reported the second pass's count
    (0 records), as if the file had kept the user's values. Each file is erased once, and its
    count is what was erased from it."""
    export = tmp_path / "x.jsonl"
    assert cli("export", "--db", two_users, "--out", str(export), "--settle", "0").code == 0
    argv = ["--by", "dpo", "--reason", "r", "--export", str(export), "--export", str(export), "--json"]
    run = cli("redact", "--db", two_users, "--user", "u1", *argv)
    assert run.code == 0, run.err
    assert json.loads(run.out)["exports"] == {str(export): 1}
    left = [json.loads(t) for t in export.read_text().splitlines()]
    assert [line["personal"] for line in left if line["record"]["user_id"] == "u1"] == [{}]
    assert all(line["personal"] for line in left if line["record"]["user_id"] == "u2")


@pytest.mark.parametrize("keep", ["", " , "])
@pytest.mark.parametrize("command", ["redact", "retain"])
def test_an_empty_keep_is_a_usage_error_not_the_facts_erased(
    two_users: str, cli: Callable[..., Run], keep: str, command: str
) -> None:
    """`--keep "$FACTS"` with the variable unset kept no argument: the erasure wrote markers
    without the amount and currency, the financial facts the README promises to keep, and no
    later pass can bring them back. A `--keep` naming no argument is bad input (exit 2), as an
    empty `--by` is, and nothing is erased."""
    argv = ["--user", "u1", "--reason", "r"] if command == "redact" else ["--rule", "money=0"]
    run = cli(command, "--db", two_users, *argv, "--by", "dpo", "--keep", keep)
    assert run.code == 2, (run.code, run.out, run.err)
    assert "--keep" in run.err
    with open_store(two_users) as store:
        assert not any(a.args_json.startswith('{"$redacted"') for a in store.approvals())
        assert entries(store) == {}


@pytest.mark.parametrize("which", ["records", "manifest"])
def test_report_html_never_writes_over_an_export_or_its_manifest(
    two_users: str, tmp_path: Path, cli: Callable[..., Run], which: str
) -> None:
    """`report --html 2026-12-04.jsonl` (a completion slip) renamed the report over a signed
    export, or over its manifest: the evidence was gone and the export no longer verified. An
    export's file or manifest is refused (exit 2, nothing written); an earlier report is replaced."""
    pytest.importorskip("matplotlib")
    export = tmp_path / "one.jsonl"
    assert cli("export", "--db", two_users, "--out", str(export), "--settle", "0").code == 0
    target = export if which == "records" else manifest_path(export)
    before = target.read_bytes()
    run = cli("report", "--db", two_users, "--html", str(target))
    assert run.code == 2, (run.code, run.out, run.err)
    assert "export" in run.err
    assert target.read_bytes() == before
    assert verify_export(export, keyring_for(two_users, create=False)).ok
    page = tmp_path / "report.html"
    page.write_text("last week's report")
    assert cli("report", "--db", two_users, "--html", str(page)).code == 0
    assert "<svg" in page.read_text()


def test_the_library_erasure_of_an_export_file_respects_a_legal_hold(two_users: str, tmp_path: Path) -> None:
    """A user under a legal hold keeps every value, in the ledger and in its export files: the
    library's `redact_export` takes the store and refuses a held user (it erased the file's values
    unchecked; only `effectgate redact --export` looked at the holds)."""
    export = tmp_path / "x.jsonl"
    with open_store(two_users) as store:
        export_chain(store, keyring_for(two_users, create=False), export, settle=0)
        hold(store, user_id="u1", by="legal", reason="case 14")
        before = export.read_bytes()
        with pytest.raises(RedactionError, match="legal hold"):
            redact_export(export, store=store, user_id="u1")
        assert export.read_bytes() == before
        assert redact_export(export, store=store, user_id="u2") == 1  # another user's values: erased
    assert export.with_name(export.name + ".partial").exists() is False
