"""Forged alerts: Alertmanager's API takes alerts from anyone and hands them to
the bridge with valid credentials, so run labels, prose and URLs in an alert are untrusted. With
Prometheus, a run is written only with alerts the join metrics place on their host (here a real
Prometheus scraping the exporter's series); W&B alert text and the runbook link come from the
catalog and the bridge, never from the alert."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from harness.bridge_payloads import alert, notification
from harness.processes import prom_query, prometheus, scrape_target, wait_for
from harness.wandb_standin import WandbStandin
from tests.views import view_of
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.root_cause import diagnose
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.prometheus.run_lookup import PrometheusRunLookup
from wandb_infra.common.runkey import RunKey

pytestmark = pytest.mark.integration

EVIL = {"summary": "Click http://evil.example/login to fix your run",
        "description": "your GPU is fine", "impact": "none",
        "remediation": "Send your API key to http://evil.example",
        "runbook_url": "https://evil.example/phish"}


@pytest.fixture(scope="module")
def prom(tmp_path_factory) -> Iterator[str]:
    """A real Prometheus holding the exporter's join metric: run team/proj/r1 on gpu-07."""
    text = ("# TYPE wandb_run_node_info gauge\n"
            'wandb_run_node_info{wandb_entity="team",wandb_project="proj",wandb_run_id="r1",'
            'hostname="gpu-07"} 1\n')
    with scrape_target(lambda: text) as target:
        config = ("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: exporter\n"
                  "    honor_labels: true\n    static_configs:\n"
                  f"      - targets: ['{target}']\n")
        with prometheus(config, tmp_path_factory.mktemp("prom")) as running:
            wait_for(lambda: prom_query(running.url, "count_over_time(wandb_run_node_info[1m]) "
                                                     ">= 3"), 60, "three scrapes of the join")
            yield running.url


def _worker(store: Store, wb: WandbStandin, prom: str, **policy: Any) -> DeliveryWorker:
    return DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                          markers=None, links=GrafanaLinks(""), metrics=BridgeMetrics(),
                          policy=DeliveryPolicy(flush_interval=0, **policy),
                          lookup=PrometheusRunLookup(PrometheusClient(prom)))


def _ingest(store: Store, alerts: list[dict[str, Any]]) -> None:
    store.ingest(parse_notification(json.dumps(notification(alerts)).encode()), time.time())


def test_forged_run_labels_write_nothing(prom, tmp_path):
    start = datetime.now(UTC) - timedelta(seconds=2)
    with WandbStandin() as wb:
        for run in ("r1", "r2"):
            wb.add_run("team", "proj", run, notes="mine")
        store = Store(tmp_path / "bridge.sqlite")
        worker = _worker(store, wb, prom)
        _ingest(store, [
            # real: r1 is on gpu-07
            alert("GpuUncontainedEccError", category="gpu_hardware", host="gpu-07", gpu="3",
                  run="r1", start=start, extra={"xid": "95"}),
            # forged: r2 was never on gpu-07; r1 was never on gpu-99
            alert("GpuFallenOffBus", category="gpu_hardware", host="gpu-07", gpu="1", run="r2",
                  start=start),
            alert("NodeDown", category="node", host="gpu-99", run="r1", start=start),
        ])
        wait_for(lambda: worker.run_once() >= 0 and "GpuUncontainedEccError" in wb.run(
            "team", "proj", "r1").notes, 30, "the real issue in r1's notes")
        r1, r2 = wb.run("team", "proj", "r1"), wb.run("team", "proj", "r2")
        assert "NodeDown" not in r1.notes and "gpu\\-99" not in r1.notes
        assert r2.notes == "mine" and not [t for t in r2.tags if t.startswith("infra:")]
        parked = store.outbox(RunKey("team", "proj", "r2"))
        assert parked is not None and parked.parked
        assert "the join metrics never placed team/proj/r2 on gpu-07" in parked.last_error


@pytest.mark.parametrize(("run", "offered"), [("r9", False), ("r1", True)],
                         ids=["forged-run", "placed-run"])
def test_forged_run_labels_drain_nothing(prom, tmp_path, run, offered):
    """A forged alert naming a real node under a run that was never there is not offered to the
    quarantine (dry run here: its audit log records every decision). The positive control, the
    same alert under the run the join metrics place on gpu-07, is offered and recorded, so the
    empty log of the forged case is the placement check's doing."""
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
                              gpu="2", run=run, start=datetime.now(UTC), extra={"xid": "95"})])
        for _ in range(3):  # the same passes either way
            worker.run_once()
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
    start = datetime.now(UTC) - timedelta(seconds=2)
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "r1")
        store = Store(tmp_path / "bridge.sqlite")
        worker = _worker(store, wb, prom, notify_critical=True)
        _ingest(store, [alert("GpuUncontainedEccError", category="gpu_hardware", host="gpu-07",
                              gpu="3", run="r1", start=start, annotations=EVIL,
                              extra={"xid": "95"})])
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
