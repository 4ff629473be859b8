"""Transient W&B answers are retried, and parked runs are tried again: an HTTP
200 whose GraphQL error asks for a retry, an ingress's HTML 404, a key revoked then restored.
Against the W&B stand-in; the worker's clock is driven by the test."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

from harness.bridge_payloads import alert, notification
from harness.clock import ManualClock
from harness.wandb_standin import WandbStandin
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import PARK_RETRY_BASE, DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.common.runkey import RunKey

RUN = RunKey("team", "proj", "r1")


def _setup(tmp_path, wb: WandbStandin) -> tuple[Store, DeliveryWorker, ManualClock]:
    wb.add_run("team", "proj", "r1")
    store = Store(tmp_path / "bridge.sqlite")
    clock = ManualClock(time.time())
    worker = DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                            markers=None, links=GrafanaLinks(""), metrics=BridgeMetrics(),
                            policy=DeliveryPolicy(flush_interval=0, backoff_base=0.01,
                                                  backoff_max=0.01), clock=clock)
    store.ingest(parse_notification(json.dumps(notification([alert(
        "GpuUncontainedEccError", category="gpu_hardware", host="gpu-07", gpu="3", run="r1",
        start=datetime.now(UTC), extra={"xid": "95"})])).encode()), clock())
    return store, worker, clock


def _written(wb: WandbStandin) -> bool:
    return "GpuUncontainedEccError" in wb.run("team", "proj", "r1").notes


def _drain(worker: DeliveryWorker, clock: ManualClock, passes: int = 5) -> None:
    for _ in range(passes):
        clock.now += 1
        worker.run_once()


def test_a_graphql_error_asking_for_a_retry_is_retried_not_parked(tmp_path):
    with WandbStandin() as wb:
        store, worker, clock = _setup(tmp_path, wb)
        wb.fail(200, 2, operation="BridgeRun",
                body=json.dumps({"errors": [{"message": "Service overloaded, please retry"}]}))
        _drain(worker, clock)
        assert _written(wb)
        row = store.outbox(RUN)
        assert row is not None and not row.parked


def test_an_ingress_html_404_is_transient(tmp_path):
    with WandbStandin() as wb:
        store, worker, clock = _setup(tmp_path, wb)
        wb.fail(404, 3, body="<html><body>404 Not Found</body></html>",
                content_type="text/html")
        _drain(worker, clock, 8)
        assert _written(wb)
        row = store.outbox(RUN)
        assert row is not None and not row.parked


def test_a_revoked_key_parks_and_a_restored_key_unparks_with_backoff(tmp_path):
    with WandbStandin() as wb:
        store, worker, clock = _setup(tmp_path, wb)
        wb.revoke()
        _drain(worker, clock, 2)
        row = store.outbox(RUN)
        assert row is not None and row.parked and "W&B rejected the API key" in row.parked
        wb.restore()
        _drain(worker, clock, 3)  # not before the backoff
        assert not _written(wb)
        clock.now += PARK_RETRY_BASE + 61
        _drain(worker, clock, 3)
        assert _written(wb)
        row = store.outbox(RUN)
        assert row is not None and not row.parked
