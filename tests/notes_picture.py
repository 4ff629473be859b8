"""``docs/screenshots/run-notes.png``: what a run shows in W&B, as the bridge writes it.

W&B itself cannot run here, so this is not a W&B screenshot: the bridge's delivery worker writes
the test suite's XID 94 cascade (``harness/bridge_payloads.cascade``, hosts ``node000``-``node003``,
with the rules' own annotation texts) to a run of the W&B stand-in whose trainer logged a step
every 7 s, without Prometheus (so the impact is the catalog's text, not measured, and the
restart verdict rests on the fault alone); the tags and notes the stand-in recorded are
rendered (notes as Markdown with markdown-it-py, tags as chips) and photographed in headless
Chromium. Run: ``.venv/bin/python -m tests.notes_picture``.
"""

from __future__ import annotations

import asyncio
import html
import json
import sys
import tempfile
from pathlib import Path

import requests
from markdown_it import MarkdownIt

from harness.bridge_payloads import T0, cascade, notification
from harness.wandb_standin import WandbStandin
from tests.cdp_browser import Browser
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.bridge.prometheus.history import catalog_annotations

OUT = Path(__file__).resolve().parent.parent / "docs" / "screenshots" / "run-notes.png"
CSS = """body{font:15px/1.5 system-ui,sans-serif;margin:24px;color:#1a1c1f;max-width:1180px}
.label{font-size:13px;color:#6b6f76;border:1px dashed #b8bcc2;padding:6px 10px;margin-bottom:16px}
h2{font-size:17px;margin:0 0 8px}.tag{display:inline-block;background:#e8ecf3;border-radius:4px;
padding:1px 8px;margin:0 6px 6px 0;font-size:13px}.notes{border-top:1px solid #dfe2e6;
margin-top:12px;padding-top:8px}code,pre{background:#f3f4f6}pre{padding:6px 10px}"""


def recorded_run(state: Path) -> tuple[list[str], str]:
    """The tags and notes the stand-in holds after the bridge projected the cascade."""
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "cascade1", tags=["baseline"],
                   notes="Pre-training, 64 hosts, lr 3e-4.")
        rows = [json.dumps({"loss": 2.0 - i / 100, "_timestamp": T0.timestamp() - 120 + 7 * i})
                for i in range(30)]
        requests.post(f"{wb.url}/files/team/proj/cascade1/file_stream", timeout=5,
                      auth=("api", wb.api_key), json={"files": {"wandb-history.jsonl": {
                          "offset": 0, "content": rows}}}).raise_for_status()
        store = Store(state / "bridge.sqlite")
        worker = DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                                markers=None, links=GrafanaLinks("http://localhost:3000"),
                                metrics=BridgeMetrics(), policy=DeliveryPolicy(flush_interval=0),
                                clock=lambda: T0.timestamp() + 300, seed=1)
        alerts = cascade(hosts=4, gpus=2)
        for alert in alerts:  # the rules' texts, as Alertmanager sends them
            known = catalog_annotations(alert["labels"])
            alert["annotations"] = {k: known[k] for k in ("summary", "description", "impact",
                                                          "remediation") if k in known}
        body = json.dumps(notification(alerts)).encode()
        store.ingest(parse_notification(body), T0.timestamp() + 60)
        worker.run_once()
        run = wb.run("team", "proj", "cascade1")
        store.close()
        return run.tags, run.notes


def page(tags: list[str], notes: str) -> str:
    """The tags and the notes as one HTML page, labelled as what it is."""
    rendered = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(notes)
    chips = "".join(f'<span class="tag">{html.escape(t)}</span>' for t in tags)
    return (f"<!doctype html><meta charset=utf-8><style>{CSS}</style>"
            '<div class="label">Rendering of the tags and notes the bridge wrote to a run of '
            "the W&amp;B stand-in (the test suite's XID 94 cascade on team/proj/cascade1), "
            "Markdown rendered by markdown-it-py: not a W&amp;B screenshot.</div>"
            f"<h2>Tags</h2>{chips}<div class=notes><h2>Notes</h2>{rendered}</div>")


async def photograph(document: Path, out: Path) -> None:
    """A full-page PNG of ``document`` in headless Chromium."""
    async with Browser() as browser:
        await browser.goto(document.as_uri())
        await browser.screenshot(out, full_page=True)
        if browser.errors:
            raise RuntimeError(f"the page logged errors: {browser.errors}")


def main() -> int:
    """Write ``docs/screenshots/run-notes.png``."""
    with tempfile.TemporaryDirectory(prefix="run-notes-") as tmp:
        tags, notes = recorded_run(Path(tmp))
        document = Path(tmp) / "notes.html"
        document.write_text(page(tags, notes), encoding="utf-8")
        asyncio.run(photograph(document, OUT))
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
