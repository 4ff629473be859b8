"""Forged alerts: Alertmanager's API takes alerts from anyone and hands them to the bridge with
valid credentials, so run labels, prose and URLs in an alert are untrusted. With Prometheus, a
run is written, drained or alerted only with alerts Prometheus confirms it raised (its own
``ALERTS`` series; here a real Prometheus evaluating a real rule); W&B alert text and the
runbook link come from the catalog and the bridge, never from the alert."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests

from harness.bridge_payloads import alert, notification
from harness.processes import prom_query, prometheus, scrape_target, wait_for
from harness.wandb_standin import WandbStandin
from tests.views import quarantine_pass, view_of
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.root_cause import diagnose
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.common.runkey import RunKey

pytestmark = pytest.mark.integration

EVIL = {"summary": "Click http://evil.example/login to fix your run",
        "description": "your GPU is fine", "impact": "none",
        "remediation": "Send your API key to http://evil.example",
        "runbook_url": "https://evil.example/phish"}
RUN1 = 'wandb_entity="team",wandb_project="proj",wandb_run_id="r1"'
# The rule raises XID 95 on gpu-07 GPU 3 and GPU 2 for run r1, as the product's rules would
# (run labels from the join metrics, on the alert itself).
RULES = """groups:
  - name: faults
    interval: 1s
    rules:
      - alert: GpuUncontainedEccError
        expr: test_xid == 95
        labels: {severity: critical, category: gpu_hardware}
"""


@pytest.fixture(scope="module")
def prom(tmp_path_factory) -> Iterator[str]:
    """A real Prometheus holding the exporter's join metric (run team/proj/r1 on gpu-07) and
    firing GpuUncontainedEccError for r1 on gpu-07 GPUs 2 and 3."""
    text = ("# TYPE wandb_run_node_info gauge\n"
            f'wandb_run_node_info{{{RUN1},hostname="gpu-07"}} 1\n# TYPE test_xid gauge\n'
            + "".join(f'test_xid{{{RUN1},hostname="gpu-07",gpu="{g}",xid="95"}} 95\n'
                      for g in (2, 3)))
    workdir = tmp_path_factory.mktemp("prom")
    (workdir / "rules.yml").write_text(RULES)
    with scrape_target(lambda: text) as target:
        config = ("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                  f"rule_files: ['{workdir / 'rules.yml'}']\nscrape_configs:\n"
                  "  - job_name: exporter\n    honor_labels: true\n    static_configs:\n"
                  f"      - targets: ['{target}']\n")
        with prometheus(config, workdir) as running:
            wait_for(lambda: prom_query(running.url, 'count(ALERTS{alertstate="firing"}) == 2'),
                     60, "the rule firing")
            yield running.url


def raised(prom: str, gpu: str, **changes: Any) -> dict[str, Any]:
    """The alert Prometheus raised for ``gpu``, as Alertmanager would deliver it (its labels
    and start from Prometheus' own alerts API), with ``changes`` made to its labels."""
    alerts = requests.get(prom + "/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    (found,) = [a for a in alerts if a["labels"].get("gpu") == gpu]
    labels = {k: v for k, v in {**found["labels"], **changes}.items() if v is not None}
    start = datetime.fromisoformat(found["activeAt"].replace("Z", "+00:00"))
    out = alert("x", category="", start=start)
    digest = hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]
    return out | {"labels": labels, "fingerprint": digest}


def _worker(store: Store, wb: WandbStandin, prom: str, **policy: Any) -> DeliveryWorker:
    return DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                          markers=None, links=GrafanaLinks(""), metrics=BridgeMetrics(),
                          policy=DeliveryPolicy(flush_interval=0, **policy),
                          prometheus=PrometheusClient(prom))


def _ingest(store: Store, alerts: list[dict[str, Any]]) -> None:
    store.ingest(parse_notification(json.dumps(notification(alerts)).encode()), time.time())


def test_forged_run_labels_write_nothing(prom, tmp_path):
    """Next to the alert Prometheus raised, alerts it did not raise (another run's labels, a
    host it never named, a GPU it never named) are never diagnosed: r1's notes carry the real
    headline only, the forged ones are listed apart with why, and r2, which has only a forged
    alert, is not written."""
    long_ago = datetime.now(UTC) - timedelta(hours=1)  # their windows closed: refused for good
    with WandbStandin() as wb:
        for run in ("r1", "r2"):
            wb.add_run("team", "proj", run, notes="mine")
        store = Store(tmp_path / "bridge.sqlite")
        worker = _worker(store, wb, prom)
        _ingest(store, [
            raised(prom, "3"),
            raised(prom, "2", wandb_run_id="r2"),  # the real fault under another run's labels
            alert("NodeDown", category="node", host="gpu-99", run="r1", start=long_ago),
            alert("GpuFallenOffBus", category="gpu_hardware", host="gpu-07", run="r1",
                  start=long_ago),
        ])
        wait_for(lambda: worker.run_once() >= 0 and "GpuUncontainedEccError" in wb.run(
            "team", "proj", "r1").notes, 30, "the real issue in r1's notes")
        r1, r2 = wb.run("team", "proj", "r1"), wb.run("team", "proj", "r2")
        view = worker.runs.view(RunKey("team", "proj", "r1"))
    assert "NodeDown" not in r1.notes and "GpuFallenOffBus" not in r1.notes
    assert "Headline: GpuUncontainedEccError on gpu-07 GPU 3" in r1.notes
    assert r2.notes == "mine" and not [t for t in r2.tags if t.startswith("infra:")]
    # r2's alert began moments ago: it waits for its window to close (a remote-written ALERTS
    # may lag), then is refused and r2 parked
    waiting = store.outbox(RunKey("team", "proj", "r2"))
    assert waiting is not None and "not confirmed" in (waiting.last_error or "")
    # the page lists the forged ones apart, with why; its headline is the notes'
    assert view is not None and view.head is not None
    assert view.head.issue.title == "GpuUncontainedEccError on gpu-07 GPU 3"
    assert sorted(u.fact.alertname for u in view.unconfirmed) == ["GpuFallenOffBus", "NodeDown"]
    assert all(u.final and "Prometheus raised no firing" in u.reason for u in view.unconfirmed)


@pytest.mark.parametrize(("forged", "offered"), [(True, False), (False, True)],
                         ids=["forged-run", "raised-alert"])
def test_forged_alerts_drain_nothing(prom, tmp_path, forged, offered):
    """A forged alert naming a real node and a real run (a bare copy of what a fault looks
    like, which Prometheus never raised) is not offered to the quarantine (dry run here: its
    audit log records every decision). The positive control, the alert Prometheus raised, is
    offered and recorded, so the empty log of the forged case is the confirmation's doing."""
    scontrol = tmp_path / "scontrol"  # Slurm knows gpu-07, idle: the only reason not to act
    scontrol.write_text('#!/bin/sh\necho "NodeName=gpu-07 State=IDLE Reason="\n')
    scontrol.chmod(0o755)
    store = Store(tmp_path / "bridge.sqlite")
    audit = tmp_path / "quarantine-audit.jsonl"
    with WandbStandin() as wb:
        worker = _worker(store, wb, prom, node_state_refresh=0.01, quarantine={
            "enabled": True, "dry_run": True, "scheduler": "slurm", "max_nodes": 2,
            "max_fraction": 1.0, "window_seconds": 3600.0, "audit_log": "",
            "taint_key": "wandb.ai/infra-quarantine", "slurm_command": [str(scontrol)],
            "kubernetes": {}})
        _ingest(store, [alert("GpuUncontainedEccError", category="gpu_hardware", host="gpu-07",
                              gpu="2", run="r1", start=datetime.now(UTC) - timedelta(hours=1),
                              extra={"xid": "95"})
                        if forged else raised(prom, "2")])
        for _ in range(3):  # the same passes either way
            worker.run_once()
            quarantine_pass(worker)
            time.sleep(0.05)
    lines = [json.loads(line) for line in audit.read_text().splitlines()] \
        if audit.exists() else []
    if not offered:
        assert lines == []
        return
    (decision,) = lines
    assert decision["host"] == "gpu-07" and decision["outcome"] == "dry_run"
    assert "GpuUncontainedEccError" in decision["detail"]


def test_wandb_alert_and_runbook_link_come_from_the_catalog(prom, tmp_path):
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "r1")
        store = Store(tmp_path / "bridge.sqlite")
        worker = _worker(store, wb, prom, notify_critical=True)
        _ingest(store, [raised(prom, "3") | {"annotations": EVIL}])
        wait_for(lambda: worker.run_once() >= 0 and wb.alerts, 30, "the W&B alert")
        (sent,) = wb.alerts
    text = json.dumps(sent)
    assert "evil" not in text and "API key" not in text
    assert sent["title"] == "Infrastructure issue: GpuUncontainedEccError"
    # no scheduler state in this Prometheus: the verdict says unknown, the advice is the reset
    assert "Reset GPU 3 of gpu-07" in text and "Safe to restart? unknown." in text
    diagnosis = diagnose(store.facts(RunKey("team", "proj", "r1")), timedelta(minutes=10))
    view = view_of(diagnosis, run=RunKey("team", "proj", "r1")).as_dict(lambda *a: "")
    root = view["issues"][0]["root_cause"]
    assert root["runbook_url"] == "/runbook#gpuuncontainedeccerror"


class _Counting(PrometheusClient):
    """The real client, counting its queries of ``ALERTS``."""

    queries = 0

    def instant(self, expr: str, at: float) -> list[dict[str, Any]]:
        self.queries += "(ALERTS{" in expr
        return super().instant(expr, at)


def test_old_forged_alerts_do_not_hold_back_the_real_one(prom, tmp_path):
    """1,000 forged alerts with r1's labels, each started an hour apart in the past (so each is
    its own confirmation query), next to the alert Prometheus raised. The first look at r1 asks
    the newest first, 16 queries at most, and r1's notes carry the real fault in the first pass;
    the old ones wait, pending, for later looks (before: 1,000 queries per look, oldest first,
    before the real alert's; 10,000 such alerts held a real alert back by minutes)."""
    now = datetime.now(UTC)
    forged = [alert("GpuFallenOffBus", category="gpu_hardware", host="gpu-07", run="r1",
                    start=now - timedelta(hours=2 + n)) for n in range(1_000)]
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "r1", notes="mine")
        store = Store(tmp_path / "bridge.sqlite")
        counting = _Counting(prom)
        worker = DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                                markers=None, links=GrafanaLinks(""), metrics=BridgeMetrics(),
                                policy=DeliveryPolicy(flush_interval=0), prometheus=counting)
        _ingest(store, [*forged, raised(prom, "3")])
        assert worker.run_once() == 1
        notes = wb.run("team", "proj", "r1").notes
    assert "Headline: GpuUncontainedEccError on gpu-07 GPU 3" in notes
    assert "GpuFallenOffBus" not in notes
    assert counting.queries <= 2 * 16, counting.queries  # two looks: the write's, the measure's
