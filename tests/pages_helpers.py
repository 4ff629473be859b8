"""Helpers for the run-page tests: a bridge holding the 64-host cascade, a fake Prometheus that
answers the activity plot's and the impact reader's range queries, and a small HTML tag
collector."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import requests
from aiohttp import web

from harness.bridge_payloads import T0, TOKEN, Running, cascade, make_context, notification, serve
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.prometheus.impact_reader import ImpactHistory
from wandb_infra.bridge.prometheus.run_lookup import PrometheusRunLookup

AUTH = {"Authorization": f"Bearer {TOKEN}"}
HTML = {**AUTH, "Accept": "text/html"}
STALL_AT = T0.timestamp() + 40  # the cascade's first stall: activity drops here
MEASURED_AT = T0.timestamp() + 600  # "now" for measured impacts: 10 min after the XID 94


def fake_worker(prometheus_url: str = "", wandb: bool = False,
                measured: bool = False) -> SimpleNamespace:
    """What the pages read from the service's delivery worker: its W&B client (None: W&B off),
    its Prometheus run lookup and node-state history (None: no remediation verdict), its
    metrics, and with ``measured`` impacts measured by the real reader on ``prometheus_url`` at
    ``MEASURED_AT`` through the real worker's ``impacts`` (so the run's GPU-hours land in the
    store the bridge binds, as /runs reads them); else no measured impact."""
    # a generous timeout: on a loaded CI machine a 2 s read of the stand-in timed out and the
    # page (rightly) showed no plot, failing the plot's test for the machine's sake
    prom = PrometheusClient(prometheus_url, 15.0) if prometheus_url else None
    lookup = PrometheusRunLookup(prom) if prom is not None else None
    impact = (ImpactHistory(prom, cache_seconds=0, min_step=10.0, clock=lambda: MEASURED_AT)
              if measured and prom is not None else None)
    worker = SimpleNamespace(client=object() if wandb else None, lookup=lookup,
                             remediation=None, policy=DeliveryPolicy(), wake=lambda: None,
                             metrics=BridgeMetrics(), impact=impact, store=None,
                             clock=lambda: MEASURED_AT)
    worker.impacts = lambda run, diagnosis: DeliveryWorker.impacts(worker, run, diagnosis)
    return worker


def post_alerts(running: Running, alerts: list[dict[str, Any]]) -> None:
    """Store ``alerts`` through the webhook (with the webhook's token)."""
    resp = requests.post(running.url + "/alertmanager", data=json.dumps(notification(alerts)),
                         headers={**AUTH, "Content-Type": "application/json"}, timeout=30)
    assert resp.status_code == 200, resp.text


@contextmanager
def cascade_bridge(tmp_path: Path, **kwargs: Any) -> Iterator[Running]:
    """A bridge with the 64-host x 8-GPU cascade of run team/proj/cascade1 stored."""
    kwargs.setdefault("worker", fake_worker())
    ctx = make_context(tmp_path, **kwargs)
    if getattr(ctx.worker, "store", "") is None:  # a fake worker measures into this store
        ctx.worker.store = ctx.store
    with serve(ctx) as running:
        post_alerts(running, cascade())
        yield running


@dataclass
class FakePrometheus:
    """Answers ``/api/v1/query_range`` like Prometheus for one run: the join metrics for
    ``hosts`` x ``gpus``, then tensor activity at ``high`` that falls to ``low`` at ``drop_at``
    (default: the 64-host cascade, stalled at its first TrainingStalled), for the activity plot
    as one series and for the impact reader as its four parts."""

    hosts: list[str] = field(default_factory=lambda: [f"node{h:03d}" for h in range(64)])
    gpus: int = 8
    high: float = 0.8
    low: float = 0.02
    drop_at: float = STALL_AT
    queries: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application()
        app.router.add_get("/api/v1/query_range", self.query_range)
        return app

    async def query_range(self, request: web.Request) -> web.Response:
        """One range query: which series depends on the metric the query names."""
        query = request.query["query"]
        self.queries.append(query)
        start, end = float(request.query["start"]), float(request.query["end"])
        step = float(request.query["step"])
        stamps = [start + i * step for i in range(int((end - start) / step) + 1)]
        result: list[dict[str, Any]] = []
        if "wandb_run_node_info" in query:
            result = [{"metric": {"hostname": h}, "values": [[t, "1"] for t in stamps]}
                      for h in self.hosts]
        elif "wandb_run_gpu_info" in query:
            result = [{"metric": {"hostname": h, "gpu": str(g)},
                       "values": [[t, "1"] for t in stamps]}
                      for h in self.hosts for g in range(self.gpus)]
        elif "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in query:
            level = [[t, str(self.high if t < self.drop_at else self.low)] for t in stamps]
            result = [{"metric": {}, "values": level}]
            if '"part", "affected"' in query:  # impact_reader's query: one series per part
                count = [[t, str(len(self.hosts) * self.gpus)] for t in stamps]
                result = [{"metric": {"part": part}, "values": count if part == "count" else level}
                          for part in ("affected", "mean", "max", "count")]
        return web.json_response({"status": "success",
                                  "data": {"resultType": "matrix", "result": result}})


class Tags(HTMLParser):
    """Start tags with their attributes, in document order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def tags(page: str) -> list[tuple[str, dict[str, str | None]]]:
    """Every start tag of ``page``."""
    parser = Tags()
    parser.feed(page)
    return parser.tags
