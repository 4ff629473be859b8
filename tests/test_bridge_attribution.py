"""Attribution happens once, in the rules: an alert is a run's only if it carries the run's
labels (the rules join it to the exporter's join metrics in PromQL, GPU by GPU where runs share
a host). The bridge never attributes by a second join: an alert without run labels stays
unattributed (listed at /unattributed) even where the join metrics put runs on its host."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from harness.bridge_payloads import alert, notification
from harness.processes import prom_query, prometheus, scrape_target, wait_for
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.common import labels as L
from wandb_infra.common.runkey import RunKey

pytestmark = pytest.mark.integration


def test_alerts_without_run_labels_stay_unattributed(tmp_path):
    join = "".join(f'{L.GPU_INFO}{{{L.ENTITY}="team",{L.PROJECT}="proj",{L.RUN_ID}="r1",'
                   f'{L.HOSTNAME}="h1",{L.GPU}="{g}"}} 1\n' for g in range(4))
    with scrape_target(lambda: f"# TYPE {L.GPU_INFO} gauge\n{join}") as target, prometheus(
            f"global: {{scrape_interval: 1s}}\nscrape_configs:\n  - job_name: join\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n", tmp_path / "prom") as prom:
        wait_for(lambda: prom_query(prom.url, L.GPU_INFO), 30, "the join metrics scraped")
        store = Store(tmp_path / "bridge.sqlite")
        store.ingest(parse_notification(json.dumps(notification([
            alert("GpuXidError", category="gpu_hardware", host="h1", gpu="1",
                  start=datetime.now(UTC))])).encode()))
        worker = DeliveryWorker(store, client=None, markers=None, links=GrafanaLinks(""),
                                metrics=BridgeMetrics(), policy=DeliveryPolicy(),
                                prometheus=PrometheusClient(prom.url))
        worker.run_once()
    assert store.facts(RunKey("team", "proj", "r1")) == []
    assert [f.alertname for f in store.facts(RunKey())] == ["GpuXidError"]
    assert store.outbox(RunKey("team", "proj", "r1")) is None
