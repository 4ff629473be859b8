"""The run page tells the cascade's story (headline card, grouped consequences, SVG
timeline, GPU-activity plot), /runs lists and filters runs, empty runs get HTML, W&B status is
truthful, and label text stays inert in the new markup."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta

import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.bridge_payloads import T0, alert, serve, serve_app
from harness.processes import free_port
from tests.budget import examples
from tests.pages_helpers import (
    AUTH,
    HTML,
    FakePrometheus,
    cascade_bridge,
    pages_context,
    post_alerts,
    tags,
)
from tests.views import view_of
from wandb_infra.bridge.diagnosis.evidence import Change, Timeline
from wandb_infra.bridge.diagnosis.root_cause import AlertFact, Issue, diagnose
from wandb_infra.bridge.ingest.outbox import OutboxRow
from wandb_infra.bridge.prometheus.remediation import Remediation
from wandb_infra.bridge.web.pages import run_html, runs_html, wandb_text
from wandb_infra.bridge.web.timeline import MAX_HOST_LANES, lanes, offset_text, timeline_svg
from wandb_infra.common.runkey import RunKey

RUN_PATH = "/runs/team/proj/cascade1"
NO_LINK = lambda *_: ""  # noqa: E731 - a link function that links nothing


def _page(running, path: str = RUN_PATH) -> requests.Response:
    return requests.get(running.url + path, headers=HTML, timeout=30)


def test_cascade_page_headline_grouped_consequences_and_timeline(tmp_path):
    with cascade_bridge(tmp_path) as running:
        resp = _page(running)
    assert resp.status_code == 200
    page = resp.text
    # The headline card comes first and names what, where, impact and what to do.
    card = page.split("<section", 2)[1]
    assert "ROOT CAUSE" in card and "GpuContainedEccError" in card and "node017 GPU 3" in card
    assert "Impact" in card and "What to do" in card
    assert "575 likely consequence(s): TrainingStalled on 64 host(s)" in card
    grafana = [a for t, a in tags(card) if t == "a" and "btn" in (a.get("class") or "")]
    assert grafana and grafana[0]["href"].startswith("http://grafana.invalid/d/")
    # Consequences: one row per alert name with its count, not 575 rows.
    table = page.split("class='consequences'", 1)[1].split("</table>", 1)[0]
    assert table.count("<details>") == 2
    assert re.search(r"<b>TrainingStalled</b>.*?<td>64</td>", table)
    assert re.search(r"<b>GpuXidApplicationError</b>.*?<td>511</td>", table)
    assert "2026-11-29 12:00:40 UTC (+40 s)" in table and "+1 min 9 s" in table
    assert not re.search(r"\d\d:\d\d:\d\d\.\d", page), "timestamps to the second"
    # Timeline: the root cause lane plus one grouped lane for the 64 hosts.
    svg = page.split("<svg class='timeline'", 1)[1].split("</svg>", 1)[0]
    lane_tags = [a for t, a in tags("<svg" + svg) if t == "g"]
    assert [a["class"] for a in lane_tags] == ["lane root", "lane"]
    assert lane_tags[1]["data-hosts"] == "64"
    assert "64 hosts" in svg and "root cause 12:00:00" in svg and "TrainingStalled ×64" in svg
    assert "+30 s" in svg


def _facts(hosts: int) -> list[AlertFact]:
    root = AlertFact("r", "GpuXidError", T0, None, "critical", "gpu_hardware", "h0", "1")
    return [root] + [AlertFact(f"s{i}", "TrainingStalled", T0 + timedelta(seconds=10 + i),
                               T0 + timedelta(minutes=5), "warning", "workload", f"h{i}")
                     for i in range(1, hosts + 1)]


def _issue(facts: list[AlertFact]) -> Issue:
    return diagnose(facts).issues[0]


def _remediation(text: str, since: float = T0.timestamp() + 60) -> Remediation:
    return Remediation(text, text, text, (Timeline(text, (), Change(since, "slurm", text, text)),))


def test_few_hosts_get_a_lane_each_many_share_one():
    few = _issue(_facts(MAX_HOST_LANES))
    assert [lane.label for lane in lanes(few)][1:] == [f"h{i}" for i in range(1, 9)]
    many = _issue(_facts(MAX_HOST_LANES + 1))
    grouped = lanes(many)
    assert len(grouped) == 2 and len(grouped[1].hosts) == MAX_HOST_LANES + 1
    svg = timeline_svg(many)
    assert "root cause 12:00:00" in svg


def test_resolved_issue_marks_start_end_and_offsets():
    facts = [AlertFact("s", "TrainingStalled", T0 - timedelta(seconds=20),
                       T0 + timedelta(minutes=3), "warning", "workload", "h2"),
             AlertFact("r", "GpuXidError", T0, T0 + timedelta(minutes=2), "critical",
                       "gpu_hardware", "h1", "0")]
    svg = timeline_svg(_issue(facts))
    assert "issue start 11:59:40" in svg and "resolved 12:03:00" in svg
    assert [offset_text(s) for s in (13, 60, 249, 3720, -5)] == [
        "+13 s", "+1 min", "+4 min 9 s", "+1 h 2 min", "-5 s"]


def test_remediation_rendered_only_when_present():
    diagnosis = diagnose(_facts(2))
    assert "<dt>Restart</dt>" not in run_html(view_of(diagnosis), "t", NO_LINK)
    rem = Remediation("safe", "drain <now>", "sbatch --exclude=gpu-node-017", (Timeline(
        "gpu-node-017", (), Change(T0.timestamp() + 60, "slurm", "drained", "xid<94>")),))
    page = run_html(view_of(diagnosis, {diagnosis.issues[0].key: rem}), "t", NO_LINK)
    card = page.split("<section", 2)[1]
    assert "<dt>Restart</dt>" in card
    assert "<code class='excl'>sbatch --exclude=gpu-node-017</code>" in card
    assert "drain &lt;now&gt;" in card and "xid&lt;94&gt;" in card
    assert "since 2026-11-29 12:01:00 UTC" in card and "pill ok" in card


def test_activity_plot_from_prometheus_with_markers(tmp_path):
    prom = FakePrometheus()
    with serve_app(prom.app()) as prom_url, \
            cascade_bridge(tmp_path, prom_url) as running:
        page = _page(running).text
    svg = page.split("<svg class='activity'", 1)[1].split("</svg>", 1)[0]
    points = re.search(r"<polyline class='series'[^>]* points='([^']+)'", svg).group(1)
    ys = [float(p.split(",")[1]) for p in points.split()]
    assert max(ys) - min(ys) > 100, "the drop from 80% to 2% is visible"
    assert "GpuContainedEccError 12:00:00" in svg and "tensor activity" in svg
    assert "512 GPUs" in page
    tensor = next(q for q in prom.queries if "TENSOR_ACTIVE" in q)
    assert tensor.startswith("avg(") and "node017" in tensor
    assert any('wandb_run_id="cascade1"' in q for q in prom.queries)


def test_page_renders_with_a_note_when_prometheus_is_down(tmp_path):
    down = f"http://127.0.0.1:{free_port()}"
    with cascade_bridge(tmp_path, down) as running:
        resp = _page(running)
    assert resp.status_code == 200
    assert "class='note'>No GPU activity plot: Prometheus at" in resp.text
    assert "<svg class='timeline'" in resp.text and "<svg class='activity'" not in resp.text


def test_no_prometheus_no_plot_section(tmp_path):
    with cascade_bridge(tmp_path) as running:
        assert "GPU activity" not in _page(running).text


def test_run_without_issues_gets_an_html_empty_state(tmp_path):
    with cascade_bridge(tmp_path) as running:
        html = requests.get(running.url + "/runs/team/proj/nope", headers=HTML, timeout=10)
        api = requests.get(running.url + "/runs/team/proj/nope?format=json", headers=AUTH,
                           timeout=10)
    assert html.status_code == 404 and html.headers["Content-Type"].startswith("text/html")
    # neither alerts nor a verdict: said so, never shown as a clean run
    assert "No verdict yet" in html.text and "team/proj/nope" in html.text
    assert "not a clean bill of health" in html.text
    assert api.status_code == 404 and api.json()["status"] == "error"


def _outbox(**kw) -> OutboxRow:
    base = dict(run=RunKey("t", "p", "r"), dirty_seq=1, delivered_seq=1, pending_since=None,
                attempts=0, next_attempt=0, last_flush=0, parked=None, last_error=None,
                storage_id=None, run_state=None, summary_seq=0, next_state_check=None,
                delivered_at=T0.timestamp())
    return OutboxRow(**{**base, **kw})


def test_wandb_status_is_truthful(tmp_path):
    def status(row: OutboxRow, enabled: bool = True) -> str:
        view = replace(view_of(diagnose([])), delivery=row, wandb_enabled=enabled)
        return wandb_text(view.delivery_status())[0]

    assert status(_outbox(), enabled=False) == "W&B: off (no API key configured)"
    assert status(_outbox()) == "W&B: written at 2026-11-29 12:00:00 UTC"
    assert status(_outbox(dirty_seq=2)) == "W&B: pending"
    assert status(_outbox(parked="run not found")) == "W&B: parked: run not found"
    with cascade_bridge(tmp_path) as running:
        assert "W&amp;B: off (no API key configured)" in _page(running).text
    with cascade_bridge(tmp_path / "on", wandb=True) as running:
        page = _page(running).text
    assert "W&amp;B: pending" in page and "W&amp;B: off" not in page


def test_runs_newest_first_filters_paging_and_severity_colour(tmp_path):
    ctx = pages_context(tmp_path)
    with serve(ctx) as running:
        for n, (entity, project) in enumerate((("a", "p1"), ("a", "p2"), ("b", "p1"))):
            post_alerts(running, [alert("GpuXidError", category="gpu_hardware", host="h1",
                                        gpu="0", run=f"r{n}", entity=entity, project=project,
                                        start=T0 + timedelta(hours=n))])
        post_alerts(running, [alert("TrainingStalled", category="workload", host="h2",
                                    run="old", entity="a", project="p1", severity="warning",
                                    start=T0 - timedelta(hours=1),
                                    end=T0 - timedelta(minutes=30))])

        def ids(query: str) -> list[str]:
            body = requests.get(running.url + "/runs?format=json&" + query, headers=AUTH,
                                timeout=10).json()
            return [r["run_id"] for r in body["runs"]]

        assert ids("") == ["r2", "r1", "r0", "old"]
        assert ids("entity=a") == ["r1", "r0", "old"]
        assert ids("entity=a&project=p1") == ["r0", "old"]
        assert ids("state=resolved") == ["old"]
        assert ids("state=open&entity=a") == ["r1", "r0"]
        assert ids("entity=a&limit=2") == ["r1", "r0"]
        assert ids("entity=a&limit=2&offset=2") == ["old"]
        assert ids("limit=2&offset=2") == ["r0", "old"] and ids("offset=4") == []
        page2 = requests.get(running.url + "/runs?format=json&entity=a&limit=2", headers=AUTH,
                             timeout=10).json()
        assert page2["next_offset"] == 2
        bad = requests.get(running.url + "/runs?state=maybe", headers=AUTH, timeout=10)
        assert bad.status_code == 400
        html = requests.get(running.url + "/runs?entity=a&limit=2", headers=HTML,
                            timeout=10).text
    assert html.index("a/p2/r1") < html.index("a/p1/r0")
    assert "b/p1/r2" not in html
    assert "background:#b00020" in html  # critical headline colour
    assert "href='/runs?entity=a&amp;offset=2&amp;limit=2'" in html
    assert "value='a'" in html


def test_runs_page_shows_resolved_warning_colour(tmp_path):
    stalled = AlertFact("s", "TrainingStalled", T0 + timedelta(seconds=0.5),
                        T0 + timedelta(minutes=5), "warning", "workload", "h<1>")
    page = runs_html([view_of(diagnose([stalled]), run=RunKey("e", "p", "r")).row()], 0)
    assert "background:#c77700" in page and "resolved" in page and "h&lt;1&gt;" in page
    assert "2026-11-29 12:00:00 UTC" in page


ALLOWED = {"html", "head", "meta", "title", "style", "body", "main", "header", "section", "h1",
           "h2", "p", "a", "b", "br", "span", "code", "dl", "dt", "dd", "details", "summary", "ul",
           "li", "table", "tr", "th", "td", "form", "label", "input", "select", "option",
           "button", "svg", "g", "rect", "line", "text", "polyline", "div"}
TEXT = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(
    ["<script>alert(1)</script>", "'><svg onload=alert(1)>", "\"/><a href=javascript:x>",
     "</text><script>x</script>", "]]><!--", "&lt;b&gt;"])


@given(name=TEXT, host=TEXT, gpu=TEXT, text=TEXT)
@settings(max_examples=examples(200), deadline=None)
def test_label_text_stays_inert_in_card_timeline_and_table(name, host, gpu, text):
    annotations = {"summary": text, "description": text, "impact": text, "remediation": text,
                   "runbook_url": "javascript:alert(1)"}
    facts = [AlertFact("a", name, T0, None, "critical", "gpu_hardware", host, gpu, {},
                       annotations)]
    facts += [AlertFact(f"c{i}", text or "x", T0 + timedelta(seconds=5), None, text, "workload",
                        f"{text}{i}", "", {}, annotations) for i in range(12)]
    diagnosis = diagnose(facts)
    view = view_of(diagnosis, {i.key: _remediation(text) for i in diagnosis.issues})
    page = run_html(view, text, lambda *_: "http://grafana.invalid/d/x")
    for tag, attrs in tags(page):
        assert tag in ALLOWED, (tag, attrs)
        assert not any(a.startswith("on") for a in attrs), attrs
        href = attrs.get("href")
        if href is not None:
            assert href.startswith(("/runs", "/runbook#", "http://grafana.invalid/d/")), href


def test_headline_card_first_even_when_an_older_issue_exists(tmp_path):
    heat = alert("GpuThermalViolation", category="gpu_thermal", host="h3", gpu="1", run="r1",
                 start=T0 - timedelta(minutes=30), end=T0 - timedelta(minutes=25),
                 severity="warning")
    xid = alert("GpuXidError", category="gpu_hardware", host="h1", gpu="2", run="r1", start=T0)
    with serve(pages_context(tmp_path)) as running:
        post_alerts(running, [heat, xid])
        page = _page(running, "/runs/team/proj/r1").text
        data = requests.get(running.url + "/runs/team/proj/r1?format=json", headers=AUTH,
                            timeout=10).json()
    assert data["headline"]["issue"] == 1 and data["headline"]["title"] == "GpuXidError on h1 GPU 2"
    cards = page.split("<section class='card issue")[1:]
    assert len(cards) == 2
    assert "ROOT CAUSE</span> GpuXidError" in cards[0]
    assert "SEPARATE ISSUE</span> GpuThermalViolation" in cards[1]
    assert page.count("<svg class='timeline'") == 2
    assert "is the most consequential of 2 issues" in page


def test_run_address_from_the_url_is_escaped_in_the_empty_state(tmp_path):
    with cascade_bridge(tmp_path) as running:
        resp = requests.get(running.url + "/runs/team/proj/%3Cscript%3Ex", headers=HTML,
                            timeout=10)
    assert resp.status_code == 404
    assert "<script>" not in resp.text and "team/proj/&lt;script&gt;x" in resp.text
