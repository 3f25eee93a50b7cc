"""The inbox's metrics page (issue 18) through the ASGI client: signed-in reviewers only, the
report's five charts inline as SVG under the inbox's CSP, the scripted ledger's hand-counted
figures, ledger text escaped, and a clear page without the report extra."""

from __future__ import annotations

import dataclasses
import re
import sys

import pytest

from effectgate.examples.shop import context
from effectgate.web import create_app
from tests._report_ledger import script

from .conftest import Inbox, login, registry

CHARTS = ("latency", "decisions", "replays", "gated_by_model", "backlog")


def test_metrics_needs_a_signed_in_reviewer(inbox: Inbox) -> None:
    """Signed out, /metrics redirects to the login page; signed in, the header links to it."""
    c = inbox.client()
    r = c.get("/metrics")
    assert (r.status_code, r.headers["location"]) == (303, "/login")
    login(c, "sam")
    assert '<a href="/metrics">Metrics</a>' in c.get("/").text
    assert c.get("/metrics").status_code == 200


def test_metrics_draws_the_hand_counted_figures(inbox: Inbox) -> None:
    """The scripted ledger's figures: five inline charts, finance's p95 of 10m 0s MISSED against
    the app's 300 s target, gpt-b's 4 proposals over 4 sessions (1000 per 1,000), and the CSP
    that allows no script or fetch is unchanged."""
    script(inbox.gate, inbox.shop, inbox.clock)
    inbox.app = create_app(inbox.gate, registry(), secret_key="t", latency_targets={"finance": 300})
    c = inbox.client()
    login(c, "fiona")
    r = c.get("/metrics")
    assert r.status_code == 200, r.text
    page = r.text
    assert [k for k in CHARTS if f'<figure data-chart="{k}"><svg ' in page] == list(CHARTS)
    assert re.search(r"<tr><td>finance</td><td>10m 0s</td><td>5m 0s</td><td><span class=\"missed\">", page)
    assert re.search(r"<td>gpt-b</td><td>4</td><td>4</td><td>1000</td>", page)
    assert "needs_reconciliation backlog: 1" in page
    assert re.findall(r"<script|<link|<img|<iframe", page, flags=re.IGNORECASE) == []
    csp = r.headers["content-security-policy"]
    assert csp.startswith("default-src 'none';")
    assert "script-src" not in csp


def test_metrics_window_in_days(inbox: Inbox) -> None:
    """`?days=1` counts the calls of the last day only (none here: the last call was two days
    ago, so every figure is empty); a malformed window is refused with 400."""
    script(inbox.gate, inbox.shop, inbox.clock)
    c = inbox.client()
    login(c, "fiona")
    page = c.get("/metrics", params={"days": "1"}).text
    assert "0 gated proposals" in page
    assert 'value="1"' in page
    assert "6 gated proposals" in c.get("/metrics").text
    assert c.get("/metrics", params={"days": "-3"}).status_code == 400
    assert c.get("/metrics", params={"days": "soon"}).status_code == 400


@pytest.mark.parametrize(
    "days", ["\u00b2", "\u0663", "\uff17", "1" + "0" * 5000, "+5", " 5", "5 ", "1e3", "0", "36501", "100000"]
)
def test_a_window_that_is_not_ascii_digits_in_range_is_a_clear_400(inbox: Inbox, days: str) -> None:
    """Only 1 to 36500 written in ASCII digits is a window: a superscript or other script's digit
    (which `str.isdigit` accepts), a 5000-digit number, a sign, spaces or an exponent get 400
    with the rule, never a bare 500."""
    c = inbox.client(raise_server_exceptions=False)
    login(c, "fiona")
    r = c.get("/metrics", params={"days": days})
    assert r.status_code == 400
    assert "days must be a whole number of days, 1 to 36500." in r.text


def test_model_text_on_the_metrics_page_is_text(inbox: Inbox) -> None:
    """A model identifier that is a <script> tag reaches the page only escaped."""
    hostile = "<script>alert('m')</script>"
    ctx = dataclasses.replace(context("m1"), model_id=hostile)
    inbox.gate.call("refund_order", {"order_id": "1042", "amount": 100, "currency": "GBP"}, ctx)
    c = inbox.client()
    login(c, "fiona")
    page = c.get("/metrics").text
    assert re.findall(r"<script", page, flags=re.IGNORECASE) == []
    assert "&lt;script&gt;alert(&#x27;m&#x27;)&lt;/script&gt;" in page


def test_without_matplotlib_the_page_names_the_extra(inbox: Inbox, monkeypatch: pytest.MonkeyPatch) -> None:
    """No matplotlib: /metrics answers 501 with the install command; the inbox works on."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.delitem(sys.modules, "effectgate.report._charts", raising=False)
    c = inbox.client()
    login(c, "fiona")
    r = c.get("/metrics")
    assert r.status_code == 501
    assert "pip install &#34;effectgate[report]&#34;" in r.text
    assert c.get("/").status_code == 200
