"""Exporter scrape time for a 2,000-host x 8-GPU cluster: 250 runs x 8 hosts x 8 GPUs
(16,000 wandb_run_gpu_info + 2,000 wandb_run_node_info series), over HTTP.

Baseline, measured in the same run: the same series through prometheus_client's generic labelled
``Gauge``, served by prometheus_client's own HTTP server. Two exporter figures: a steady mapping
(the usual case between source polls) and a mapping that changed before every scrape (merge and
stable-label bookkeeping redone inside the scrape; the source update itself is not timed).
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import requests
from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from bench.common import Result, median_seconds
from harness.processes import free_port
from wandb_infra.common import labels
from wandb_infra.common.runkey import RunKey
from wandb_infra.exporter.model import Gpu, RunPlacement, SourceResult
from wandb_infra.exporter.placements import PlacementMerger
from wandb_infra.exporter.pushed import RegistrationStore
from wandb_infra.exporter.server import build_app

RUNS, HOSTS_PER_RUN, GPUS_PER_HOST = 250, 8, 8
TARGET_MS = 100.0


def placements(generation: int = 0) -> list[RunPlacement]:
    """The cluster's mapping; ``generation`` renames one run so the mapping changes."""
    out = []
    for r in range(RUNS):
        run_id = f"run{r:04d}" + (f"g{generation}" if r == 0 else "")
        run = RunKey("team", "llm-pretraining", run_id)
        for h in range(HOSTS_PER_RUN):
            host = f"gpu{r * HOSTS_PER_RUN + h:05d}"
            gpus = tuple(Gpu(str(g), f"GPU-{r:04d}{h}{g}-7b3e-4c1d-9a2f-00000000") for g in
                         range(GPUS_PER_HOST))
            out.append(RunPlacement(run, host, "slurm", gpus, f"name-{r}",
                                    ((labels.SLURM_JOB_ID, str(100000 + r)),)))
    return out


@contextmanager
def serve(app: web.Application) -> Iterator[str]:
    """Run an aiohttp app on a loopback port in a background thread."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    port = free_port()
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def baseline_url(data: list[RunPlacement]) -> tuple[str, object]:
    """The same series as labelled Gauges behind prometheus_client's HTTP server."""
    registry = CollectorRegistry()
    node = Gauge(labels.NODE_INFO, "node", labels.NODE_INFO_LABELS, registry=registry)
    gpu = Gauge(labels.GPU_INFO, "gpu", labels.GPU_INFO_LABELS, registry=registry)
    for p in data:
        node.labels(p.run.entity, p.run.project, p.run.run_id, p.run_name, "", p.host, p.source,
                    dict(p.extra)[labels.SLURM_JOB_ID], "", "").set(1)
        for g in p.gpus:
            gpu.labels(p.run.entity, p.run.project, p.run.run_id, p.host, g.index, g.uuid,
                       p.source).set(1)
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    return f"http://127.0.0.1:{port}", server


def run() -> list[Result]:
    """Median scrape times (ms), steady and changing mapping, vs the Gauge baseline."""
    session = requests.Session()
    session.trust_env = False
    data = placements()
    registry = PlacementMerger()
    registry.record_success("slurm", SourceResult(data), 0.1)
    base, server = baseline_url(data)
    try:
        def scrape_baseline() -> None:
            session.get(base + "/metrics", timeout=60).raise_for_status()
        baseline = median_seconds(scrape_baseline, repeat=7) * 1000
    finally:
        server.shutdown()
        server.server_close()
    with serve(build_app(registry, RegistrationStore())) as url:
        body = session.get(url + "/metrics", timeout=60).text
        series = body.count(labels.GPU_INFO + "{") + body.count(labels.NODE_INFO + "{")
        assert series == RUNS * HOSTS_PER_RUN * (GPUS_PER_HOST + 1), series

        def scrape() -> None:
            session.get(url + "/metrics", timeout=60).raise_for_status()
        steady = median_seconds(scrape, repeat=15) * 1000
        variants = [placements(g) for g in range(2)]
        samples = []
        for i in range(9):  # the source update itself is not part of the scrape: untimed
            registry.record_success("slurm", SourceResult(variants[(i + 1) % 2]), 0.1)
            start = time.perf_counter()
            session.get(url + "/metrics", timeout=60).raise_for_status()
            samples.append(time.perf_counter() - start)
        changing = statistics.median(samples) * 1000
    note = f"{series} series, {len(body) / 1e6:.1f} MB; baseline = prometheus_client Gauge + HTTP"
    return [
        Result("exporter /metrics, 2,000 hosts x 8 GPUs, steady mapping", round(steady, 2), "ms",
               round(baseline, 2), TARGET_MS, note=note),
        Result("exporter /metrics, 2,000 hosts x 8 GPUs, mapping changed", round(changing, 2),
               "ms", round(baseline, 2), TARGET_MS, note=note),
    ]


if __name__ == "__main__":
    for result in run():
        print(result.as_dict())
