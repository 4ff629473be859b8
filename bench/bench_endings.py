"""Cost of ended-run verdicts: 1,000 runs ending per hour on a 2,000-host cluster,
as a ratio to the bridge's idle load.

Why a Prometheus stand-in: the figure is the bridge's own CPU for the work, with answers the
size a real Prometheus gives (every host of every ended run, 8 GPUs each, a point per 30 s over
the run's life); Prometheus' side is counted as queries per ended run. The stand-in answers from
its own thread, and only the bridge worker's thread time is measured (``time.thread_time``).
Idle load: the same delivery worker's loop (one ``run_once`` a second, Prometheus configured,
nothing to do) for an hour. Runs: 70 % on 1 host, 20 % on 4, 8 % on 16, 2 % on 64, 30 minutes
long (about 2,000 hosts busy at any time).
"""

from __future__ import annotations

import json
import random
import re
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from bench.common import Result
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.prometheus.endings import EndingsPolicy

HOSTS = 2000
RUNS_PER_HOUR = 1000
RUN_SECONDS = 1800.0
STEP = 30.0
INTERVAL = 60.0
IDLE_SAMPLE = 600  # idle run_once calls measured (scaled to 3,600 a second for an hour)
T0 = 1_800_000_000.0


class Cluster:
    """Which runs end when, on which hosts (the stand-in's whole state)."""

    def __init__(self, seed: int = 26) -> None:
        rng = random.Random(seed)
        self.runs: dict[str, tuple[list[str], float, float]] = {}
        gap = 3600.0 / RUNS_PER_HOUR
        for i in range(RUNS_PER_HOUR):
            size = rng.choices((1, 4, 16, 64), (70, 20, 8, 2))[0]
            first = rng.randrange(HOSTS - size)
            end = T0 + (i + 0.5) * gap
            self.runs[f"run{i:04d}"] = ([f"gpu-node-{h:04d}" for h in range(first, first + size)],
                                        end - RUN_SECONDS, end)

    def ended(self, since: float, until: float) -> list[str]:
        return [r for r, (_, _, end) in self.runs.items() if since < end <= until]


def _values(start: float, end: float, step: float, lo: float, hi: float) -> list[list[Any]]:
    t, out = start, []
    while t <= end:
        if lo <= t <= hi:
            out.append([round(t, 3), "1"])
        t += step
    return out


def _handler(cluster: Cluster, grace: float, clock: list[float]
             ) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            q = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
            body = json.dumps({"status": "success", "data": {
                "resultType": "matrix", "result": self.answer(q)}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def answer(self, q: dict[str, str]) -> list[Any]:
            expr = q["query"]
            if expr == "time()":  # Prometheus' clock: the simulated one
                return [clock[0], str(clock[0])]
            labels = {"wandb_entity": "team", "wandb_project": "proj"}
            if "wandb_run_id=~" in expr:  # which of these runs are still published
                at = float(q["time"])
                ids = re.search(r'wandb_run_id=~"([^"]*)"', expr).group(1).split("|")
                return [{"metric": {**labels, "wandb_run_id": r}, "value": [at, "1"]}
                        for r in ids if cluster.runs[r][1] <= at <= cluster.runs[r][2] + grace]
            start, end = float(q["start"]), float(q["end"])
            step = float(q["step"])
            if "unless on" in expr:
                window = float(re.search(r"\[(\d+)s\]\)\) unless", expr).group(1))
                return [{"metric": {**labels, "wandb_run_id": r}, "values": [[end, "1"]]}
                        for r in cluster.ended(end - window, end - grace)]
            run = re.search(r'wandb_run_id="([^"]+)"', expr)
            if run:
                hosts, lo, hi = cluster.runs[run.group(1)]
                points = _values(start, end, step, lo, hi)
                if "wandb_run_gpu_info" in expr:
                    return [{"metric": {"hostname": h, "gpu": str(g)}, "values": points}
                            for h in hosts for g in range(8)]
                return [{"metric": {"hostname": h}, "values": points} for h in hosts]
            hosts = re.search(r'hostname=~"([^"]*)"', expr).group(1).split("|")
            points = _values(start, end, step, start, end)
            if "up[" in expr:
                return [{"metric": {"hostname": h, "exporter": e}, "values": points}
                        for h in hosts for e in ("dcgm_exporter", "node_exporter")]
            return [{"metric": {"hostname": h, "gpu": str(g)}, "values": points}
                    for h in hosts for g in range(8)]
    return Handler


def _worker(tmp: Path, name: str, url: str, endings: EndingsPolicy | None,
            clock: list[float]) -> DeliveryWorker:
    return DeliveryWorker(Store(tmp / f"{name}.sqlite"), client=None, markers=None,
                          links=GrafanaLinks(""), metrics=BridgeMetrics(),
                          prometheus=PrometheusClient(url), clock=lambda: clock[0],
                          policy=DeliveryPolicy(node_state_refresh=0, endings=endings))


def measure() -> dict[str, float]:
    """Worker-thread CPU seconds: an idle hour, and an hour of verdicts."""
    cluster = Cluster()
    policy = EndingsPolicy(grace=300.0, interval=INTERVAL, lookback=INTERVAL,
                           max_run=4 * 3600.0, step=STEP, per_pass=100)
    clock = [T0]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(cluster, policy.grace, clock))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with tempfile.TemporaryDirectory(prefix="bench-endings-") as tmp_dir:
            tmp = Path(tmp_dir)
            idle = _worker(tmp, "idle", url, None, clock)
            began = time.thread_time()
            for _ in range(IDLE_SAMPLE):
                clock[0] += 1.0
                idle.run_once()
            idle_hour = (time.thread_time() - began) * 3600 / IDLE_SAMPLE
            clock[0] = T0 + policy.grace
            busy = _worker(tmp, "busy", url, policy, clock)
            assert busy.endings is not None
            busy.store.set_scanned_to("endings", clock[0])
            wall = time.perf_counter()
            began = time.thread_time()
            for _ in range(int(3600 / INTERVAL)):
                clock[0] += INTERVAL
                busy.endings.run(clock[0])
            verdict_hour = time.thread_time() - began
            wall = time.perf_counter() - wall
            judged = busy.endings.judged
            queries = busy.endings.endings.queries
    finally:
        server.shutdown()
        server.server_close()
    return {"idle": idle_hour, "verdicts": verdict_hour, "judged": judged,
            "queries": queries, "wall": wall}


def run() -> list[Result]:
    """The benchmark row."""
    m = measure()
    per_run = m["queries"] / max(1, m["judged"])
    return [Result(
        "bridge: ended-run verdicts, 1,000 runs ending per hour on 2,000 hosts", m["verdicts"],
        "CPU s/h", m["idle"], None,
        note=f"bridge worker thread CPU for an hour of verdicts ({m['judged']:.0f} runs judged, "
             f"{per_run:.1f} Prometheus queries per ended run, with the 3 of each 60 s pass: "
             "Prometheus' time, ended runs, one-witness runs seen again; "
             f"{m['wall']:.1f} s wall with the stand-in's answers); baseline: the same worker "
             "idle for an hour (run_once every second, Prometheus configured); ratio: verdict "
             "work / idle load; Prometheus' own cost and the W&B writes are not in the figure")]


if __name__ == "__main__":
    for r in run():
        print(json.dumps(r.as_dict()))
