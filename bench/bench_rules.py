"""Rule evaluation cost on a 2,000-host x 8-GPU cluster: a real Prometheus scrapes the cluster
simulator (dcgm-exporter in three flavours, node_exporter with 8 IB ports per host, join metrics
for 250 runs, a few faults) and evaluates every shipped group every 30 s.

Figure: total evaluation time per cycle (sum of ``prometheus_rule_group_last_duration_seconds``
over all groups, median over the measured cycles) and its ratio to the 30 s interval (the baseline;
target < 5%). Windows of up to 1 h are only as full as the run is long (a few minutes), noted in
the result. ``WANDB_INFRA_BENCH_RULES_MINUTES`` sets the run length (default 6).
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from alert_rules.generate import RULES_FILE  # noqa: E402
from bench.common import Result  # noqa: E402
from demo.simulator import Cluster, prometheus_config, serve  # noqa: E402
from tests.services import prom_query, prometheus  # noqa: E402

HOSTS = 2000
GPUS = 8
RUNS = 250
INTERVAL_S = 30
TARGET_RATIO = 0.05
METRIC = re.compile(r'^(prometheus_rule_[a-z_]+)\{rule_group="[^"]*;([^"]+)"\} (\S+)$', re.M)


def _cluster() -> Cluster:
    width = max(3, len(str(HOSTS)))
    names = [f"gpu-node-{i:0{width}d}" for i in range(1, HOSTS + 1)]
    flavours = {n: ("Hostname" if i % 3 == 0 else "4.9" if i % 10 == 1 else "hostname")
                for i, n in enumerate(names)}
    cluster = Cluster(hosts=HOSTS, gpus_per_host=GPUS, host_flavours=flavours, xid_count=True,
                      render_ttl=5.0)
    per_run = HOSTS // RUNS
    for r in range(RUNS):
        hosts = names[r * per_run:(r + 1) * per_run]
        gpus = None if r % 2 == 0 else range(GPUS)
        cluster.assign_run("bench", "cluster", f"run{r:03d}", hosts, gpus=gpus)
    return cluster


def _faults(cluster: Cluster) -> None:
    names = list(cluster.hosts)
    cluster.inject("xid", names[4], gpu=3, code=94)
    cluster.inject("xid", names[40], gpu=1, code=79)
    cluster.inject("ib_down", names[9], device="mlx5_2")
    cluster.inject("thermal", names[19], gpu=5)
    cluster.inject("nvlink", names[29], gpu=0)
    cluster.inject("ecc_dbe", names[49], gpu=2)
    cluster.inject("stall", names[64])


def _rule_metrics(base_url: str) -> dict[str, dict[str, float]]:
    text = requests.get(base_url + "/metrics", timeout=30).text
    out: dict[str, dict[str, float]] = {}
    for name, group, value in METRIC.findall(text):
        out.setdefault(name, {})[group] = float(value)
    return out


def run() -> list[Result]:
    """Start simulator + Prometheus, let the groups evaluate, read their durations."""
    minutes = float(os.environ.get("WANDB_INFRA_BENCH_RULES_MINUTES", "6"))
    rules = str(ROOT / "alert_rules" / RULES_FILE)
    cluster = _cluster()
    totals: list[float] = []
    slowest: list[tuple[float, str]] = []
    with tempfile.TemporaryDirectory(prefix="bench-rules-") as tmp, serve(cluster) as sim:
        config = prometheus_config(sim.address, cluster.hosts, interval=f"{INTERVAL_S}s",
                                   rule_files=[rules], runs_job="wandb-runs")
        with prometheus(config, Path(tmp)) as prom:
            start = time.monotonic()
            injected = False
            last_eval: dict[str, float] = {}
            while time.monotonic() - start < minutes * 60:
                time.sleep(INTERVAL_S)
                elapsed = time.monotonic() - start
                if not injected and elapsed > 90:
                    _faults(cluster)
                    injected = True
                metrics = _rule_metrics(prom.url)
                durations = metrics.get("prometheus_rule_group_last_duration_seconds", {})
                stamps = metrics.get("prometheus_rule_group_last_evaluation_timestamp_seconds",
                                     {})
                if elapsed > 120 and durations and stamps != last_eval:
                    totals.append(sum(durations.values()))
                    slowest.append(max((v, k) for k, v in durations.items()))
                last_eval = stamps
            metrics = _rule_metrics(prom.url)
            failures = sum(metrics.get("prometheus_rule_evaluation_failures_total", {}).values())
            missed = sum(metrics.get("prometheus_rule_group_iterations_missed_total", {}).values())
            groups = len(metrics.get("prometheus_rule_group_last_duration_seconds", {}))
            firing = prom_query(prom.url, 'count by (alertname) (ALERTS{alertstate="firing"})')
            series = prom_query(prom.url, 'count({__name__=~".+"})')
    if not totals:
        raise RuntimeError("no rule evaluation cycles measured")
    total = statistics.median(totals)
    worst = max(slowest)
    fired = ", ".join(sorted(f"{r['metric']['alertname']}={r['value'][1]}" for r in firing))
    head = series[0]["value"][1] if series else "?"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    note = (f"{groups} groups, {len(totals)} cycles, {failures:.0f} evaluation failures, "
            f"{missed:.0f} missed iterations, slowest group {worst[1]} {worst[0]:.3f}s, "
            f"head series {head}; 1h windows hold only {minutes:.0f} min of data; "
            f"machine load average {load} on {os.cpu_count()} cores (shared); "
            f"firing: {fired}")
    print(note)
    return [Result("rules: evaluation per cycle, 2000 hosts x 8 GPUs, 250 runs", total, "s",
                   float(INTERVAL_S), INTERVAL_S * TARGET_RATIO, note=note)]


if __name__ == "__main__":
    for result in run():
        print(result.as_dict())
