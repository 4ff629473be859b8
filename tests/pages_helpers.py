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
from typing import Any

import requests
from aiohttp import web

from harness.bridge_payloads import T0, TOKEN, Running, cascade, make_context, notification, serve
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.prometheus import activity
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.prometheus.impact_reader import ImpactHistory
from wandb_infra.bridge.runs.service import RunService
from wandb_infra.bridge.web.webhook import BridgeContext
from wandb_infra.common.runkey import RunKey

AUTH = {"Authorization": f"Bearer {TOKEN}"}
HTML = {**AUTH, "Accept": "text/html"}
STALL_AT = T0.timestamp() + 40  # the cascade's first stall: activity drops here
MEASURED_AT = T0.timestamp() + 600  # "now" for measured impacts: 10 min after the XID 94


def pages_context(tmp_path: Path, *, wandb: bool = False,
                  **kwargs: Any) -> BridgeContext:
    """A bridge context whose pages read runs through a run service on a fresh store (W&B on or
    off as ``wandb`` says)."""
    store = Store(tmp_path / "bridge.sqlite")
    runs = RunService(store, wandb_enabled=wandb, clock=lambda: MEASURED_AT)
    return make_context(tmp_path, **{"store": store, "runs": runs, **kwargs})


def measure(ctx: BridgeContext, run: RunKey, prometheus_url: str, *,
            impacts: bool = True) -> None:
    """What the worker does for the pages: read the run's GPU activity and measure its impacts
    (unless not ``impacts``) with the real readers at ``MEASURED_AT``, stored as the run's
    evidence."""
    assert ctx.runs is not None
    view = ctx.runs.view(run)
    assert view is not None
    # a generous timeout: on a loaded CI machine a 2 s read of the stand-in timed out and the
    # (rightly) stored no plot, failing the plot's test for the machine's sake
    prom = PrometheusClient(prometheus_url, 15.0)
    view = ctx.runs.record_activity(view, activity.read(
        prom, run, [i.issue for i in view.issues], MEASURED_AT))
    if impacts:
        found = ImpactHistory(prom, min_step=10.0, clock=lambda: MEASURED_AT).for_diagnosis(
            run, view.diagnosis)
        assert found is not None
        ctx.runs.record_impacts(view, found)


def post_alerts(running: Running, alerts: list[dict[str, Any]]) -> None:
    """Store ``alerts`` through the webhook (with the webhook's token)."""
    resp = requests.post(running.url + "/alertmanager", data=json.dumps(notification(alerts)),
                         headers={**AUTH, "Content-Type": "application/json"}, timeout=30)
    assert resp.status_code == 200, resp.text


@contextmanager
def cascade_bridge(tmp_path: Path, prometheus_url: str = "", *, wandb: bool = False,
                   measured: bool = False, **kwargs: Any) -> Iterator[Running]:
    """A bridge with the 64-host x 8-GPU cascade of run team/proj/cascade1 stored (and, as the
    worker would, its activity read from ``prometheus_url`` when given, its impacts measured
    when ``measured``)."""
    ctx = pages_context(tmp_path, wandb=wandb, **kwargs)
    with serve(ctx) as running:
        post_alerts(running, cascade())
        if prometheus_url:
            measure(ctx, RunKey("team", "proj", "cascade1"), prometheus_url, impacts=measured)
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
