"""Delivery to the W&B stand-in: tags, notes, summary, markers, coalescing, retries, parking."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import wandb

from harness.bridge_payloads import T0, alert, cascade, notification
from harness.clock import ManualClock
from harness.wandb_standin import WandbStandin
from tests.views import prometheus_raising
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.markers import SdkMarkerWriter
from wandb_infra.bridge.projection.notes import BEGIN, END
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.common.runkey import RunKey

RUN = RunKey("team", "proj", "r1")


@pytest.fixture
def wb():
    with WandbStandin() as server:
        server.add_run("team", "proj", "r1", tags=["mine", "baseline"],
                       notes="My experiment.\n\nDo not touch.", summary={"loss": 0.5})
        server.add_run("team", "proj", "r2")
        yield server


def make_worker(tmp_path, wb, *, key=None, markers=None, clock=None, prometheus=None,
                **policy):
    tmp_path.mkdir(parents=True, exist_ok=True)
    store = Store(tmp_path / "bridge.sqlite")
    client = WandbClient(wb.url, key or wb.api_key, timeout=5)
    worker = DeliveryWorker(
        store, client=client, markers=markers, links=GrafanaLinks("https://grafana.example"),
        metrics=BridgeMetrics(), policy=DeliveryPolicy(**{"flush_interval": 0, **policy}),
        clock=clock or ManualClock(1_800_000_000.0), seed=1, prometheus=prometheus)
    return store, worker


def ingest(store, alerts, now=None):
    return store.ingest(parse_notification(json.dumps(notification(alerts)).encode()), now)


def test_tags_and_notes_added_user_data_untouched_summary_left_alone(tmp_path, wb):
    store, worker = make_worker(tmp_path, wb)
    ingest(store, cascade(hosts=4, gpus=2, run="r1"))
    assert worker.run_once() == 1
    run = wb.run("team", "proj", "r1")
    assert run.tags == ["mine", "baseline", "infra:GpuContainedEccError",
                        "infra:TrainingStalled", "infra:GpuXidApplicationError"]
    assert run.notes.startswith("My experiment.\n\nDo not touch.\n\n" + BEGIN)
    assert run.notes.endswith(END)
    assert "**1. GpuContainedEccError on node017 GPU 3**" in run.notes
    assert "https://grafana.example/d/" in run.notes
    assert run.summary == {"loss": 0.5}, "live run: summary is the trainer's"
    ops = [r.operation_name for r in wb.requests]
    # read, write, read back (a user's edit meanwhile would be merged again)
    assert ops == ["BridgeRun", "BridgeUpsertBucket", "BridgeRun"]
    # Nothing new: nothing sent. A re-notification: nothing sent either.
    assert worker.run_once() == 0
    ingest(store, cascade(hosts=4, gpus=2, run="r1"))
    assert worker.run_once() == 0 and len(wb.requests) == 3
    # The user edits their notes and tags meanwhile; the next projection keeps their edits.
    wb._runs[("team", "proj", "r1")].notes = "Edited!\n" + run.notes
    wb._runs[("team", "proj", "r1")].tags.append("late-user-tag")
    ingest(store, [alert("NodeDown", category="node", host="node002", run="r1",
                         start=T0 + timedelta(minutes=1))])
    worker.run_once()
    run = wb.run("team", "proj", "r1")
    assert run.notes.startswith("Edited!\nMy experiment.\n\nDo not touch.\n\n" + BEGIN)
    assert run.notes.count(BEGIN) == 1 and "NodeDown" in run.notes
    assert run.tags[:3] == ["mine", "baseline", "late-user-tag"]
    assert "infra:NodeDown" in run.tags


def test_summary_written_when_run_is_not_running_and_reasserted_when_it_finishes(tmp_path, wb):
    clock = ManualClock(1_800_000_000.0)
    store, worker = make_worker(tmp_path, wb, clock=clock, state_check_interval=300)
    ingest(store, [alert("GpuXidError", category="gpu_hardware", host="h1", gpu="2", run="r1")])
    worker.run_once()
    assert "infra/issues" not in wb.run("team", "proj", "r1").summary
    clock.now += 100
    assert worker.run_once() == 0
    wb.set_state("team", "proj", "r1", "crashed")
    clock.now += 250
    assert worker.run_once() == 1
    summary = wb.run("team", "proj", "r1").summary
    assert summary["loss"] == 0.5
    assert summary["infra/issues"] == 1 and summary["infra/open_issues"] == 1
    assert summary["infra/root_cause"] == "GpuXidError on h1 GPU 2"
    assert store.outbox(RUN).next_state_check is None
    calls = len(wb.requests)
    clock.now += 1000
    assert worker.run_once() == 0 and len(wb.requests) == calls


def test_coalescing_one_projection_per_run_per_flush(tmp_path, wb):
    clock = ManualClock(1_800_000_000.0)
    for i in range(3, 6):
        wb.add_run("team", "proj", f"r{i}")
    store, worker = make_worker(tmp_path, wb, clock=clock, flush_interval=30)
    runs = ["r1", "r2", "r3", "r4", "r5"]
    total = 0
    for batch in range(8):
        alerts = [alert("GpuXidApplicationError", category="workload", host=f"h{batch}-{i}",
                        gpu=str(i % 8), run=runs[i % 5], start=T0 + timedelta(seconds=batch))
                  for i in range(40)]
        total += ingest(store, alerts, clock.now).new
        if batch == 0:
            assert worker.run_once() == 5
        clock.now += 1
        worker.run_once()  # inside the flush interval: nothing
    assert len(wb.requests) == 15  # per run: read, write, verifying read
    clock.now += 30
    assert worker.run_once() == 5
    assert total == 320
    per_run = len(wb.requests) / 5
    assert per_run == 6.0, "2 flushes x (find + upsert + read back), not 64 alerts per run"
    for rid in runs:
        assert wb.run("team", "proj", rid).tags[-1] == "infra:GpuXidApplicationError"


def test_transient_failures_back_off_and_honour_retry_after(tmp_path, wb):
    clock = ManualClock(1_800_000_000.0)
    store, worker = make_worker(tmp_path, wb, clock=clock, backoff_base=2, backoff_max=60)
    ingest(store, [alert("NodeDown", category="node", host="h1", run="r1"),
                   alert("NodeDown", category="node", host="h2", run="r2")])
    wb.fail(503, times=1)
    assert worker.run_once() == 0
    assert len(wb.requests) == 1, "a transient failure pauses the pass (no retry storm)"
    row = store.outbox(RUN)
    assert row.attempts == 1 and "503" in row.last_error
    assert 1 <= row.next_attempt - clock.now <= 2
    assert worker.run_once() == 0 and len(wb.requests) == 1
    wb.fail(429, times=1, retry_after=120)
    clock.now += 3
    assert worker.run_once() == 0
    assert store.outbox(RUN).next_attempt - clock.now >= 120
    clock.now += 60
    assert worker.run_once() == 0 and len(wb.requests) == 2
    clock.now += 61
    assert worker.run_once() == 2
    assert wb.run("team", "proj", "r1").tags == ["mine", "baseline", "infra:NodeDown"]
    stats = store.queue_stats(clock.now)
    assert stats.pending_runs == 0 and stats.parked_runs == 0


def test_permanent_failures_are_parked_and_do_not_block_others(tmp_path, wb):
    clock = ManualClock(1_800_000_000.0)
    store, worker = make_worker(tmp_path, wb, clock=clock)
    ingest(store, [alert("NodeDown", category="node", host="h1", run="ghost"),
                   alert("NodeDown", category="node", host="h2", run="r2")])
    assert worker.run_once() == 2
    parked = store.parked()
    assert [p.run.run_id for p in parked] == ["ghost"] and "not found" in parked[0].parked
    assert wb.run("team", "proj", "r2").tags == ["infra:NodeDown"]
    ghost_calls = [r for r in wb.requests if (r.variables or {}).get("name") == "ghost"]
    assert len(ghost_calls) == 1
    # tried again with backoff (5 minutes, doubling), never on every pass
    for _ in range(4):
        clock.now += 60
        worker.run_once()
    assert [r for r in wb.requests if (r.variables or {}).get("name") == "ghost"] == ghost_calls
    assert worker.metrics.parked._value.get() == 1
    clock.now += 120
    worker.run_once()  # unparked at the end of this pass, tried in the next
    worker.run_once()
    retried = [r for r in wb.requests if (r.variables or {}).get("name") == "ghost"]
    assert len(retried) == 2 and [p.run.run_id for p in store.parked()] == ["ghost"]
    # New information about the parked run gives it one more chance.
    wb.add_run("team", "proj", "ghost")
    ingest(store, [alert("NodeDown", category="node", host="h3", run="ghost")])
    worker.run_once()
    assert store.parked() == [] and wb.run("team", "proj", "ghost").tags == ["infra:NodeDown"]


def test_revoked_key_parks(tmp_path, wb):
    store, worker = make_worker(tmp_path, wb, key="revoked-" + "z" * 40)
    ingest(store, [alert("NodeDown", category="node", host="h1", run="r1")])
    worker.run_once()
    assert "401" in store.parked()[0].parked
    assert wb.run("team", "proj", "r1").tags == ["mine", "baseline"]


def test_notify_critical_once(tmp_path, wb):
    """A W&B alert once per critical root cause Prometheus confirmed it raised; none for an
    alert it did not raise, nor without a Prometheus to ask."""
    raised = cascade(hosts=2, gpus=1, run="r1", bad_host=1, bad_gpu=0)
    unchecked_store, unchecked = make_worker(tmp_path / "none", wb, notify_critical=True)
    ingest(unchecked_store, raised)
    unchecked.run_once()
    assert wb.alerts == []
    with prometheus_raising(raised) as url:
        store, worker = make_worker(tmp_path, wb, notify_critical=True,
                                    prometheus=PrometheusClient(url))
        ingest(store, raised)
        worker.run_once()
        ingest(store, [alert("NodeDown", category="node", host="x", run="r1",
                             start=T0 + timedelta(hours=5), severity="critical")])
        worker.run_once()
    assert len(wb.alerts) == 1
    assert wb.alerts[0]["title"] == "Infrastructure issue: GpuContainedEccError"


@pytest.mark.integration
def test_markers_with_the_real_wandb_sdk(tmp_path, wb):
    """Rows only once the root cause settled; the writer sends history and nothing it can
    switch off (no program, code, git, metadata, summary), and never finishes the run."""
    clock = ManualClock(1_800_000_000.0)
    writer = SdkMarkerWriter(wb.url, wb.api_key, tmp_path / "markers")
    store, worker = make_worker(tmp_path, wb, markers=writer, clock=clock, marker_settle=60)
    try:
        ingest(store, [alert("GpuThermalViolation", category="gpu_thermal", host="h1", gpu="1",
                             run="r1", start=T0)])
        worker.run_once()
        assert wb.run("team", "proj", "r1").history == [], "not settled yet"
        clock.now += 61
        assert worker.run_once() == 1, "the run is looked at again once the issue settled"
        run = wb.run("team", "proj", "r1")
        assert [(r["infra/issue"], r["_timestamp"]) for r in run.history] == [
            (1, T0.timestamp())]
        assert run.history[0]["infra/issue_alert"] == "GpuThermalViolation"
        assert run.state == "running" and run.tags[:2] == ["mine", "baseline"]
        ingest(store, [alert("GpuThermalViolation", category="gpu_thermal", host="h1", gpu="1",
                             run="r1", start=T0, end=T0 + timedelta(minutes=9))])
        worker.run_once()
        worker.run_once()
        run = wb.run("team", "proj", "r1")
        assert [(r["infra/issue"], r["_timestamp"]) for r in run.history] == [
            (1, T0.timestamp()), (0, (T0 + timedelta(minutes=9)).timestamp())]
        assert run.state == "running"
        assert run.notes.startswith("My experiment.")
        assert run.summary == {"loss": 0.5}, "no wandb-summary.json from the marker writer"
        sdk = wb.calls(operation="UpsertBucket")
        assert len(sdk) == 4, "two shared-mode sessions, one per settled change"
        for call in sdk:
            sent = {k for k, v in (call.variables or {}).items() if v is not None}
            assert not sent & {"program", "summaryMetrics", "tags", "notes", "commit", "repo",
                               "description", "jobType", "host", "config"}, sent
        streams = wb.calls(path_prefix="/files/team/proj/r1/file_stream")
        files = {name for r in streams for name in ((r.body or {}).get("files") or {})}
        assert files == {"wandb-history.jsonl"}, files
        assert not [r for r in wb.requests if "metadata" in json.dumps(r.body or {})]
    finally:
        wandb.teardown()
