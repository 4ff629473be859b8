"""Unattributed alerts get their runs from a real Prometheus (the join metrics at startsAt)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from harness.bridge_payloads import alert, notification
from harness.processes import free_port, prom_query, prometheus, wait_for
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.prometheus.run_lookup import PrometheusRunLookup
from wandb_infra.common import labels as L
from wandb_infra.common.runkey import RunKey

pytestmark = pytest.mark.integration


def _exporter() -> tuple[int, object]:
    registry = CollectorRegistry()
    gpu = Gauge(L.GPU_INFO, "join", [L.ENTITY, L.PROJECT, L.RUN_ID, L.HOSTNAME, L.GPU],
                registry=registry)
    node = Gauge(L.NODE_INFO, "join", [L.ENTITY, L.PROJECT, L.RUN_ID, L.HOSTNAME],
                 registry=registry)
    for run, gpus in (("r1", range(4)), ("r2", range(4, 8))):
        node.labels("team", "proj", run, "h1").set(1)
        for g in gpus:
            gpu.labels("team", "proj", run, "h1", str(g)).set(1)
    port = free_port()
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    return port, server


def test_attribution_by_prometheus_join_metrics(tmp_path):
    port, server = _exporter()
    config = f"""
global: {{scrape_interval: 1s}}
scrape_configs:
  - job_name: join
    static_configs: [{{targets: ['127.0.0.1:{port}']}}]
"""
    try:
        with prometheus(config, tmp_path / "prom") as prom:
            wait_for(lambda: prom_query(prom.url, L.GPU_INFO), 30, "the join metrics scraped")
            now = datetime.now(UTC)
            store = Store(tmp_path / "bridge.sqlite")
            alerts = [alert("GpuXidError", category="gpu_hardware", host="h1", gpu="5",
                            start=now),
                      alert("NodeDown", category="node", host="h1", start=now),
                      alert("NodeDown", category="node", host="idle-host", start=now)]
            body = json.dumps(notification(alerts)).encode()
            store.ingest(parse_notification(body))
            worker = DeliveryWorker(store, client=None, markers=None,
                                    links=GrafanaLinks(""), metrics=BridgeMetrics(),
                                    policy=DeliveryPolicy(),
                                    lookup=PrometheusRunLookup(PrometheusClient(prom.url)))
            worker.run_once()
            r1, r2 = RunKey("team", "proj", "r1"), RunKey("team", "proj", "r2")
            assert sorted(f.alertname for f in store.facts(r2)) == ["GpuXidError", "NodeDown"]
            assert [f.alertname for f in store.facts(r1)] == ["NodeDown"], \
                "a GPU fault is never attributed to a run on another GPU"
            assert len(store.facts(RunKey())) == 3, "originals stay, idle host unattributed"
            seq = store.outbox(r2).dirty_seq
            assert seq >= 1
            worker.run_once()
            assert store.outbox(r2).dirty_seq == seq, "looked up once"
            resolved = [alert("GpuXidError", category="gpu_hardware", host="h1", gpu="5",
                              start=now, end=now + timedelta(minutes=2))]
            store.ingest(parse_notification(json.dumps(notification(resolved)).encode()))
            worker.run_once()
            xid = next(f for f in store.facts(r2) if f.alertname == "GpuXidError")
            assert xid.ends_at is not None
    finally:
        server.shutdown()
