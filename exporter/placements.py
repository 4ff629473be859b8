"""Merges what every source reports into the series the collector publishes.

* Host names go through the HostnameMapper once, at ingestion.
* A source that fails keeps its last good mapping for ``grace_seconds`` (then it is dropped) and
  reports itself down; problems inside a good poll only count as errors.
* Several sources may report the same run on the same host: one node series per (run, host), GPUs
  merged (a GPU known by index and UUID replaces the same GPU known by only one of them).
* What a polled source reports is untrusted metadata (a W&B run's config, a Kubernetes pod's
  labels): each poll is bounded in hosts per run, runs per source and bytes per label value
  (``Limits``), and what is cut is logged once per poll and counted in
  ``wandb_infra_exporter_source_cut_total{source,what}``. One W&B run's 60-byte config naming
  four 100,000-host lists made the exporter publish 400,000 hosts and grow past its memory
  limit.
* A run's labels stay constant while it lives: the first labels seen for (run, host) win until that
  pair disappears from every source; likewise a GPU first published by index keeps that label set
  when another source later adds its UUID (and vice versa).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from wandb_infra.common import labels
from wandb_infra.common.logsetup import log_fields
from wandb_infra.common.runkey import RunKey
from wandb_infra.exporter.hostnames import HostnameMapper
from wandb_infra.exporter.model import Gpu, RunPlacement, SourceResult

log = logging.getLogger(__name__)

NodeKey = tuple[RunKey, str]


@dataclass
class SourceStatus:
    """Self-metrics of one source."""

    name: str
    up: bool = False
    last_success: float = 0.0
    last_duration: float = 0.0
    errors_total: int = 0
    placements: list[RunPlacement] = field(default_factory=list)
    cut_total: Counter[str] = field(default_factory=Counter)  # what Limits cut, by kind


@dataclass(frozen=True)
class Limits:
    """Bounds on one poll of a source (see ``bound``)."""

    max_hosts_per_run: int = 4096
    max_runs_per_source: int = 50_000
    max_label_bytes: int = 256


def _clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, never inside a character."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", "ignore")


def bound(placements: Sequence[RunPlacement], limits: Limits
          ) -> tuple[list[RunPlacement], Counter[str]]:
    """The placements within ``limits`` (the first hosts of a run and the first runs, in the
    source's order) and how many of each kind were cut: ``host`` (a host name over the label
    bound: dropped, a cut name would be another host), ``label`` (a run name or extra label
    value cut to the bound), ``hosts_per_run``, ``runs_per_source``."""
    cut: Counter[str] = Counter()
    hosts: Counter[RunKey] = Counter()
    runs: set[RunKey] = set()
    dropped: set[RunKey] = set()
    out = []
    for p in placements:
        if len(p.host.encode("utf-8", "surrogatepass")) > limits.max_label_bytes:
            cut["host"] += 1
            continue
        if p.run not in runs:
            if len(runs) >= limits.max_runs_per_source:
                dropped.add(p.run)
                continue
            runs.add(p.run)
        if hosts[p.run] >= limits.max_hosts_per_run:
            cut["hosts_per_run"] += 1
            continue
        hosts[p.run] += 1
        name = _clip(p.run_name, limits.max_label_bytes)
        extra = tuple((k, _clip(v, limits.max_label_bytes)) for k, v in p.extra)
        if name != p.run_name or extra != p.extra:
            cut["label"] += 1
            out.append(RunPlacement(p.run, p.host, p.source, p.gpus, name, extra))
        else:
            out.append(p)
    if dropped:
        cut["runs_per_source"] = len(dropped)
    return out, cut


@dataclass(frozen=True)
class _NodeState:
    """What was published for one (run, host): node labels, GPUs, and their label rows."""

    values: tuple[str, ...]
    gpus: tuple[Gpu, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Snapshot:
    """Label-value tuples ready to publish, in labels.NODE_INFO_LABELS / GPU_INFO_LABELS order."""

    nodes: tuple[tuple[str, ...], ...]
    gpus: tuple[tuple[str, ...], ...]
    runs: int
    hosts: int
    sources: tuple[SourceStatus, ...]
    runs_by_source: dict[str, tuple[int, int]]
    pods: tuple[tuple[str, ...], ...] = ()


def merge_gpus(gpus: Iterable[Gpu]) -> tuple[Gpu, ...]:
    """Union of GPUs; drop partial entries that a complete (index+uuid) entry covers."""
    unique = set(gpus)
    if not unique:
        return ()
    full = [g for g in unique if g.index and g.uuid]
    indices = {g.index for g in full}
    uuids = {g.uuid for g in full}
    kept = [g for g in unique if (g.index and g.uuid)
            or (g.index and not g.uuid and g.index not in indices)
            or (g.uuid and not g.index and g.uuid not in uuids)]
    return tuple(sorted(kept, key=lambda g: (not g.index, len(g.index), g.index, g.uuid)))


class PlacementMerger:
    """Every source's placements (polled, pushed, live) merged into the series to publish, with
    each source's health. Thread-safe; ``snapshot()`` is cached until something changes."""

    def __init__(self, mapper: HostnameMapper | None = None, grace_seconds: float = 300.0,
                 clock: Callable[[], float] = time.time,
                 live_sources: Sequence[tuple[str, Callable[[], list[RunPlacement]]]] = (),
                 live_version: Callable[[], int] = lambda: 0, *,
                 limits: Limits | None = None) -> None:
        self.mapper = mapper or HostnameMapper()
        self.limits = limits or Limits()
        self.grace = grace_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._sources: dict[str, SourceStatus] = {}
        self._live = list(live_sources)
        self._live_version = live_version
        for name, _ in self._live:
            self._sources[name] = SourceStatus(name, up=True)
        self._stable: dict[NodeKey, _NodeState] = {}
        self._version = 0
        self._cache: tuple[tuple[int, int], Snapshot] | None = None
        self._node_states: list[Callable[[], Sequence[Any]]] = []

    def add_node_states(self, provider: Callable[[], Sequence[Any]]) -> None:
        """A node-state poller's current states (exporter/sources/nodestate.py), rendered on
        each scrape next to the join metrics."""
        self._node_states.append(provider)

    def node_states(self) -> list[Any]:
        """Every provider's states, one per (hostname, scheduler), sorted."""
        merged = {(s.hostname, s.scheduler): s for p in self._node_states for s in p()}
        return [merged[k] for k in sorted(merged)]

    def add_source(self, name: str) -> None:
        """Declare a polled source so it reports up=0 until its first good poll."""
        with self._lock:
            self._sources.setdefault(name, SourceStatus(name))

    def record_success(self, name: str, result: SourceResult, duration: float) -> None:
        """A good poll: replace the source's mapping (host names mapped), count its problems."""
        placements, cut = bound([self.canonical(p) for p in result.placements], self.limits)
        if cut:
            log.warning("source metadata cut to the exporter's bounds", extra=log_fields(
                source=name, **{f"cut_{k}": v for k, v in sorted(cut.items())},
                max_hosts_per_run=self.limits.max_hosts_per_run,
                max_runs_per_source=self.limits.max_runs_per_source,
                max_label_bytes=self.limits.max_label_bytes))
        with self._lock:
            status = self._sources.setdefault(name, SourceStatus(name))
            status.cut_total.update(cut)
            status.up = True
            status.last_success = self.clock()
            status.last_duration = duration
            status.errors_total += len(result.problems)
            if placements != status.placements:
                status.placements = placements
                self._version += 1
        for problem in result.problems[:20]:
            log.warning("source problem", extra=log_fields(source=name, problem=problem))

    def count_error(self, name: str) -> None:
        """One rejected input for a source that stays up (e.g. a registration answered 400)."""
        with self._lock:
            self._sources.setdefault(name, SourceStatus(name)).errors_total += 1

    def record_failure(self, name: str, error: str, duration: float) -> None:
        """A failed poll: down, errors+1; the last good mapping stays for the grace period."""
        with self._lock:
            status = self._sources.setdefault(name, SourceStatus(name))
            status.up = False
            status.last_duration = duration
            status.errors_total += 1
        log.warning("source failed", extra=log_fields(source=name, error=error))

    def canonical(self, placement: RunPlacement) -> RunPlacement:
        """The placement with its host name mapped to the published ``hostname``."""
        host = self.mapper(placement.host)
        if host == placement.host:
            return placement
        return RunPlacement(placement.run, host, placement.source, placement.gpus,
                            placement.run_name, placement.extra)

    def _expire(self, now: float) -> None:
        for status in self._sources.values():
            if (not status.up and status.placements
                    and now - status.last_success > self.grace):
                log.warning("grace period over, dropping mapping",
                            extra=log_fields(source=status.name, runs=len(status.placements)))
                status.placements = []
                self._version += 1

    def snapshot(self) -> Snapshot:
        """The merged series; recomputed only when a mapping changed."""
        with self._lock:
            self._expire(self.clock())
            key = (self._version, self._live_version())
            if self._cache and self._cache[0] == key:
                return self._refresh_status(self._cache[1])
            live = [(name, [self.canonical(p) for p in fn()]) for name, fn in self._live]
            snap = self._merge(live)
            self._cache = (key, snap)
            return snap

    def _refresh_status(self, snap: Snapshot) -> Snapshot:
        return Snapshot(snap.nodes, snap.gpus, snap.runs, snap.hosts,
                        self._status_copy(), snap.runs_by_source, snap.pods)

    def _status_copy(self) -> tuple[SourceStatus, ...]:
        return tuple(SourceStatus(s.name, s.up, s.last_success, s.last_duration, s.errors_total,
                                  cut_total=Counter(s.cut_total))
                     for s in self._sources.values())

    def _merge(self, live: list[tuple[str, list[RunPlacement]]]) -> Snapshot:
        grouped: dict[NodeKey, list[RunPlacement]] = {}
        per_source: dict[str, tuple[int, int]] = {}
        live_names = {name for name, _ in live}
        lists = [(s.name, s.placements) for s in self._sources.values()
                 if s.name not in live_names] + live
        for name, placements in lists:
            runs, hosts = set(), set()
            for p in placements:
                grouped.setdefault((p.run, p.host), []).append(p)
                runs.add(p.run)
                hosts.add(p.host)
            per_source[name] = (len(runs), len(hosts))
        source_at = labels.NODE_INFO_LABELS.index(labels.SOURCE)
        stable: dict[NodeKey, _NodeState] = {}
        nodes: list[tuple[str, ...]] = []
        gpus: list[tuple[str, ...]] = []
        for node_key in sorted(grouped):
            group = grouped[node_key]
            state = self._stable.get(node_key)
            values = state.values if state else _node_values(node_key, group)
            nodes.append(values)
            previous = state.gpus if state else ()
            if state and len(group) == 1 and group[0].gpus == previous:
                rows = state.rows  # the common case: nothing changed for this run on this host
            else:
                kept = _keep_gpu_labels(previous, merge_gpus(g for p in group for g in p.gpus))
                run, host = node_key
                rows = tuple((run.entity, run.project, run.run_id, host, g.index, g.uuid,
                              values[source_at]) for g in kept)
                state = _NodeState(values, kept, rows)
            stable[node_key] = state
            gpus.extend(rows)
        self._stable = stable
        return Snapshot(tuple(nodes), tuple(gpus), len({k[0] for k in grouped}),
                        len({k[1] for k in grouped}), self._status_copy(), per_source,
                        _pod_rows(grouped))


def _pod_rows(grouped: dict[NodeKey, list[RunPlacement]]) -> tuple[tuple[str, ...], ...]:
    """One row per (run, host, namespace, pod) of the placements that name a pod (Kubernetes),
    in labels.POD_INFO_LABELS order; the first source to report a pod names it."""
    rows: dict[tuple[str, ...], str] = {}
    for (run, host), group in sorted(grouped.items()):
        for p in group:
            extra = dict(p.extra)
            namespace, pod = extra.get(labels.NAMESPACE, ""), extra.get(labels.POD, "")
            if namespace and pod:
                rows.setdefault((run.entity, run.project, run.run_id, host, namespace, pod),
                                p.source)
    return tuple((*key, source) for key, source in rows.items())


def _keep_gpu_labels(previous: tuple[Gpu, ...], merged: tuple[Gpu, ...]) -> tuple[Gpu, ...]:
    """``merged``, but a GPU already published (same index or same UUID) keeps its old labels."""
    if not previous:
        return merged
    by_index = {g.index: g for g in previous if g.index}
    by_uuid = {g.uuid: g for g in previous if g.uuid}
    out = [by_index.get(g.index) or by_uuid.get(g.uuid) or g for g in merged]
    return tuple(dict.fromkeys(out))


def _node_values(node_key: NodeKey, group: list[RunPlacement]) -> tuple[str, ...]:
    """Labels for a new (run, host): the first placement's source; other fields from any source."""
    run, host = node_key
    first = group[0]
    values = {
        labels.ENTITY: run.entity, labels.PROJECT: run.project, labels.RUN_ID: run.run_id,
        labels.HOSTNAME: host, labels.SOURCE: first.source,
        labels.RUN_NAME: next((p.run_name for p in group if p.run_name), ""),
    }
    for p in group:
        for name, value in p.extra:
            if value and not values.get(name):
                values[name] = value
    return tuple(values.get(name, "") for name in labels.NODE_INFO_LABELS)
