"""The edge of bridge/diagnosis/impact.py: the run's GPU signals around each issue, from Prometheus.

Per run, the join metrics once (as ``explain`` reads them); per issue, one range query holding
four series of one signal (mean over the affected GPUs, mean and max over the run's GPUs, their
count) through ``catalog.series.dcgm_gpu`` (both dcgm-exporter label spellings and field
generations). GPUs are selected per host, so a run holding GPUs 0-3 on one host and 4-7 on
another never reads another run's GPUs. Tensor activity first, then utilisation, then power.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from wandb_infra.bridge.diagnosis.impact import (
    AFTER,
    MAX_LEAD,
    Impact,
    Signals,
    measure,
    unmeasured,
)
from wandb_infra.bridge.diagnosis.root_cause import Diagnosis, Issue
from wandb_infra.bridge.prometheus.client import PrometheusClient, PrometheusError, regex_literal
from wandb_infra.bridge.prometheus.history import Placement, find_placement
from wandb_infra.catalog import series as S
from wandb_infra.catalog.series import Field
from wandb_infra.common.runkey import RunKey

log = logging.getLogger(__name__)

POINTS = 1500  # samples per series and query: 1 s steps over 25 minutes
DOWN_BACKOFF = 30.0
# A run whose join series have been absent this long has ended (two scrapes at the recommended
# 30 s), or four query steps when those are coarser.
RUN_GONE_SECONDS = 60.0
FIELDS: tuple[tuple[str, Field], ...] = (("tensor activity", S.DCGM_TENSOR_ACTIVE),
                                         ("GPU utilisation", S.DCGM_GPU_UTIL),
                                         ("power", S.DCGM_POWER_USAGE))


def _gpu_re(gpus: set[str] | frozenset[str]) -> str:
    return "|".join(regex_literal(g) for g in sorted(gpus)) or ".*"


def run_selector(field: Field, placement: Placement) -> str:
    """The run's own GPUs of ``field``: one ``dcgm_gpu`` selector per set of GPU indices, over the
    hosts holding exactly that set (a host the join metrics list no GPUs for: all of its GPUs)."""
    by_gpus: dict[frozenset[str], list[str]] = {}
    for host in sorted(placement.hosts | set(placement.gpus)):
        by_gpus.setdefault(frozenset(placement.gpus.get(host, frozenset())), []).append(host)
    return " or ".join(
        S.dcgm_gpu(field, "|".join(regex_literal(h) for h in hosts), _gpu_re(gpus))
        for gpus, hosts in sorted(by_gpus.items(), key=lambda kv: kv[1]))


def _points(series: Mapping[str, Any]) -> list[tuple[float, float]]:
    return [(float(t), float(v)) for t, v in series["values"]]


def affected_gpus(issue: Issue, placement: Placement) -> tuple[str, frozenset[str]]:
    """The root cause's host and the GPUs of it the run holds (all of them when the root names
    none, or names GPUs the join metrics do not list)."""
    host = issue.root.hostname
    held = placement.gpus.get(host, frozenset())
    named = frozenset(f.gpu for f in (issue.root, *issue.peers) if f.gpu)
    return host, (named & held if named & held else held or named)


class ImpactHistory:
    """Reads and measures; every failure becomes an ``unmeasured`` impact, never an error. Only
    the worker measures (on its schedule; pages read what it stored), so nothing is cached."""

    def __init__(self, prom: PrometheusClient, *, min_step: float = 1.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.prom, self.min_step, self.clock = prom, min_step, clock
        self._down_until = 0.0

    def for_diagnosis(self, run: RunKey, diagnosis: Diagnosis,
                      state: str | None = None) -> dict[str, Impact] | None:
        """Issue key -> measured impact; None while Prometheus is down (callers keep showing
        the catalog's text). ``state`` is the run's W&B state when known: a run W&B says
        finished did not crash."""
        if not diagnosis.issues:
            return {}
        now = self.clock()
        if now < self._down_until:
            return None
        try:
            return self.measure(run, diagnosis, now, state)
        except PrometheusError as exc:
            log.warning("impact not measured", extra={"error": str(exc)})
            self._down_until = now + DOWN_BACKOFF
            return None

    def measure(self, run: RunKey, diagnosis: Diagnosis, now: float,
                state: str | None = None) -> dict[str, Impact]:
        """Read and measure every issue of the run (PrometheusError when Prometheus fails)."""
        first = min(i.root.onset.timestamp() for i in diagnosis.issues) - MAX_LEAD
        step = max(self.min_step, (now - first) / 10_000)
        try:
            placement = find_placement(self.prom, run, first, now, step)
        except PrometheusError as exc:
            if "no wandb_run_node_info" not in str(exc):
                raise
            return {i.key: unmeasured("the join metrics do not place the run on any host",
                                      i.root.onset.timestamp()) for i in diagnosis.issues}
        gone = now - max(RUN_GONE_SECONDS, 4 * self.min_step)
        run_end = placement.last_seen if placement.last_seen < gone else None
        out: dict[str, Impact] = {}
        for issue in diagnosis.issues:
            earlier = [i.ended_at.timestamp() for i in diagnosis.issues
                       if i.ended_at is not None and i.ended_at <= issue.root.onset]
            not_before = max([placement.first_seen, *earlier])
            out[issue.key] = self._issue(issue, placement, not_before, run_end, now,
                                         state=state)
        return out

    def _issue(self, issue: Issue, placement: Placement, not_before: float,
               run_end: float | None, now: float, *, state: str | None) -> Impact:
        onset, fired = issue.root.onset.timestamp(), issue.root.starts_at.timestamp()
        ended = None if issue.ended_at is None else issue.ended_at.timestamp()
        start = max(not_before, onset - MAX_LEAD)
        end = min(now, max(fired + AFTER, ended or now))
        if run_end is not None:
            end = min(end, run_end + 60.0)
        step = max(self.min_step, (end - start) / POINTS)
        host, affected = affected_gpus(issue, placement)
        where = issue.where if issue.root.hostname else "the run's GPUs"
        for name, field in FIELDS:
            mine = S.dcgm_gpu(field, regex_literal(host), _gpu_re(affected))
            run_gpus = run_selector(field, placement)
            parts = {"affected": f"avg({mine})", "mean": f"avg({run_gpus})",
                     "max": f"max({run_gpus})", "count": f"count({run_gpus})"}
            expr = " or ".join(f'label_replace({q}, "part", "{p}", "", "")'
                               for p, q in parts.items())
            got = {s["metric"].get("part", ""): s for s in self.prom.range(expr, start, end, step)}
            if "mean" not in got:
                continue
            held = sum(len(g) for g in placement.gpus.values())
            counted = max((v for _, v in _points(got["count"])), default=0.0) \
                if "count" in got else 0.0
            signals = Signals(name, where, _points(got["affected"]) if "affected" in got else [],
                              _points(got["mean"]), _points(got.get("max") or got["mean"]),
                              held or int(counted), not_before, run_end, state)
            return measure(signals, onset=onset, fired=fired, ended=ended, now=now)
        return unmeasured("dcgm-exporter has no tensor activity, utilisation or power series "
                          "for the run's GPUs", onset)
