"""In a real browser: headless Chromium logs in with the page token, opens the demo
scenarios' run pages (the 64-host cascade; a thermal slowdown on one host of two) and /runs,
finds the headline card, SVG timeline and activity plot on the first screen (1280 x 900, no
scrolling) and no console error; the screenshots are kept in the test's directory.

At 1280 and 800 px, on those pages and on one built for the labels' hard cases,
every chart label is whole inside what the reader sees of its chart (or cut with its full text
as tooltip), apart from the others and at least 9.5 px high.

``PAGES_SCREENSHOT_DIR=docs/screenshots`` also writes ``run-page.png`` (the cascade, the
README's) and ``run-page-thermal.png`` there."""

from __future__ import annotations

import asyncio
import os
import shutil
from datetime import timedelta
from pathlib import Path

import pytest

from harness.bridge_payloads import T0, alert, cascade, serve, serve_app
from tests.cdp_browser import CHROMIUM, Browser
from tests.pages_helpers import FakePrometheus, measure, pages_context, post_alerts
from wandb_infra.bridge.prometheus.history import catalog_annotations
from wandb_infra.bridge.web.webhook import PageAuth
from wandb_infra.common.runkey import RunKey

PAGE_TOKEN = "browser-page-token-0123456789"
CASCADE = "/runs/team/proj/cascade1"
THERMAL = "/runs/team/llm-finetune/thermal2"
RUNBOOK = "https://github.com/wandb-infra-issues/wandb-infra-issues/blob/main/docs/runbook.md"
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium")]


def _with_catalog_texts(alerts: list[dict]) -> list[dict]:
    """The rules' own texts (as Alertmanager would send them) and runbook links."""
    for a in alerts:
        known = catalog_annotations(a["labels"])
        a["annotations"] = {k: known[k] for k in ("summary", "description", "impact",
                                                   "remediation") if k in known}
        a["annotations"]["runbook_url"] = f"{RUNBOOK}#{a['labels']['alertname'].lower()}"
    return alerts


def _thermal() -> list[dict]:
    """Demo scenario 2: GPUs 0-3 of one host of a 2-host run throttle for heat, the run
    straggles, all resolved four minutes later."""
    end = T0 + timedelta(minutes=4)
    common = {"run": "thermal2", "project": "llm-finetune", "host": "gpu-node-065",
              "severity": "warning", "end": end}
    out = [alert("GpuThermalViolation", category="gpu_thermal", gpu=str(g), **common)
           for g in range(4)]
    out += [alert("GpuTemperatureHigh", category="gpu_thermal", gpu=str(g),
                  start=T0 + timedelta(seconds=12), **common) for g in range(4)]
    out.append(alert("TrainingStraggler", category="workload", gpu="0",
                     start=T0 + timedelta(seconds=50), **common))
    return out


EDGE = "/runs/team/proj/edge3"
EDGE_ROOT = "gpu-node-017.rack-12.dc-east.example.internal"


def _edge() -> list[dict]:
    """The labels' hard cases: a bar that starts near the chart's right edge (stragglers four
    minutes in, still firing), an issue that starts 4 s before its root cause (a stall seen
    first) so their markers nearly coincide, and a root host name too long for its column."""
    common = {"run": "edge3", "project": "proj"}
    out = [alert("TrainingStalled", category="workload", host="gpu-node-101", severity="warning",
                 start=T0, **common),
           alert("GpuDoubleBitEccErrors", category="gpu_hardware", host=EDGE_ROOT, gpu="3",
                 start=T0 + timedelta(seconds=4), **common)]
    out += [alert("TrainingStraggler", category="workload", host="gpu-node-102", gpu=str(g),
                  severity="warning", start=T0 + timedelta(minutes=4), **common)
            for g in range(4)]
    return out


SCENARIOS = {
    "cascade": (CASCADE, lambda: _with_catalog_texts(cascade()), FakePrometheus()),
    "thermal": (THERMAL, lambda: _with_catalog_texts(_thermal()), FakePrometheus(
        hosts=["gpu-node-065", "gpu-node-066"], gpus=4, high=0.62, low=0.41,
        drop_at=T0.timestamp())),
    "edge": (EDGE, lambda: _with_catalog_texts(_edge()), FakePrometheus(
        hosts=[EDGE_ROOT, "gpu-node-101", "gpu-node-102"], gpus=4,
        drop_at=T0.timestamp() + 4)),
}


async def _visit(base: str, path: str, shot: Path) -> dict:
    async with Browser() as browser:
        await browser.goto(base + path)
        login = await browser.eval("document.title")
        await browser.eval(f"document.querySelector('input[name=token]').value = "
                           f"'{PAGE_TOKEN}'")
        browser.errors.clear()  # the 401 that showed the login form is expected
        await browser.submit("form[action='/login']")
        found = await browser.eval("""(() => {
            const box = (el) => el ? el.getBoundingClientRect().toJSON() : null;
            // each chart comes in two layouts; the page's CSS shows one
            const shown = (sel) => [...document.querySelectorAll(sel)]
                                     .find(el => el.getClientRects().length);
            const card = document.querySelector('section.card.headline');
            return {
              url: location.pathname, login: document.cookie,
              card: box(card), cardText: card ? card.innerText : '',
              state: card ? card.querySelector('.pill').textContent : '',
              timeline: box(shown('svg.timeline')),
              lanes: [...shown('svg.timeline').querySelectorAll('g.lane')]
                       .map(g => g.getAttribute('data-hosts')),
              bars: shown('svg.timeline').querySelectorAll('rect.bar').length,
              activity: box(shown('svg.activity')),
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


def _run_in_chromium(tmp_path: Path, name: str) -> dict:
    path, alerts, prom = SCENARIOS[name]
    with serve_app(prom.app()) as prom_url:
        ctx = pages_context(tmp_path, pages=PageAuth(PAGE_TOKEN))
        with serve(ctx) as running:
            post_alerts(running, alerts())
            measure(ctx, RunKey(*path.split("/")[2:]), prom_url, impacts=False)
            shot = tmp_path / f"run-page-{name}.png"
            found = asyncio.run(_visit(running.url, path, shot))
    assert found["login_title"] == "Sign in"
    assert found["url"] == path and found["login"] == ""  # HttpOnly: invisible to scripts
    assert found["errors"] == []
    # The story on the first screen: card, its buttons, the timeline and the plot.
    assert found["height"] == 900
    assert found["card"]["bottom"] < 900 and found["grafana"]["bottom"] < 900
    assert found["timeline"]["bottom"] < 900 and found["activity"]["top"] < 900
    assert found["scroll"] <= 1280 and found["runs_rows"] == [path.removeprefix("/runs/")]
    assert shot.stat().st_size > 20_000
    keep = os.environ.get("PAGES_SCREENSHOT_DIR")
    if keep:
        target = "run-page.png" if name == "cascade" else f"run-page-{name}.png"
        shutil.copy(shot, Path(keep) / target)
    return found


def test_cascade_run_page_in_chromium(tmp_path):
    found = _run_in_chromium(tmp_path, "cascade")
    assert "GpuContainedEccError" in found["cardText"] and "node017 GPU 3" in found["cardText"]
    assert "Restart the job from its last checkpoint" in found["cardText"]
    # the bridge's own runbook, never the URL an alert carries
    assert found["runbook"].endswith("/runbook#gpucontainedeccerror")
    assert found["lanes"] == ["1", "64"] and found["bars"] == 3
    assert found["details"] == 2 and found["state"] == "open"


def test_thermal_run_page_in_chromium(tmp_path):
    found = _run_in_chromium(tmp_path, "thermal")
    assert "GpuThermalViolation" in found["cardText"]
    assert "gpu-node-065 GPUs 0-3" in found["cardText"]
    assert "throughput (MFU) of the whole job drops" in found["cardText"]
    assert found["state"].startswith("resolved 2026-11-29 12:04:00")
    assert found["lanes"] == ["1", "1"] and found["details"] == 2


# What a reader sees of each shown chart (the other width's layout is hidden): every label inside
# the chart's visible box (the chart cut by the window and by any box that clips or scrolls it),
# no label over another, text at least 9.5 px on screen, and every label cut with "…" carrying
# its full text as the tooltip of the group around it.
LABELS = """(() => {
  const out = {hidden: [], overlaps: [], small: [], untipped: [], tips: {}, texts: [],
               charts: 0, sideways: document.documentElement.scrollWidth > innerWidth};
  for (const svg of document.querySelectorAll('svg.timeline, svg.activity')) {
    if (!svg.getClientRects().length) continue;
    out.charts += 1;
    const box = svg.getBoundingClientRect();
    const vis = {left: Math.max(box.left, 0), right: Math.min(box.right, innerWidth),
                 top: box.top, bottom: box.bottom};
    for (let el = svg.parentElement; el; el = el.parentElement) {
      if (getComputedStyle(el).overflowX === 'visible') continue;
      const r = el.getBoundingClientRect();
      vis.left = Math.max(vis.left, r.left);
      vis.right = Math.min(vis.right, el === document.documentElement ? innerWidth : r.right);
    }
    const scale = box.width / svg.viewBox.baseVal.width;
    const texts = [...svg.querySelectorAll('text')].map(t => [t, t.getBoundingClientRect()]);
    for (const [t, r] of texts) {
      const body = t.textContent;
      out.texts.push(body);
      if (r.left < vis.left - 0.5 || r.right > vis.right + 0.5 || r.top < vis.top - 0.5
          || r.bottom > vis.bottom + 0.5) out.hidden.push(body);
      if (parseFloat(getComputedStyle(t).fontSize) * scale < 9.5) out.small.push(body);
      if (body.endsWith('…')) {
        const tip = t.parentElement.querySelector(':scope > title');
        if (tip && tip.textContent.startsWith(body.slice(0, -1))
            && tip.textContent.length >= body.length) out.tips[body] = tip.textContent;
        else out.untipped.push(body);
      }
    }
    for (let i = 0; i < texts.length; i++) for (let j = i + 1; j < texts.length; j++) {
      const a = texts[i][1], b = texts[j][1];
      if (Math.min(a.right, b.right) - Math.max(a.left, b.left) > 0.5
          && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 0.5)
        out.overlaps.push([texts[i][0].textContent, texts[j][0].textContent]);
    }
  }
  return out;
})()"""


async def _labels_at(base: str, path: str, width: int, shot: Path) -> dict:
    async with Browser() as browser:
        await browser.send("Emulation.setDeviceMetricsOverride", width=width, height=900,
                           deviceScaleFactor=1, mobile=False)
        await browser.goto(base + path)
        await browser.eval(f"document.querySelector('input[name=token]').value = "
                           f"'{PAGE_TOKEN}'")
        await browser.submit("form[action='/login']")
        await browser.screenshot(shot, full_page=True)
        return await browser.eval(LABELS)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_chart_labels_are_whole_apart_and_readable_at_two_widths(tmp_path, name):
    """At 1280 and 800 px: no label cut by what the reader sees of its chart ("GpuThermalV",
    or a chart wider than the window scrolled sideways), none over another ("issue start"
    over "root cause"), no text shrunk below 9.5 px, and a label too long for its room is
    folded with its full text in the tooltip; the full-page screenshots stay in tmp_path."""
    path, alerts, prom = SCENARIOS[name]
    with serve_app(prom.app()) as prom_url:
        ctx = pages_context(tmp_path, pages=PageAuth(PAGE_TOKEN))
        with serve(ctx) as running:
            post_alerts(running, alerts())
            measure(ctx, RunKey(*path.split("/")[2:]), prom_url, impacts=False)
            for width in (1280, 800):
                shot = tmp_path / f"labels-{name}-{width}.png"
                found = asyncio.run(_labels_at(running.url, path, width, shot))
                assert found["charts"] == 2, (width, found)
                assert not found["sideways"], width
                assert found["hidden"] == [], (width, found["hidden"])
                assert found["overlaps"] == [], (width, found["overlaps"])
                assert found["small"] == [], (width, found["small"][:5])
                assert found["untipped"] == [], (width, found["untipped"])
                if name == "edge":
                    # the late bar is named whole beside it; the marker labels are whole
                    assert "TrainingStraggler ×4" in found["texts"], (width, found["texts"])
                    assert "issue start 12:00:00" in found["texts"], width
                    assert "root cause 12:00:04" in found["texts"], width
                    # the root host's name does not fit its column: cut, whole in the tooltip
                    assert f"{EDGE_ROOT} GPU 3 (root cause)" in found["tips"].values(), (
                        width, found["tips"])


async def _runs_at(base: str, width: int, shot: Path) -> dict:
    async with Browser() as browser:
        await browser.send("Emulation.setDeviceMetricsOverride", width=width, height=900,
                           deviceScaleFactor=1, mobile=False)
        await browser.goto(base + "/runs")
        await browser.eval(f"document.querySelector('input[name=token]').value = "
                           f"'{PAGE_TOKEN}'")
        await browser.submit("form[action='/login']")
        await browser.screenshot(shot, full_page=True)
        return await browser.eval("""(() => ({
            scroll: document.documentElement.scrollWidth,
            headline: [...document.querySelectorAll('table tr td:nth-child(3)')]
                        .map(td => td.getBoundingClientRect().width),
        }))()""")


def test_runs_list_fits_800_px(tmp_path):
    """/runs at 800 px wide: nothing scrolls sideways, and the headline column keeps room to
    be read (a long run id wraps instead of pushing the table past the window)."""
    _path, alerts, _prom = SCENARIOS["cascade"]
    ctx = pages_context(tmp_path, pages=PageAuth(PAGE_TOKEN))
    with serve(ctx) as running:
        post_alerts(running, alerts())
        post_alerts(running, [alert("NodeDown", category="node", host="gpu-node-001",
                                    run="a-very-long-run-id-" + "x" * 60, start=T0)])
        found = asyncio.run(_runs_at(running.url, 800, tmp_path / "runs-800.png"))
    assert found["scroll"] <= 800, found
    assert min(found["headline"]) >= 160, found  # some 20 characters a line
