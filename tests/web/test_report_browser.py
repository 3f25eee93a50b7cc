"""The report's pages in headless Chromium (issue 18): the static HTML report opened from its file
and the inbox's metrics page both show their five charts as inline SVG, and the browser makes no
request beyond the page itself (every request Playwright sees is recorded). Screenshots of both are
saved as artifacts."""

from __future__ import annotations

import os
from pathlib import Path

from playwright.sync_api import Browser, Page, Request

from effectgate.report import figures, write_html
from tests._report_ledger import script

from .conftest import Inbox, sign_in

CHARTS = ("latency", "decisions", "replays", "gated_by_model", "backlog")
ARTIFACTS = Path(os.environ.get("EFFECTGATE_ARTIFACTS", Path(__file__).resolve().parents[2] / "artifacts"))


def recorded(page: Page) -> tuple[list[Request], list[str]]:
    """Every request the page makes, and every console message (a CSP violation is one)."""
    requests: list[Request] = []
    console: list[str] = []
    page.on("request", lambda request: requests.append(request))
    page.on("console", lambda message: console.append(message.text))
    return requests, console


def charts_shown(page: Page) -> list[str]:
    """The charts on the page whose SVG has drawn something (a non-empty box)."""
    shown = []
    for key in CHARTS:
        svg = page.locator(f"figure[data-chart='{key}'] > svg")
        box = svg.bounding_box() if svg.count() == 1 else None
        if box and box["width"] > 100 and box["height"] > 50:
            shown.append(key)
    return shown


def test_the_html_report_opens_offline_with_its_charts(
    inbox: Inbox, browser: Browser, tmp_path: Path
) -> None:
    """The report file opens from disk: five drawn charts, the tables' figures, and exactly one
    request (the file itself): no script, style sheet, font or image is fetched."""
    script(inbox.gate, inbox.shop, inbox.clock)
    out = write_html(figures(inbox.store, targets={"finance": 300}), tmp_path / "report.html")
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    requests, console = recorded(page)
    page.goto(out.as_uri())
    page.wait_for_load_state("load")
    assert charts_shown(page) == list(CHARTS)
    assert page.locator("table[data-table='latency']").inner_text().split("\n")[1].split("\t") == [
        "finance",
        "10m 0s",
        "5m 0s",
        "MISSED",
    ]
    assert [r.url for r in requests] == [out.as_uri()]
    assert console == []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)
    page.close()


def test_the_metrics_page_draws_the_same_charts(inbox: Inbox, server: str, browser: Browser) -> None:
    """A signed-in reviewer's metrics page: the five charts drawn, no CSP violation, and every
    request goes to the inbox itself as a page load (nothing else is fetched)."""
    script(inbox.gate, inbox.shop, inbox.clock)
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    sign_in(page, server, "fiona")
    requests, console = recorded(page)
    page.get_by_role("link", name="Metrics").click()
    page.wait_for_url(f"{server}/metrics")
    assert charts_shown(page) == list(CHARTS)
    assert "gpt-b" in page.locator("table[data-table='gated_by_model']").inner_text()
    assert [(r.url, r.resource_type) for r in requests] == [(f"{server}/metrics", "document")]
    assert console == []
    page.screenshot(path=str(ARTIFACTS / "metrics.png"), full_page=True)
    page.close()
