"""`effectgate report --html` (issue 18): one static page with its five charts inline as SVG, the
figures of the scripted ledger in its tables, nothing that fetches at view time, every value from
the ledger printed as text, and a clear error naming the extra without matplotlib. On SQLite and
PostgreSQL."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from effectgate import (
    Approver,
    CallContext,
    Effect,
    EffectGate,
    EffectTable,
    Grant,
    Keyring,
    Pending,
    ToolSpec,
)
from effectgate.cli import main
from effectgate.errors import MissingDependency
from effectgate.examples.shop import SHOP_POLICY, Shop
from effectgate.report import figures, render_html
from effectgate.stores import SQLStore
from effectgate.testing import FakeClock
from tests._report_ledger import script

CHARTS = ("latency", "decisions", "replays", "gated_by_model", "backlog")
NAMESPACES = {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}
HOSTILE_TOOL = "<script>alert(1)</script>"
HOSTILE_ROLE = "<img src=x onerror=alert(2)>"
HOSTILE_MODEL = "<script>alert('m')</script>\u202e"


def ledger(store: SQLStore, clock: FakeClock) -> None:
    shop = Shop()
    with EffectGate(shop.table(), store, policy=SHOP_POLICY, keyring=Keyring.generate(), clock=clock) as gate:
        script(gate, shop, clock)


def fetches(page: str) -> list[str]:
    """Everything in the page that could make a browser fetch: URLs other than the SVG
    namespaces, src/href attributes that leave the document, <link>, <script>, @import."""
    urls = [u for u in re.findall(r"[a-z]+://[^\s\"'<>)]+", page) if u not in NAMESPACES]
    refs = [r for r in re.findall(r"(?:src|href)=\"([^\"]*)\"", page) if not r.startswith("#")]
    tags = re.findall(r"<(?:link|script|iframe|img|object|embed)\b", page, flags=re.IGNORECASE)
    return urls + refs + tags + re.findall(r"@import", page)


def test_the_html_report_is_one_static_page_with_its_charts(
    store: SQLStore, store_url: str, clock: FakeClock, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`report --html`: one file holding the five charts as inline SVG and the hand-counted figures
    (gpt-b's 4 proposals over 4 sessions: 1000 per 1,000; finance p95 10m 0s over a 5m 0s target,
    MISSED), its own CSP forbidding every fetch, and nothing that refers outside the file."""
    ledger(store, clock)
    out = tmp_path / "report.html"
    code = main(["report", "--db", store_url, "--html", str(out), "--target", "finance=300"])
    assert code == 0, capsys.readouterr().err
    assert f"wrote the report with its charts to {out}" in capsys.readouterr().out
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>")
    assert "Content-Security-Policy\" content=\"default-src 'none';" in page
    assert [c for c in CHARTS if f'<figure data-chart="{c}"><svg ' in page] == list(CHARTS)
    assert page.count("<svg") == len(CHARTS)
    assert fetches(page) == []
    assert "<?xml" not in page
    assert "<!DOCTYPE svg" not in page
    assert re.search(r"<tr><td>finance</td><td>10m 0s</td><td>5m 0s</td><td><span class=\"missed\">", page)
    assert re.search(r"<td>gpt-b</td><td>4</td><td>4</td><td>1000</td>", page)
    assert re.search(r"<td>refund_order</td><td>5</td><td>60.0%</td><td>20.0%</td><td>20.0%</td>", page)


def test_report_json_and_html_together(
    store: SQLStore, store_url: str, clock: FakeClock, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--json --html FILE`: the JSON on stdout is the figures' own, and the file is written."""
    ledger(store, clock)
    out = tmp_path / "r.html"
    assert main(["report", "--db", store_url, "--json", "--html", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == figures(store).to_dict()
    assert data["metrics"]["gated_by_model"][1]["per_1000_sessions"] == 1000.0
    assert out.read_text(encoding="utf-8").count("<svg") == len(CHARTS)


@pytest.fixture
def hostile(store: SQLStore, clock: FakeClock) -> None:
    """A tool, a role and a model identifier that are markup, each decided once."""

    def pay(amount: int) -> dict[str, Any]:
        return {"paid": amount}

    table = EffectTable(
        [ToolSpec(name=HOSTILE_TOOL, effect=Effect.MONEY, fn=pay, approver_role=HOSTILE_ROLE)]
    )
    table.allow("agent", [HOSTILE_TOOL])
    with EffectGate(table, store, keyring=Keyring.generate(), clock=clock) as gate:
        c = CallContext(session_id="s1", origin_message_id="m1", user_id="u1", agent_id="agent")
        out = gate.call(HOSTILE_TOOL, {"amount": 1}, dataclasses.replace(c, model_id=HOSTILE_MODEL))
        assert isinstance(out, Pending), out
        clock.advance(42)
        grant = gate.approve(out.approval_id, version=1, approver=Approver("x", HOSTILE_ROLE))
        assert isinstance(grant, Grant)
        gate.flush()


@pytest.mark.usefixtures("hostile")
def test_ledger_text_is_printed_as_text_never_markup(store: SQLStore) -> None:
    """A tool named <script>, a role that is an <img> tag and a model id with a right-to-left
    override reach the page (tables and charts) only escaped, with the override written out."""
    page = render_html(figures(store, targets={HOSTILE_ROLE: 60}))
    assert re.findall(r"<script|<img", page, flags=re.IGNORECASE) == []
    assert fetches(page) == []
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(2)&gt;" in page
    assert "&lt;script&gt;alert(&#x27;m&#x27;)&lt;/script&gt;&lt;U+202E&gt;" in page  # the table
    assert "\u202e" not in page
    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.DOTALL)
    assert any("&lt;script&gt;alert(1)&lt;/script&gt;" in s for s in svgs)  # the decisions chart
    assert any("&lt;U+202E&gt;" in s for s in svgs)  # the per-model chart's legend


def test_without_matplotlib_the_html_report_names_the_extra(
    store: SQLStore, store_url: str, clock: FakeClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No matplotlib: drawing raises MissingDependency with the install command, and `report
    --html` is a usage error (exit 2) naming it that writes nothing; the terminal report works."""
    ledger(store, clock)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.delitem(sys.modules, "effectgate.report._charts", raising=False)
    with pytest.raises(MissingDependency) as caught:
        render_html(figures(store))
    assert 'pip install "effectgate[report]"' in str(caught.value)
    assert (caught.value.extra, isinstance(caught.value.__cause__, ImportError)) == ("report", True)
    out = tmp_path / "report.html"
    assert main(["report", "--db", store_url, "--html", str(out)]) == 2
    assert not out.exists()
    assert main(["report", "--db", store_url]) == 0


def test_every_model_has_a_legend_entry(store: SQLStore, clock: FakeClock) -> None:
    """matplotlib leaves out of a legend any label that starts with "_": a model id such as
    "_nolegend_" or "_canary" still gets its entry in the per-model chart (the line would
    otherwise be one no reader can name)."""

    def pay(amount: int) -> dict[str, Any]:
        return {"paid": amount}

    table = EffectTable([ToolSpec(name="pay", effect=Effect.MONEY, fn=pay, approver_role="finance")])
    table.allow("agent", ["pay"])
    models = ("_nolegend_", "_canary", "gpt-a")
    with EffectGate(table, store, keyring=Keyring.generate(), clock=clock) as gate:
        for n, model in enumerate(models):
            c = CallContext(session_id=f"s{n}", origin_message_id=f"m{n}", user_id="u1", agent_id="agent")
            assert isinstance(
                gate.call("pay", {"amount": n}, dataclasses.replace(c, model_id=model)), Pending
            )
        gate.flush()
    page = render_html(figures(store))
    [chart] = re.findall(r'<figure data-chart="gated_by_model">(.*?)</figure>', page, flags=re.DOTALL)
    [legend] = re.findall(r'<g id="legend_1">(.*?)\n  </g>\n', chart, flags=re.DOTALL)
    assert [m for m in models if m in legend] == list(models)
