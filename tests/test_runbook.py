"""Every alert's runbook_url resolves: the bridge serves the runbook, the shipped default base is
the bridge's Service in the shipped manifests, and each anchor exists on the served page."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import requests
import yaml

from demo.stack import point_runbook
from harness import bridge_payloads as bp
from wandb_infra.bridge.web.runbook import _inline, page
from wandb_infra.catalog import runbook
from wandb_infra.catalog.alerts import ALERTS

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "alert_rules" / "wandb-infra.rules.yml"


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids |= {v for k, v in attrs if k == "id" and v}


def _runbook_urls() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r["annotations"]["runbook_url"]
            for g in groups for r in g["rules"] if "alert" in r}


def test_default_base_is_the_bridge_service_of_the_shipped_manifests():
    docs = yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "bridge.yaml").read_text())
    service = next(d for d in docs if d and d["kind"] == "Service")
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http")
    meta = service["metadata"]
    assert f"http://{meta['name']}.{meta['namespace']}.svc:{port}" == runbook.DEFAULT_BASE


def test_every_shipped_alert_links_to_its_entry_under_the_default_base():
    urls = _runbook_urls()
    assert set(urls) == set(ALERTS)
    assert urls == {name: runbook.url(runbook.DEFAULT_BASE, name) for name in urls}


def test_the_bridge_serves_every_anchor_without_login(tmp_path):
    ctx = bp.make_context(tmp_path)
    with bp.serve(ctx) as running:
        resp = requests.get(running.url + runbook.PATH, timeout=10)
        other = requests.get(running.url + "/runs", timeout=10)
    assert resp.status_code == 200, resp.text[:300]
    assert resp.headers["Content-Type"].startswith("text/html")
    assert other.status_code in (401, 303), "only the runbook is public, not the run pages"
    parser = _Ids()
    parser.feed(resp.text)
    missing = [name for name, url in _runbook_urls().items()
               if urlsplit(url).path != runbook.PATH or urlsplit(url).fragment not in parser.ids]
    assert missing == []
    assert "xid-catalog" in parser.ids


def test_markdown_runbook_has_the_same_anchors():
    text = (ROOT / "docs" / "runbook.md").read_text()
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', text))
    assert {e.anchor for e in runbook.entries()} <= anchors


def test_catalog_text_is_escaped_and_its_markdown_rendered():
    assert _inline("a <b> `c<d>` **e**") == (
        "a &lt;b&gt; <code>c&lt;d&gt;</code> <strong>e</strong>")
    # templates read as placeholders, never raw (or evaluated)
    html = page()
    assert "{{" not in html and "XID ‹xid› on GPU ‹gpu› on ‹hostname›" in html


def test_the_demo_points_every_runbook_url_at_its_own_bridge():
    moved = yaml.safe_load(point_runbook(RULES.read_text(), "http://127.0.0.1:9999"))
    urls = [r["annotations"]["runbook_url"] for g in moved["groups"] for r in g["rules"]
            if "alert" in r]
    assert urls
    assert all(u.startswith("http://127.0.0.1:9999/runbook#") for u in urls)
