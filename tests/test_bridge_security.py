"""Auth on every state-changing endpoint, and alert text kept inert in W&B notes and the bridge's
own HTML pages.

Notes are checked by rendering them with a real CommonMark parser (markdown-it-py, raw HTML
allowed, the most permissive setting a notes renderer could use): alert text must never produce
a link, image, heading or HTML of its own. Pages are parsed with ``html.parser``.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from html.parser import HTMLParser
from pathlib import Path

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from harness.bridge_payloads import T0, TOKEN, alert, make_context, notification, serve
from harness.bridge_process import raw_status
from harness.wandb_standin import WandbStandin
from tests.budget import examples
from tests.views import view_of
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.root_cause import AlertFact, diagnose
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.notes import BEGIN, END, TITLE, render_section
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.bridge.web.pages import run_html, runs_html
from wandb_infra.common.runkey import RunKey

GRAFANA = "https://grafana.example"
EVIL = [
    "<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "[click](javascript:alert(1))",
    "![pixel](http://evil.example/p.png)", "# Heading\n## another", "\r\n- list item\n> quote",
    "<!-- wandb-infra-bridge:end -->", "```\ncode\n```", "| a | b |\n|---|---|", "\x1b[31mred",
    "a\x00b\x07c", "\u202eevil\u202c", "<https://evil.example>", "http://phish.example/x",
    "[ref]: http://evil.example", "&lt;script&gt;", "\\<b>", "*bold* _it_ ~~s~~",
    "'\"><svg onload=alert(1)>",
]
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _link(fact: AlertFact, start, end) -> str:
    return GrafanaLinks(GRAFANA).link(fact, RunKey("team", "proj", "r1"), start, end)


def assert_inert_markdown(section: str) -> None:
    """Rendered as CommonMark with raw HTML on, the section has only the bridge's own markup."""
    assert section.count(BEGIN) == 1 and section.count(END) == 1
    md = MarkdownIt("commonmark", {"html": True})
    headings = 0
    for token in md.parse(section):
        assert token.type not in ("image", "code_block", "fence", "blockquote_open"), token
        if token.type == "html_block":
            assert token.content.strip() in (BEGIN, END, f"{BEGIN}\n{TITLE}"), token.content
        if token.type == "heading_open":
            headings += 1
        for child in token.children or []:
            assert child.type not in ("image", "html_inline"), child
            if child.type == "link_open":
                assert str(child.attrs["href"]).startswith(GRAFANA + "/d/"), child.attrs
            if child.type == "text":
                assert not CONTROL.search(child.content), repr(child.content)
    assert headings <= 1


TEXT = st.one_of(st.sampled_from(EVIL), st.text(max_size=60))


@given(name=TEXT, host=TEXT, gpu=TEXT, texts=st.fixed_dictionaries(
    {k: TEXT for k in ("summary", "description", "impact", "remediation", "runbook_url")}),
       other=TEXT)
@settings(max_examples=examples(400), deadline=None)
def test_any_alert_text_stays_inert_in_notes(name, host, gpu, texts, other):
    annotations = dict(texts)
    facts = [AlertFact("ab", name, T0, None, "critical", "gpu_hardware", host, gpu,
                       {"alertname": name, "x": other}, annotations),
             AlertFact("cd", other, T0 + timedelta(seconds=30), None, "warning", "workload",
                       other, "", {}, annotations)]
    assert_inert_markdown(render_section(view_of(diagnose(facts)), _link))


class _Tags(HTMLParser):
    """Collects every start tag with its attributes."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


# The tags the pages are built from (run card, grouped consequences, login form, SVG timeline
# and plot): anything else in a page came from alert text.
ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "a", "b",
                "br", "span", "table", "tr", "th", "td", "main", "header", "section", "dl", "dt",
                "dd", "details", "summary", "ul", "li", "code", "form", "label", "input",
                "select", "option", "button", "svg", "g", "rect", "line", "text", "polyline", "div"}


def assert_inert_html(page: str) -> None:
    parser = _Tags()
    parser.feed(page)
    for tag, attrs in parser.tags:
        assert tag in ALLOWED_TAGS, (tag, attrs)
        assert not any(a.startswith("on") for a in attrs), attrs
        href = attrs.get("href")
        if href is not None:
            assert href.startswith(("/runs", "/unattributed", "/runbook#", GRAFANA + "/d/")), href


@given(name=TEXT, host=TEXT, gpu=TEXT, text=TEXT, run_id=TEXT)
@settings(max_examples=examples(300), deadline=None)
def test_any_alert_text_stays_inert_in_pages(name, host, gpu, text, run_id):
    run = RunKey("team", "proj", run_id or "r")
    annotations = {"summary": text, "description": text, "impact": text, "remediation": text}
    facts = [AlertFact("ab", name, T0, None, "critical", "gpu_hardware", host, gpu, {},
                       annotations),
             AlertFact("cd", text, T0 + timedelta(seconds=5), None, "warning", "workload", text,
                       "", {}, annotations)]
    diagnosis = diagnose(facts)
    assert_inert_html(run_html(view_of(diagnosis, run=run), run.path(), _link))
    assert_inert_html(runs_html([view_of(diagnosis, run=run).row()], 3))


def _evil_alerts(run: str) -> list[dict]:
    out = []
    for i, text in enumerate(EVIL):
        annotations = {"summary": text, "description": text, "impact": text,
                       "remediation": text, "runbook_url": "javascript:alert(1)"}
        out.append(alert("GpuXidError" if i == 0 else text or "x", category="gpu_hardware",
                         host=f"h{i}{text}", gpu=text, run=run, annotations=annotations,
                         start=T0 + timedelta(seconds=i), extra={"note": text}))
    return out


def test_evil_alerts_end_to_end_in_wandb_notes_and_pages(tmp_path: Path):
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "evil", notes="User *notes* with <b>their</b> markup.",
                   tags=["user"])
        ctx = make_context(tmp_path, links=GrafanaLinks(GRAFANA))
        worker = DeliveryWorker(ctx.store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                                markers=None, links=GrafanaLinks(GRAFANA),
                                metrics=BridgeMetrics(), policy=DeliveryPolicy(flush_interval=0))
        body = notification(_evil_alerts("evil"))
        with serve(ctx) as running:
            resp = requests.post(running.url + "/alertmanager", data=json.dumps(body),
                                 headers={"Authorization": f"Bearer {TOKEN}",
                                          "Content-Type": "application/json"}, timeout=10)
            assert resp.json()["new"] == len(EVIL)
            assert worker.run_once() == 1
            first = wb.run("team", "proj", "evil").notes
            # A second projection (new alert) replaces the section, never duplicates it.
            ctx.store.ingest(parse_notification(json.dumps(notification(
                [alert("NodeDown", category="node", host="late", run="evil",
                       start=T0 + timedelta(hours=3))])).encode()))
            assert worker.run_once() == 1
            notes = wb.run("team", "proj", "evil").notes
            for path in ("/runs", "/runs/team/proj/evil"):
                page = requests.get(running.url + path, headers={
                    "Authorization": f"Bearer {TOKEN}"}, timeout=10).text
                assert_inert_html(page)
                assert "&lt;script&gt;" in page
        user = "User *notes* with <b>their</b> markup."
        assert first.startswith(user) and notes.startswith(user)
        assert_inert_markdown(notes[len(user):])
        assert "late" in notes and notes.count(BEGIN) == 1
        tags = wb.run("team", "proj", "evil").tags
        assert tags[0] == "user" and len(tags) == len(set(tags))
        assert all(len(t) <= 64 and not CONTROL.search(t) for t in tags), tags


@pytest.fixture
def bridge(tmp_path: Path):
    ctx = make_context(tmp_path)
    with serve(ctx) as running:
        yield running


BAD_CREDENTIALS = [None, "", "Bearer", "Bearer ", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}",
                   f"bearer{TOKEN}", f"Basic {TOKEN}", TOKEN, f"Bearer  {TOKEN}",
                   f"Bearer {TOKEN.upper()}", "Basic YWRtaW46YWRtaW4="]


def test_every_state_changing_route_requires_credentials(bridge):
    """Walks the app's router, so a route added later is covered too."""
    from wandb_infra.bridge.web.webhook import create_app  # noqa: PLC0415 - only to list the routes

    routes = [(r.method, r.resource.canonical) for r in create_app(bridge.ctx).router.routes()]
    changing = [(m, p) for m, p in routes if m not in ("GET", "HEAD", "OPTIONS")]
    assert changing, "the webhook is a state-changing route"
    body = json.dumps(notification([alert("NodeDown", category="node", host="h", run="a")]))
    for method, path in changing:
        for header in BAD_CREDENTIALS:
            headers = {"Content-Type": "application/json"}
            if header is not None:
                headers["Authorization"] = header
            resp = requests.request(method, bridge.url + path, data=body, headers=headers,
                                    timeout=10)
            assert resp.status_code == 401, (method, path, header, resp.status_code)
    port = int(bridge.url.rsplit(":", 1)[1])
    for raw in (b"Bearer \xff\xfe", ("Bearer " + TOKEN[:-1] + "\u00e9").encode("latin-1"),
                b"Basic \x80\x80", TOKEN.encode() + b"\xff"):
        assert raw_status(port, "POST", "/alertmanager", raw) == 401, raw
    for method in ("PUT", "DELETE", "PATCH"):
        resp = requests.request(method, bridge.url + "/alertmanager", data=body, timeout=10,
                                headers={"Authorization": f"Bearer {TOKEN}"})
        assert resp.status_code == 405
    for path in ("/runs", "/runs/team/proj/a", "/unattributed"):
        assert requests.get(bridge.url + path, timeout=10).status_code == 401
    assert bridge.ctx.store.alert_count() == 0
    for path in ("/metrics", "/healthz", "/readyz"):
        text = requests.get(bridge.url + path, timeout=10).text
        assert TOKEN not in text and "Bearer" not in text
