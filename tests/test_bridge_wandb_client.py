"""W&B answers are bounded: a ``Retry-After`` the size of ``1e400`` is clamped (before, it
parsed to infinity and no write to the run was ever tried again); the optional W&B alert
(Slack, e-mail) never parks a run whose notes were written; and it is sent at most once, also
when the bridge process is killed with -9 while the alert is in flight (before, the restarted
bridge sent it again)."""

from __future__ import annotations

import json
import time

import pytest

from harness.bridge_payloads import T0, alert, notification
from harness.bridge_process import bridge_env, start_bridge
from harness.clock import ManualClock
from harness.processes import wait_for
from harness.wandb_standin import WandbStandin
from tests.views import prometheus_raising
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.wandb_client import (
    MAX_RETRY_AFTER,
    TransientError,
    WandbClient,
    parse_retry_after,
)
from wandb_infra.bridge.prometheus.client import PrometheusClient

pytestmark = pytest.mark.integration

CRITICAL = [alert("GpuFallenOffBus", category="gpu_hardware", host="gpu05", gpu="0", run="r1",
                  start=T0)]


@pytest.mark.parametrize(("header", "seconds"), [
    ("1e400", MAX_RETRY_AFTER), ("inf", MAX_RETRY_AFTER), ("86400", MAX_RETRY_AFTER),
    ("Fri, 31 Dec 9999 23:59:59 GMT", MAX_RETRY_AFTER), ("nan", None), ("-inf", 0.0),
    ("1.5", 1.5)])
def test_retry_after_is_clamped_as_the_server_sends_it(header, seconds):
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "r1")
        wb.fail(429, retry_after=header)
        with pytest.raises(TransientError) as caught:
            WandbClient(wb.url, wb.api_key, timeout=5).find_run("team", "proj", "r1")
    assert caught.value.retry_after == seconds
    assert parse_retry_after(header) == seconds


def test_a_failing_wandb_alert_parks_nothing_and_is_not_sent_twice(tmp_path):
    with WandbStandin() as wb, prometheus_raising(CRITICAL) as prom:
        wb.add_run("team", "proj", "r1", notes="mine")
        wb.fail(403, times=None, operation="NotifyScriptableRunAlert")
        store = Store(tmp_path / "bridge.sqlite")
        worker = DeliveryWorker(
            store, client=WandbClient(wb.url, wb.api_key, timeout=5), markers=None,
            links=GrafanaLinks(""), metrics=BridgeMetrics(), clock=ManualClock(1.8e9),
            policy=DeliveryPolicy(flush_interval=0, notify_critical=True),
            prometheus=PrometheusClient(prom))
        store.ingest(parse_notification(json.dumps(notification(CRITICAL)).encode()))
        worker.run_once()
        worker.run_once()
        assert "GpuFallenOffBus" in wb.run("team", "proj", "r1").notes
        assert store.queue_stats(2e9).parked_runs == 0
        assert store.queue_stats(2e9).pending_runs == 0
        assert len(wb.calls("NotifyScriptableRunAlert")) == 1


def test_a_wandb_alert_in_flight_at_kill_9_is_not_sent_again(tmp_path):
    with WandbStandin() as wb, prometheus_raising(CRITICAL) as prom:
        wb.add_run("team", "proj", "r1")
        wb.slow(6.0, operation="NotifyScriptableRunAlert")  # W&B gets it; the answer is late
        env = bridge_env(tmp_path, wandb_url=wb.url, wandb_key=wb.api_key,
                         prometheus__url=prom, wandb__notify_critical="true")
        bridge = start_bridge(tmp_path, env)
        try:
            assert bridge.post(notification(CRITICAL)).status_code == 200
            wait_for(lambda: wb.calls("NotifyScriptableRunAlert"), 30, "the alert in flight")
            bridge.kill()
            bridge = start_bridge(tmp_path, env)
            wait_for(lambda: len(wb.alerts) == 1, 30, "W&B applied the first send")
            time.sleep(3)  # the restarted bridge has delivered the run meanwhile
            wait_for(lambda: "GpuFallenOffBus" in wb.run("team", "proj", "r1").notes, 30,
                     "the run delivered")
            assert len(wb.alerts) == 1
        finally:
            bridge.stop()
