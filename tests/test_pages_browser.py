"""Issue 15 in a real browser: headless Chromium logs in with the page token, opens the 64-host
cascade's run page and /runs, finds the headline card, SVG timeline and activity plot on the
first screen (1280 x 900, no scrolling) and no console error; the screenshot is kept.

``PAGES_SCREENSHOT_DIR=docs/screenshots`` also writes ``run-page.png`` there (the README's)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from bridge.explain import catalog_annotations
from bridge.webhook import PageAuth
from tests.bridge_payloads import cascade, make_context, serve, serve_app
from tests.cdp_browser import CHROMIUM, Browser
from tests.pages_helpers import FakePrometheus, fake_worker, post_alerts

PAGE_TOKEN = "browser-page-token-0123456789"
RUN_PATH = "/runs/team/proj/cascade1"
RUNBOOK = "https://github.com/wandb-infra-issues/wandb-infra-issues/blob/main/docs/runbook.md"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium")


def _catalog_cascade() -> list[dict]:
    """The cascade with the rules' own texts (as Alertmanager would send them) and runbook."""
    alerts = cascade()
    for a in alerts:
        known = catalog_annotations(a["labels"])
        a["annotations"] = {k: known[k] for k in ("summary", "description", "impact",
                                                   "remediation") if k in known}
        a["annotations"]["runbook_url"] = f"{RUNBOOK}#{a['labels']['alertname'].lower()}"
    return alerts


async def _visit(base: str, shot: Path) -> dict:
    async with Browser() as browser:
        await browser.goto(base + RUN_PATH)
        login = await browser.eval("document.title")
        await browser.eval(f"document.querySelector('input[name=token]').value = "
                           f"'{PAGE_TOKEN}'")
        browser.errors.clear()  # the 401 that showed the login form is expected
        await browser.submit("form[action='/login']")
        found = await browser.eval("""(() => {
            const box = (el) => el ? el.getBoundingClientRect().toJSON() : null;
            const card = document.querySelector('section.card.headline');
            return {
              url: location.pathname, login: document.cookie,
              card: box(card), cardText: card ? card.innerText : '',
              timeline: box(document.querySelector('svg.timeline')),
              lanes: [...document.querySelectorAll('svg.timeline g.lane')]
                       .map(g => g.getAttribute('data-hosts')),
              bars: document.querySelectorAll('svg.timeline rect.bar').length,
              activity: box(document.querySelector('svg.activity')),
              grafana: box(document.querySelector('section.headline a.btn')),
              runbook: document.querySelector('section.headline a.btn.alt')?.href,
              details: document.querySelectorAll('table.consequences details').length,
              scroll: document.documentElement.scrollWidth, height: window.innerHeight,
            };
        })()""")
        await browser.screenshot(shot)
        errors_run = list(browser.errors)
        await browser.goto(base + "/runs")
        found["runs_rows"] = await browser.eval(
            "[...document.querySelectorAll('table tr td a')].map(a => a.textContent)")
        found["errors"] = errors_run + browser.errors
        found["login_title"] = login
        return found


def test_cascade_run_page_in_chromium(tmp_path):
    prom = FakePrometheus()
    with serve_app(prom.app()) as prom_url:
        ctx = make_context(tmp_path, worker=fake_worker(prom_url), pages=PageAuth(PAGE_TOKEN))
        with serve(ctx) as running:
            post_alerts(running, _catalog_cascade())
            shot = tmp_path / "run-page.png"
            found = asyncio.run(_visit(running.url, shot))
    assert found["login_title"] == "Sign in"
    assert found["url"] == RUN_PATH and found["login"] == ""  # HttpOnly: invisible to scripts
    assert found["errors"] == []
    # The story on the first screen: card, its buttons, the timeline and the plot.
    assert found["height"] == 900
    assert found["card"]["bottom"] < 900 and found["grafana"]["bottom"] < 900
    assert found["timeline"]["bottom"] < 900 and found["activity"]["top"] < 900
    assert "GpuContainedEccError" in found["cardText"] and "node017 GPU 3" in found["cardText"]
    assert "Restart the job from its last checkpoint" in found["cardText"]
    assert found["runbook"] == f"{RUNBOOK}#gpucontainedeccerror"
    assert found["lanes"] == ["1", "64"] and found["bars"] == 3
    assert found["details"] == 2 and found["scroll"] <= 1280
    assert found["runs_rows"] == ["team/proj/cascade1"]
    assert shot.stat().st_size > 20_000
    keep = os.environ.get("PAGES_SCREENSHOT_DIR")
    if keep:
        shutil.copy(shot, Path(keep) / "run-page.png")
