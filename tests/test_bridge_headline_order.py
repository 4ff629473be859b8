"""The run's headline first in tags, notes, /runs and summary, on real alert order.

Alerts arrive as Alertmanager delivers them: an earlier unrelated thermal warning in its own
notification, then a notification whose first alerts are the stalls and whose last is the
job-killing XID. The W&B stand-in receives the projection.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from harness.bridge_payloads import T0, alert, notification
from harness.clock import ManualClock
from harness.wandb_standin import WandbStandin
from tests.views import view_of
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.root_cause import diagnose
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.notes import BEGIN, render_section
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.bridge.prometheus.history import as_facts
from wandb_infra.bridge.runs.text import render_text
from wandb_infra.common.runkey import RunKey

RUN = RunKey("team", "proj", "r1")
HEAT = alert("GpuClocksThrottledThermal", category="gpu_thermal", host="h3", gpu="1", run="r1",
             start=T0 - timedelta(minutes=30), severity="warning",
             annotations={"summary": "Clocks throttled by heat.",
                          "impact": "The run may slow down soon."})
STALLS = [alert("TrainingStalled", category="workload", host=f"h{i}", run="r1",
                start=T0 + timedelta(seconds=40), severity="warning") for i in range(4)]
XID = alert("GpuXidError", category="gpu_hardware", host="h1", gpu="2", run="r1", start=T0,
            extra={"xid": "79"}, annotations={"summary": "GPU fell off the bus.",
                                             "impact": "The whole synchronous job fails."})


@pytest.fixture
def wb():
    with WandbStandin() as server:
        server.add_run("team", "proj", "r1", tags=["mine"], notes="My notes.")
        yield server


def _worker(tmp_path, wb, clock):
    store = Store(tmp_path / "bridge.sqlite")
    worker = DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                            markers=None, links=GrafanaLinks("https://grafana.example"),
                            metrics=BridgeMetrics(), policy=DeliveryPolicy(flush_interval=0),
                            clock=clock, seed=1)
    return store, worker


def _ingest(store, alerts, now):
    body = json.dumps(notification(alerts)).encode()
    return store.ingest(parse_notification(body), now)


def test_headline_first_in_tags_notes_runs_column_and_summary(tmp_path, wb):
    clock = ManualClock(T0.timestamp())
    store, worker = _worker(tmp_path, wb, clock)
    clock.now = (T0 - timedelta(minutes=29)).timestamp()
    _ingest(store, [HEAT], clock.now)
    worker.run_once()
    assert wb.run("team", "proj", "r1").tags == ["mine", "infra:GpuClocksThrottledThermal"]
    clock.now = (T0 + timedelta(minutes=1)).timestamp()
    _ingest(store, [*STALLS, XID, HEAT], clock.now)  # symptoms first, the old warning repeated
    worker.run_once()
    run = wb.run("team", "proj", "r1")
    assert run.tags == ["mine", "infra:GpuXidError", "infra:GpuClocksThrottledThermal",
                        "infra:TrainingStalled"]
    section = run.notes[run.notes.index(BEGIN):]
    assert run.notes.startswith("My notes.")
    headline = section.index("**Headline: GpuXidError on h1 GPU 2**")
    assert headline < section.index("**1. GpuXidError on h1 GPU 2** (open, ")
    assert section.index("**1. GpuXidError") < section.index("**2. GpuClocksThrottledThermal")
    assert "to ongoing; headline)" in section
    assert "to ongoing; separate issue, not the headline)" in section
    assert section.count("Why this is the root cause") == 1
    heat_block = section[section.index("**2. GpuClocksThrottledThermal"):]
    assert "Why this is the root cause" not in heat_block
    assert "severity decided" in section
    # The /runs column and, once the run ended, the summary name the same headline.
    diagnosis = diagnose(store.facts(RUN))
    row = view_of(diagnosis, run=RUN, delivery=store.outbox(RUN)).row().as_dict()
    assert row["root_cause"] == {"alertname": "GpuXidError", "where": "h1 GPU 2"}
    assert run.summary == {}, "live run: no summary keys"
    wb.set_state("team", "proj", "r1", "crashed")
    clock.now += 400
    worker.run_once()
    summary = wb.run("team", "proj", "r1").summary
    assert summary["infra/root_cause"] == "GpuXidError on h1 GPU 2"
    assert summary["infra/root_cause_severity"] == "critical"
    assert summary["infra/issues"] == 2


def test_root_resolved_while_consequences_fire_is_written_when_it_happens(tmp_path, wb):
    clock = ManualClock(T0.timestamp())
    store, worker = _worker(tmp_path, wb, clock)
    clock.now = (T0 + timedelta(minutes=1)).timestamp()
    _ingest(store, [*STALLS, XID], clock.now)
    worker.run_once()
    assert "**1. GpuXidError on h1 GPU 2** (open, " in wb.run("team", "proj", "r1").notes
    upserts = len(wb.calls(operation="BridgeUpsertBucket"))
    clock.now += 120
    resolved = {**XID, "status": "resolved",
                "endsAt": XID["startsAt"].replace("12:00:00", "12:02:00")}
    _ingest(store, [*STALLS, resolved], clock.now)
    assert worker.run_once() == 1
    notes = wb.run("team", "proj", "r1").notes
    assert len(wb.calls(operation="BridgeUpsertBucket")) == upserts + 1
    assert ("open: root cause resolved at 2026-11-29 12:02:00 UTC, 4 consequences still "
            "firing") in notes
    assert "**Headline: GpuXidError on h1 GPU 2** (open: root cause resolved" in notes


def test_explain_report_names_the_headline_and_never_calls_the_old_warning_a_root_cause():
    parsed = parse_notification(json.dumps(notification([HEAT, *STALLS, XID])).encode())
    diagnosis = diagnose(as_facts(parsed.alerts))
    text = render_text(view_of(diagnosis, run=RUN), lambda *_: "")
    assert text.splitlines()[1].startswith("  Headline: GpuXidError on h1 GPU 2.")
    assert "ROOT CAUSE  GpuXidError" in text
    assert "CAUSE       GpuClocksThrottledThermal" in text
    assert "ROOT CAUSE  GpuClocksThrottledThermal" not in text
    assert "a separate issue, not the headline" in text


def test_one_event_on_four_gpus_and_impact_already_seen_in_the_notes():
    hot = [alert("GpuTemperatureHigh", category="gpu_thermal", host="gpu-node-065", gpu=str(g),
                 run="r1", start=T0, severity="warning") for g in range(4)]
    slow = alert("TrainingStraggler", category="workload", host="gpu-node-065", run="r1",
                 start=T0 + timedelta(minutes=1), severity="warning")
    parsed = parse_notification(json.dumps(notification([*hot, slow])).encode())
    section = render_section(view_of(diagnose(as_facts(parsed.alerts))), lambda *_: "")
    assert "**Headline: GpuTemperatureHigh on gpu-node-065 GPUs 0-3**" in section
    assert "Likely consequences (1 alerts)" in section
    assert "Already seen on this run: TrainingStraggler since 2026-11-29 12:01:00 UTC" in section
