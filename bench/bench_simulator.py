"""Simulator benchmarks: can one process feed a 2,000-host x 8-GPU cluster to a real Prometheus?

Figures, each with a baseline measured in the same run:
* one full scrape cycle (every host's dcgm and node text, counters advanced) rendered by the
  simulator, against prometheus_client rendering the same dcgm series from a registry;
* the 99th-percentile scrape duration a real Prometheus sees over 4,000 targets (2,000 hosts),
  against the same Prometheus scraping a 4-host cluster.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from bench.common import Result, median_seconds
from demo.simulator.cluster import Cluster
from demo.simulator.exposition import GPU_METRICS
from demo.simulator.scrape import prometheus_config
from demo.simulator.server import serve
from harness.processes import prom_query, prometheus

ROOT = Path(__file__).resolve().parent.parent

HOSTS = 2000
SCRAPE_INTERVAL = "15s"


class _Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _full_cycle(cluster: Cluster, clock: _Clock) -> None:
    clock.now += 15  # one scrape interval later: every cached text is stale
    for host in cluster.hosts:
        cluster.render("dcgm", host)
        cluster.render("node", host)


class _DcgmCollector:
    """The same dcgm families and labels, rendered the usual way (prometheus_client)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def collect(self) -> object:
        names = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname")
        for metric in GPU_METRICS:
            family = GaugeMetricFamily(metric.name, metric.help, labels=names)
            for host in self.cluster.hosts.values():
                for gpu in host.gpus:
                    family.add_metric((str(gpu.index), gpu.uuid, gpu.pci_bus_id,
                                       f"nvidia{gpu.index}", "H100", host.name), 1.0)
            yield family


def _render_figure() -> Result:
    clock = _Clock()
    cluster = Cluster(hosts=HOSTS, clock=clock)
    ours = median_seconds(lambda: _full_cycle(cluster, clock), repeat=3)
    registry = CollectorRegistry()
    registry.register(_DcgmCollector(cluster))
    baseline = median_seconds(lambda: generate_latest(registry), repeat=3)
    return Result(
        name="simulator: render full scrape cycle, 2000 hosts x 8 GPUs (dcgm+node)",
        value=ours, unit="s", baseline=baseline, target=3.0,
        note="target: under 20% of one core at a 15 s scrape interval; baseline: "
             "prometheus_client rendering the dcgm families only")


def _p99_scrape(hosts: int, workdir: Path) -> tuple[float, int]:
    cluster = Cluster(hosts=hosts)
    with serve(cluster) as sim:
        config = prometheus_config(sim.address, cluster.hosts, interval=SCRAPE_INTERVAL)
        with prometheus(config, workdir) as prom:
            targets = 2 * hosts
            deadline = time.monotonic() + 180
            up = 0
            while time.monotonic() < deadline:
                result = prom_query(prom.url, "count(up == 1)")
                up = int(float(result[0]["value"][1])) if result else 0
                if up == targets:
                    break
                time.sleep(2)
            time.sleep(35)  # two more full rounds, past the first scrape's series creation
            result = prom_query(prom.url, "quantile(0.99, scrape_duration_seconds)")
            p99 = float(result[0]["value"][1])
            result = prom_query(prom.url, "count(up == 1)")
            up = int(float(result[0]["value"][1])) if result else 0
    return p99, up


def _prometheus_figure() -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        baseline, _ = _p99_scrape(4, Path(tmp) / "small")
        p99, up = _p99_scrape(HOSTS, Path(tmp) / "large")
    return Result(
        name="simulator: p99 scrape duration, real Prometheus, 4000 targets",
        value=p99, unit="s", baseline=baseline, target=1.0,
        note=f"{up}/{2 * HOSTS} targets up; baseline: the same with 4 hosts (8 targets)")


def run() -> list[Result]:
    """Both figures (the Prometheus one takes about two minutes)."""
    return [_render_figure(), _prometheus_figure()]
