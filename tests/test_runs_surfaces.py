"""One run, one story: for each kind of run the end-to-end tests play, the headline, verdict,
advice, impact and GPU-hours the W&B notes and summary say (written by the real delivery worker
into the W&B stand-in) equal, field by field, what the run page serves as JSON (the served
bridge) and what ``explain --json`` prints for the same alerts, because all three render the
same run view; page views cost no W&B request and no store write; a forged alert next to a real
one changes none of them; a telemetry gap reads as one, never as a fault to act on."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from harness.bridge_payloads import T0, TOKEN, alert, cascade, make_context, notification, serve
from harness.wandb_standin import WandbStandin
from tests.test_endings_verdict import _coverage
from tests.views import prometheus_raising
from wandb_infra.bridge.diagnosis.impact import HANG, Impact, hours_text
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.outcome import Outcome, judge
from wandb_infra.bridge.diagnosis.root_cause import Diagnosis, diagnose
from wandb_infra.bridge.explain_cli import explained, view_json
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker, run_service
from wandb_infra.bridge.projection.notes import md_escape
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.prometheus.confirm import Confirmation
from wandb_infra.bridge.prometheus.history import catalog_annotations
from wandb_infra.bridge.prometheus.remediation import NodeStateHistory
from wandb_infra.bridge.quarantine.actuator import check
from wandb_infra.bridge.runs.service import RunService
from wandb_infra.bridge.web.pages import run_html
from wandb_infra.common.runkey import RunKey

pytestmark = pytest.mark.integration  # a served bridge, the W&B stand-in, a Prometheus stub

RUN = RunKey("team", "proj", "r1")
NOW = T0.timestamp() + 900
AUTH = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"}


class _Measured:
    """The impact reader as the worker uses it: a hang that began 20 s before the alert's own
    onset (the measured change moves the issue's onset)."""

    def for_diagnosis(self, _run: RunKey, diagnosis: Diagnosis,
                      _state: str | None = None) -> dict[str, Impact]:
        return {i.key: Impact(HANG, "no GPU of the run computed", i.root.onset.timestamp() - 20,
                              "the run's GPUs went idle 20 s before the alert",
                              i.root.onset.timestamp() + 300, "recovery", 16, 16 * 320 / 3600)
                for i in diagnosis.issues}


def _xid95(gpu: str = "5") -> dict[str, Any]:
    return alert("GpuUncontainedEccError", category="gpu_hardware", host="gpu-node-067",
                 gpu=gpu, run="r1", start=T0, extra={"xid": "95"})


def _forged() -> dict[str, Any]:
    return alert("GpuFallenOffBus", category="gpu_hardware", host="gpu-node-067", run="r1",
                 start=T0 - timedelta(seconds=30))


GAP_TEXT = catalog_annotations({"alertname": "HostTelemetryGap", "hostname": "gpu-node-002",
                                "exporter": "dcgm_exporter"})
# (alerts Prometheus raised, alerts it did not, the ended run's verdict: None, clear, blind)
SCENARIOS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]], str | None]] = {
    "xid94-cascade": (cascade(hosts=4, gpus=2, run="r1", bad_host=1, bad_gpu=0), [], None),
    "thermal": ([alert(n, category=c, host="gpu-node-001", gpu=str(g), run="r1",
                       start=T0 + timedelta(seconds=s), severity="warning")
                 for n, c, s in (("GpuThermalViolation", "gpu_degradation", 0),
                                 ("TrainingStalled", "workload", 30)) for g in range(4)
                 if n == "GpuThermalViolation" or g == 0], [], None),
    "xid95-reset": ([_xid95()], [], "infrastructure"),
    "host-faults": ([alert("HostMemoryUncorrectableErrors", category="host", host="gpu-node-002",
                           run="r1", start=T0),
                     alert("NodeDown", category="node", host="gpu-node-003", run="r1",
                           start=T0 + timedelta(seconds=20))], [], None),
    "clean": ([], [], "clear"),
    "blind": ([], [], "blind"),
    "forged-next-to-real": ([_xid95()], [_forged()], None),
    "telemetry-gap": ([alert("HostTelemetryGap", category="node", host="gpu-node-002", run="r1",
                             start=T0, end=T0 + timedelta(minutes=5), severity="warning",
                             extra={"exporter": "dcgm_exporter"}, annotations=GAP_TEXT)],
                      [], "clear"),
}


@dataclass
class Surfaces:
    notes: str
    summary: dict[str, Any]
    page: dict[str, Any]
    text: str  # the run page as plain text (?format=text, what explain prints)
    explained: dict[str, Any]


@contextmanager
def _delivered(tmp_path: Path, raised: list[dict[str, Any]], forged: list[dict[str, Any]],
               ending: str | None, wb: WandbStandin, *,
               asked: list[str] | None = None) -> Iterator[tuple[Store, str]]:
    """The run delivered to the W&B stand-in by the real worker, confirming with a Prometheus
    that raised ``raised``; yields the store and that Prometheus' URL."""
    wb.add_run("team", "proj", "r1", state="crashed" if ending else "running")
    store = Store(tmp_path / "bridge.sqlite")
    with prometheus_raising(raised, asked) as prom:
        worker = DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                                markers=None, links=GrafanaLinks("https://grafana.example"),
                                metrics=BridgeMetrics(), policy=DeliveryPolicy(flush_interval=0),
                                prometheus=PrometheusClient(prom),
                                clock=lambda: NOW)
        worker.projector.impact = _Measured()  # type: ignore[assignment]
        if raised or forged:
            store.ingest(parse_notification(json.dumps(notification(raised + forged)).encode()),
                         NOW)
        if ending is not None:
            diagnosis = diagnose(store.facts(RUN))
            outcome = judge(diagnosis, None if ending == "blind" else _coverage(2), NOW - 60,
                            "W&B state crashed")
            store.add_endings([(RUN, NOW - 60, outcome.how)], NOW)
            store.record_outcome(RUN, outcome.verdict, outcome.dumps(), NOW, deliver=True)
        assert worker.run_once() == 1
        yield store, prom


def _surfaces(tmp_path: Path, store: Store, prom: str, wb: WandbStandin) -> Surfaces:
    runs = run_service(store, PrometheusClient(prom), DeliveryPolicy(), None,
                       wandb_enabled=True, clock=lambda: NOW, reads=False)
    ctx = make_context(tmp_path, store=store, runs=runs,
                       links=GrafanaLinks("https://grafana.example"))
    with serve(ctx) as bridge:
        page = requests.get(bridge.url + "/runs/team/proj/r1", headers=AUTH, timeout=10).json()
        text = requests.get(bridge.url + "/runs/team/proj/r1?format=text", timeout=10,
                            headers={"Authorization": AUTH["Authorization"]})
        assert text.headers["Content-Type"].startswith("text/plain")
    record = wb.run("team", "proj", "r1")
    return Surfaces(record.notes, dict(record.summary), page, text.text,
                    _explained(store, prom))


def _explained(store: Store, prom: str) -> dict[str, Any]:
    """What ``explain --json`` prints for the run: its rendering of the alerts Prometheus raised
    (explain reads them from the ALERTS history), assembled with nothing stored, the impacts
    measured and the verdict judged on the same coverage."""
    confirmed = [f for f in store.facts(RUN) if f.alertname != "GpuFallenOffBus"]
    service = RunService(None, history=NodeStateHistory(PrometheusClient(prom)),
                         wandb_enabled=False, clock=lambda: NOW)
    view = service.assemble(RUN, Confirmation(tuple(confirmed), (), ()))
    ending = store.ending(RUN)
    stored = None if ending is None or ending.outcome is None else Outcome.loads(ending.outcome)
    outcome = None if stored is None else judge(view.diagnosis, stored.coverage, stored.ended_at,
                                                "explain")
    shown = explained(view, impacts=_Measured().for_diagnosis(RUN, view.diagnosis),
                      outcome=outcome, now=NOW)
    return view_json(shown, GrafanaLinks("https://grafana.example"))


def _fields(view: dict[str, Any]) -> dict[str, Any]:
    """The story's fields: headline, verdict, each issue's advice and impact, GPU-hours."""
    verdict = view.get("verdict")
    return {"headline": view.get("headline"),
            "verdict": None if verdict is None else (verdict["verdict"], verdict["text"],
                                                     verdict["coverage_line"]),
            "restart": (view.get("remediation") or {}).get("verdict"),
            "advice": [i["advice"] for i in view["issues"]],
            "onsets": [i["onset"] for i in view["issues"]],
            "impacts": view.get("impacts"), "gpu_hours": view.get("gpu_hours_lost")}


@pytest.mark.parametrize("name", SCENARIOS)
def test_notes_summary_page_and_explain_tell_one_story(tmp_path, name):
    raised, forged, ending = SCENARIOS[name]
    with WandbStandin() as wb, _delivered(tmp_path, raised, forged, ending, wb) as (store, prom):
        got = _surfaces(tmp_path, store, prom, wb)
    page, notes = got.page, got.notes.replace("\\", "")
    assert _fields(got.explained) == _fields(page)
    headline = page.get("headline")
    if headline is None:
        assert "Headline:" not in notes and "Headline:" not in got.text
    else:
        assert f"**Headline: {headline['title']}**" in notes
        assert headline["advice"] and f"- What to do: {headline['advice']}" in notes
        assert f"  Headline: {headline['title']}." in got.text
    for issue in page["issues"]:
        assert f"- What to do: {md_escape(issue['advice']).replace(chr(92), '')}" in notes
        assert f"    do now      {issue['advice']}" in got.text
        onset = datetime.fromisoformat(issue["onset"].replace("Z", "+00:00"))
        assert f"{onset:%Y-%m-%d %H:%M:%S} UTC to " in notes  # the measured onset, both places
        assert onset.timestamp() == page["impacts"][issue["key"]]["onset"]
        impact = page["impacts"][issue["key"]]
        assert f"- Impact on this run (measured): {impact['headline']}" in notes
    if page["issues"]:
        assert f"GPU-hours lost by this run: **{hours_text(page['gpu_hours_lost'])}**" in notes
    verdict = page.get("verdict")
    if verdict is not None:
        assert f"**Verdict: {verdict['verdict']}**" in notes
        assert got.summary["infra/verdict"] == verdict["verdict"]
        if page["issues"]:
            assert got.summary["infra/gpu_hours_lost"] == page["gpu_hours_lost"]
            assert got.summary["infra/restart_verdict"] == page["remediation"]["verdict"]
    if forged:  # the real headline everywhere, the forged alert listed apart on the page only
        assert headline is not None and headline["title"].startswith("GpuUncontainedEccError")
        assert "GpuFallenOffBus" not in notes and "GpuFallenOffBus" not in got.text
        (apart,) = page["unconfirmed"]
        assert apart["alert"]["alertname"] == "GpuFallenOffBus" and apart["final"]
    if name == "telemetry-gap":  # a coverage gap from its onset (2 min before it fired), not a
        # fault: nothing to drain or exclude
        assert verdict is not None and verdict["verdict"] == "incomplete"
        assert "no GPU telemetry from gpu-node-002 from 11:58:00 to 12:05:00" in verdict["text"]
        assert page["remediation"]["verdict"] == "safe" and not page["remediation"]["exclusion"]
        said = (notes + json.dumps(page)).lower()
        assert not any(word in said for word in ("unsafe", "exclude", "drain")), said


def test_page_views_call_no_wandb_and_write_nothing(tmp_path):
    """50 views of the run page (JSON and HTML) and of /runs: not one W&B request (counted at
    the stand-in), not one Prometheus query (counted at its stand-in) and not one store commit
    (SQLite's data_version, seen from outside)."""
    asked: list[str] = []
    with WandbStandin() as wb, _delivered(tmp_path, [_xid95()], [_forged()], None, wb,
                                          asked=asked) as (store, prom):
        runs = run_service(store, PrometheusClient(prom), DeliveryPolicy(), None,
                           wandb_enabled=True, clock=lambda: NOW, reads=False)
        watcher = sqlite3.connect(store.path)
        before = watcher.execute("PRAGMA data_version").fetchone()[0]
        calls, queries = len(wb.requests), len(asked)
        assert queries  # the worker asked
        with serve(make_context(tmp_path, store=store, runs=runs)) as bridge:
            for i in range(50):
                path = ("/runs/team/proj/r1", "/runs")[i % 2]
                accept = ("application/json", "text/html")[i // 2 % 2]
                resp = requests.get(bridge.url + path, timeout=10,
                                    headers={**AUTH, "Accept": accept})
                assert resp.status_code == 200
        assert len(wb.requests) == calls and len(asked) == queries
        assert watcher.execute("PRAGMA data_version").fetchone()[0] == before
        watcher.close()


def test_the_page_shows_each_quarantine_decision(tmp_path):
    """Acted, refused by the breaker, dry run and not needed: each issue's decision as the
    audit log holds it, on the run page as in the notes."""
    audit = tmp_path / "quarantine-audit.jsonl"
    alerts = [_xid95("5"), alert("GpuXidApplicationError", category="workload", host="gpu-node-068",
                                 gpu="1", run="r1", start=T0 + timedelta(hours=1),
                                 severity="warning", extra={"xid": "13"})]
    store = Store(tmp_path / "bridge.sqlite")
    store.ingest(parse_notification(json.dumps(notification(alerts)).encode()), NOW)
    key = diagnose(store.facts(RUN)).issues[0].key
    for outcome, state in (("done", "acted"), ("refused", "refused"), ("dry_run", "dry run")):
        audit.write_text(json.dumps({"at": NOW, "issue": key, "host": "gpu-node-067",
                                     "outcome": outcome, "detail": "breaker: 2 of 2 nodes"})
                         + "\n")
        policy = DeliveryPolicy(quarantine={**check(None), "enabled": True, "scheduler": "slurm",
                                            "audit_log": str(audit)})
        worker = DeliveryWorker(store, client=None, markers=None, links=GrafanaLinks(""),
                                metrics=BridgeMetrics(), policy=policy, clock=lambda: NOW)
        assert worker.quarantine is not None
        worker.quarantine.refresh()
        view = worker.runs.view(RUN)
        assert view is not None
        detail = view.as_dict(lambda *_: "")
        page = detail["remediations"]
        assert page[key]["quarantine"]["state"] == state, outcome
        html = run_html(view, "r1", lambda *_: "")
        assert "<dt>Quarantine</dt><dd><span class='pill" in html and f">{state}</span>" in html
        other = next(k for k in page if k != key)
        assert page[other]["quarantine"]["state"] == "not needed"
