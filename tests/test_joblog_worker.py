"""The delivery worker reads an ended run's console log once (W&B's ``logLines`` on the stand-in)
and the run's notes and summary carry the joined statement."""

from __future__ import annotations

import json

from harness.bridge_payloads import cascade, notification
from harness.clock import ManualClock
from harness.wandb_standin import WandbStandin
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.joblog.sources import Settings
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.wandb_client import WandbClient

ECC = ("[rank131]:[E303 21:44:35.120 ProcessGroupNCCL.cpp:1515] [PG 0 (default_pg) Rank 131] "
       "Process group watchdog thread terminated with exception: CUDA error: uncorrectable ECC "
       "error encountered")


def test_an_ended_runs_log_is_read_once_into_its_notes_and_summary(tmp_path):
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "r1")
        wb.add_console("team", "proj", "r1", ["step 10 loss 2.1", ECC], level="error")
        store = Store(tmp_path / "bridge.sqlite")
        worker = DeliveryWorker(
            store, client=WandbClient(wb.url, wb.api_key, timeout=5), markers=None,
            links=GrafanaLinks(""), metrics=BridgeMetrics(),
            policy=DeliveryPolicy(flush_interval=0, joblog=Settings(wandb=True)),
            clock=ManualClock(1_800_000_000.0), seed=1)
        store.ingest(parse_notification(json.dumps(notification(
            cascade(hosts=4, gpus=2, run="r1"))).encode()))
        assert worker.run_once() == 1  # running: no log read yet
        assert "Job log" not in wb.run("team", "proj", "r1").notes
        wb.set_state("team", "proj", "r1", "crashed")
        store.ingest(parse_notification(json.dumps(notification(
            cascade(hosts=5, gpus=2, run="r1"))).encode()))
        worker.run_once()
        run = wb.run("team", "proj", "r1")
        reads = len(wb.calls("RunConsoleLogTail"))
        worker.run_once()
        store.ingest(parse_notification(json.dumps(notification(
            cascade(hosts=6, gpus=2, run="r1"))).encode()))
        worker.run_once()
        assert len(wb.calls("RunConsoleLogTail")) == reads == 1
    assert "**Job log: infrastructure**" in run.notes and "rank 131" in run.notes
    assert run.summary["infra/verdict"] == "infrastructure"
    assert "infra/app_error" not in run.summary
