"""Alert orders as Alertmanager really delivers them, replayed against the W&B
stand-in with markers on (the real wandb SDK): nothing premature, nothing stale.

Order: an earlier unrelated thermal warning; a notification holding only stalls (truncated,
its commonLabels naming another run); one group_interval later the job-killing XID with the
stalls repeated; an HA duplicate of it; the XID resolving while the stalls still fire.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import wandb

from harness.bridge_payloads import T0, alert, notification
from harness.clock import ManualClock
from harness.wandb_standin import WandbStandin
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.markers import SdkMarkerWriter
from wandb_infra.bridge.projection.wandb_client import WandbClient

SETTLE = 75.0
HEAT = alert("GpuClocksThrottledThermal", category="gpu_thermal", host="h3", gpu="1", run="r1",
             start=T0 - timedelta(minutes=30), severity="warning")
STALLS = [alert("TrainingStalled", category="workload", host=f"h{i}", run="r1",
                start=T0 + timedelta(seconds=40), severity="warning") for i in range(4)]
XID = alert("GpuXidError", category="gpu_hardware", host="h1", gpu="2", run="r1", start=T0,
            extra={"xid": "79"})
XID_RESOLVED = {**XID, "status": "resolved",
                "endsAt": XID["startsAt"].replace("12:00:00", "12:03:00")}


@pytest.fixture
def wb():
    with WandbStandin() as server:
        server.add_run("team", "proj", "r1", tags=["mine"], notes="My notes.",
                       config={"lr": {"value": 0.1}}, summary={"loss": 0.5})
        yield server


def _replay(tmp_path, wb, settle: float, stall_wait: float):
    """Deliver the scenario; ``stall_wait``: seconds between the stall-only notification and
    the one that brings the XID. Returns the worker's store."""
    clock = ManualClock(T0.timestamp())
    store = Store(tmp_path / "bridge.sqlite")
    worker = DeliveryWorker(
        store, client=WandbClient(wb.url, wb.api_key, timeout=5),
        markers=SdkMarkerWriter(wb.url, wb.api_key, tmp_path / "markers"),
        links=GrafanaLinks("https://grafana.example"), metrics=BridgeMetrics(),
        policy=DeliveryPolicy(flush_interval=10, marker_settle=settle), clock=clock, seed=1)

    def deliver(alerts, at: float, **body) -> None:
        clock.now = at
        note = notification(alerts, truncated=body.get("truncated", 0))
        note["commonLabels"] = body.get("common", {})
        store.ingest(parse_notification(json.dumps(note).encode()), at)
        worker.run_once()

    def idle_until(at: float) -> None:
        while clock.now < at:
            clock.now = min(at, clock.now + 15)
            worker.run_once()

    first = (T0 + timedelta(minutes=1)).timestamp()
    deliver([HEAT, *STALLS[:2]], first, truncated=2,
            common={"wandb_run_id": "other-run", "alertname": "TrainingStalled"})
    idle_until(first + stall_wait - 5)
    deliver([HEAT, *STALLS, XID], first + stall_wait)
    deliver([HEAT, *STALLS, XID], first + stall_wait + 0.5)  # the HA twin's copy
    idle_until(first + stall_wait + settle + 30)
    deliver([HEAT, *STALLS, XID_RESOLVED], first + stall_wait + settle + 60)
    idle_until(first + stall_wait + 2 * settle + 120)
    return store


@pytest.mark.integration
def test_no_premature_stall_marker_and_headline_first(tmp_path, wb):
    try:
        _replay(tmp_path, wb, SETTLE, stall_wait=60)
    finally:
        wandb.teardown()
    run = wb.run("team", "proj", "r1")
    assert run.tags == ["mine", "infra:GpuXidError", "infra:GpuClocksThrottledThermal",
                        "infra:TrainingStalled"]
    assert "root cause resolved at 2026-11-29 12:03:00 UTC" in run.notes
    rows = [(r["infra/issue_alert"], r["infra/issue"]) for r in run.history]
    assert sorted(rows) == [("GpuClocksThrottledThermal", 1), ("GpuXidError", 1)], rows
    assert run.state == "running" and run.summary == {"loss": 0.5}
    upserts = wb.calls(operation="BridgeUpsertBucket") + wb.calls(operation="UpsertBucket")
    sessions = len(wb.calls(operation="UpsertBucket")) // 2
    assert sessions == 1, "both issues settled inside one window: one marker session"
    assert len(upserts) <= 6, [r.operation_name for r in upserts]


@pytest.mark.integration
def test_a_marker_written_before_its_cause_arrived_gets_an_end_row(tmp_path, wb):
    """With a settle time shorter than the wait for the XID, the stall issue's start row is
    written; when the XID supersedes it, an explicit end row closes it on the plot."""
    try:
        _replay(tmp_path, wb, settle=20, stall_wait=60)
    finally:
        wandb.teardown()
    rows = [(r["infra/issue_alert"], r["infra/issue"], r.get("infra/issue_superseded"))
            for r in wb.run("team", "proj", "r1").history]
    stall_rows = [r for r in rows if r[0] == "TrainingStalled"]
    assert stall_rows == [("TrainingStalled", 1, None), ("TrainingStalled", 0, 1)], rows
    assert ("GpuXidError", 1, None) in rows
