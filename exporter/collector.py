"""Builds the exposition on each scrape from the registry's current snapshot.

The two join metrics are rendered straight to text format 0.0.4: prometheus_client's generic
writer needs about 150 ms for the 18,000 series of a 2,000-host cluster (see
bench/bench_exporter.py), too slow for a scrape target. Self-metrics go through a prometheus_client
custom collector. Nothing is kept between scrapes: no global gauges are mutated behind the scrape.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from exporter import labels
from exporter.registry import Registry, Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
P = labels.SELF_METRIC_PREFIX

_HELP = {
    labels.NODE_INFO: "A W&B run executes on this host (value always 1).",
    labels.GPU_INFO: "A W&B run holds this GPU (index and/or UUID) on this host (value always 1).",
}


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _family(name: str, names: tuple[str, ...], rows: tuple[tuple[str, ...], ...]) -> str:
    """One family's text; rows needing no escaping use a %-template per set of present labels."""
    templates: dict[tuple[bool, ...], str] = {}
    lines = [f"# HELP {name} {_HELP[name]}\n# TYPE {name} gauge\n"]
    append = lines.append
    for row in rows:
        joined = "\x00".join(row)
        if "\\" in joined or '"' in joined or "\n" in joined:
            pairs = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, row, strict=True) if v)
            append(f"{name}{{{pairs}}} 1\n")
            continue
        present = tuple(map(bool, row))
        template = templates.get(present)
        if template is None:
            template = name + "{" + ",".join(
                f'{n}="%s"' for n, keep in zip(names, present, strict=True) if keep) + "} 1\n"
            templates[present] = template
        append(template % tuple(filter(None, row)))
    return "".join(lines)


def render_info(snapshot: Snapshot) -> str:
    """``wandb_run_node_info`` and ``wandb_run_gpu_info`` in text format; empty labels omitted."""
    return (_family(labels.NODE_INFO, labels.NODE_INFO_LABELS, snapshot.nodes)
            + _family(labels.GPU_INFO, labels.GPU_INFO_LABELS, snapshot.gpus))


class SelfMetrics(Collector):
    """Per-source up, last success, duration, errors, runs, hosts; totals of runs and hosts."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Families for the snapshot this collector was built with."""
        snap = self.snapshot
        up = GaugeMetricFamily(P + "source_up", "1 if the source's last poll succeeded.",
                               labels=["source"])
        last = GaugeMetricFamily(P + "source_last_success_timestamp_seconds",
                                 "Unix time of the source's last successful poll (0 = never).",
                                 labels=["source"])
        duration = GaugeMetricFamily(P + "source_duration_seconds",
                                     "Duration of the source's last poll.", labels=["source"])
        errors = CounterMetricFamily(P + "source_errors", "Failed polls and skipped bad records.",
                                     labels=["source"])
        runs = GaugeMetricFamily(P + "source_runs", "Runs the source currently maps.",
                                 labels=["source"])
        hosts = GaugeMetricFamily(P + "source_hosts", "Hosts the source currently maps.",
                                  labels=["source"])
        for status in snap.sources:
            name = [status.name]
            up.add_metric(name, 1.0 if status.up else 0.0)
            last.add_metric(name, status.last_success)
            duration.add_metric(name, status.last_duration)
            errors.add_metric(name, status.errors_total)
            n_runs, n_hosts = snap.runs_by_source.get(status.name, (0, 0))
            runs.add_metric(name, n_runs)
            hosts.add_metric(name, n_hosts)
        yield from (up, last, duration, errors, runs, hosts)
        yield GaugeMetricFamily(P + "runs", "Distinct runs published.", value=snap.runs)
        yield GaugeMetricFamily(P + "hosts", "Distinct hosts published.", value=snap.hosts)
        yield GaugeMetricFamily(P + "node_series", "wandb_run_node_info series published.",
                                value=len(snap.nodes))
        yield GaugeMetricFamily(P + "gpu_series", "wandb_run_gpu_info series published.",
                                value=len(snap.gpus))


def render(registry: Registry) -> bytes:
    """The whole /metrics body, built now from the current snapshot."""
    snap = registry.snapshot()
    self_registry = CollectorRegistry(auto_describe=False)
    self_registry.register(SelfMetrics(snap))
    return render_info(snap).encode() + generate_latest(self_registry)
