"""Builds the exposition on each scrape from the merged snapshot.

The two join metrics are rendered straight to text format 0.0.4: prometheus_client's generic
writer needs 150+ ms for the 18,000 series of a 2,000-host cluster (see bench/bench_exporter.py),
too slow for a scrape target. Each scrape assembles the body from the merged snapshot;
the only thing remembered between scrapes is a memo from a series' label values to its text line
(a pure function of them), pruned to the series of the last scrape. Self-metrics go through a
prometheus_client custom collector. No gauges are mutated behind the scrape.
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Iterator, Sequence

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from wandb_infra.common import labels, nodestate
from wandb_infra.common.nodestate import NodeState
from wandb_infra.exporter import __version__
from wandb_infra.exporter.placements import PlacementMerger, Snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
P = labels.SELF_METRIC_PREFIX

_HELP = {
    labels.NODE_INFO: "A W&B run executes on this host (value always 1).",
    labels.GPU_INFO: "A W&B run holds this GPU (index and/or UUID) on this host (value always 1).",
    labels.POD_INFO: "A W&B run executes in this Kubernetes pod on this host (value always 1).",
}


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


class _Lines:
    """Text lines of one family, memoised by label values (pruned to the last scrape's series)."""

    def __init__(self, name: str, names: tuple[str, ...]) -> None:
        self.name, self.names = name, names
        self.header = f"# HELP {name} {_HELP[name]}\n# TYPE {name} gauge\n"
        self._templates: dict[tuple[bool, ...], str] = {}
        self._memo: dict[tuple[str, ...], str] = {}

    def _line(self, row: tuple[str, ...]) -> str:
        joined = "\x00".join(row)
        if "\\" in joined or '"' in joined or "\n" in joined:
            pairs = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(self.names, row, strict=True)
                             if v)
            return f"{self.name}{{{pairs}}} 1\n"
        present = tuple(map(bool, row))
        template = self._templates.get(present)
        if template is None:
            template = self.name + "{" + ",".join(
                f'{n}="%s"' for n, keep in zip(self.names, present, strict=True) if keep) + "} 1\n"
            self._templates[present] = template
        return template % tuple(filter(None, row))

    def render(self, rows: tuple[tuple[str, ...], ...]) -> str:
        """The family's text for exactly ``rows``; empty label values are omitted."""
        memo, fresh = self._memo, {}
        lines = [self.header]
        append = lines.append
        for row in rows:
            line = memo.get(row)
            if line is None:
                line = self._line(row)
            fresh[row] = line
            append(line)
        self._memo = fresh
        return "".join(lines)


class Exposition:
    """Builds /metrics bodies from a merger (one instance per server)."""

    def __init__(self) -> None:
        self._nodes = _Lines(labels.NODE_INFO, labels.NODE_INFO_LABELS)
        self._gpus = _Lines(labels.GPU_INFO, labels.GPU_INFO_LABELS)
        self._pods = _Lines(labels.POD_INFO, labels.POD_INFO_LABELS)
        self._lock = threading.Lock()
        # process_* (CPU, memory, file descriptors), python_info and python_gc_*, as every
        # client_python exporter serves them; registered once, read at each scrape.
        self._process = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self._process)
        PlatformCollector(registry=self._process)
        GCCollector(registry=self._process)

    def render_info(self, snapshot: Snapshot) -> str:
        """``wandb_run_node_info``, ``wandb_run_gpu_info`` and, where a source names pods,
        ``wandb_run_pod_info`` in text format."""
        with self._lock:
            text = self._nodes.render(snapshot.nodes) + self._gpus.render(snapshot.gpus)
            return text + (self._pods.render(snapshot.pods) if snapshot.pods else "")

    def render(self, merger: PlacementMerger) -> bytes:
        """The whole /metrics body, built now from the merged snapshot."""
        snap = merger.snapshot()
        self_registry = CollectorRegistry(auto_describe=False)
        self_registry.register(SelfMetrics(snap))
        return (self.render_info(snap) + render_node_states(merger.node_states())).encode() \
            + generate_latest(self_registry) + generate_latest(self._process)


def render_node_states(states: Sequence[NodeState]) -> str:
    """``wandb_infra_node_state`` and ``wandb_infra_node_schedulable`` (few series: one per
    host, so no memo)."""
    if not states:
        return ""
    info = [f"# HELP {nodestate.STATE} Scheduler state of a host and why (value always 1).\n"
            f"# TYPE {nodestate.STATE} gauge\n"]
    able = [f"# HELP {nodestate.SCHEDULABLE} 1 if the scheduler may start new jobs on the "
            f"host.\n# TYPE {nodestate.SCHEDULABLE} gauge\n"]
    for s in states:
        pairs = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(nodestate.STATE_LABELS, s,
                                                               strict=True) if v)
        info.append(f"{nodestate.STATE}{{{pairs}}} 1\n")
        able.append(f'{nodestate.SCHEDULABLE}{{hostname="{_escape(s.hostname)}",'
                    f'scheduler="{s.scheduler}"}} {int(s.schedulable)}\n')
    return "".join(info + able)


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
        cut = CounterMetricFamily(P + "source_cut", "Reported metadata cut to the exporter's "
                                  "bounds (metadata.*): host, label, hosts_per_run, "
                                  "runs_per_source.", labels=["source", "what"])
        for status in snap.sources:
            for what, count in sorted(status.cut_total.items()):
                cut.add_metric([status.name, what], count)
        yield from (up, last, duration, errors, runs, hosts, cut)
        build = GaugeMetricFamily(P + "build_info", "Version of the running exporter (value 1).",
                                  labels=["version", "pythonversion"])
        build.add_metric([__version__, platform.python_version()], 1.0)
        yield build
        yield GaugeMetricFamily(P + "runs", "Distinct runs published.", value=snap.runs)
        yield GaugeMetricFamily(P + "hosts", "Distinct hosts published.", value=snap.hosts)
        yield GaugeMetricFamily(P + "node_series", "wandb_run_node_info series published.",
                                value=len(snap.nodes))
        yield GaugeMetricFamily(P + "gpu_series", "wandb_run_gpu_info series published.",
                                value=len(snap.gpus))
        yield GaugeMetricFamily(P + "pod_series", "wandb_run_pod_info series published.",
                                value=len(snap.pods))



def render(merger: PlacementMerger) -> bytes:
    """A /metrics body without memo (tests, one-off dumps)."""
    return Exposition().render(merger)
