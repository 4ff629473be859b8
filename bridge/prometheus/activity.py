"""The run's GPU activity over its incident window, for the run page's plot: tensor-pipe
activity (an MFU proxy) and utilisation averaged over the run's GPUs (from the join metrics, as
``explain`` reads them). The worker stores it as evidence, so a page never asks Prometheus; a
failure becomes the note the page shows instead of a plot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wandb_infra.bridge.diagnosis.root_cause import Issue
from wandb_infra.bridge.diagnosis.verdict import clock
from wandb_infra.bridge.prometheus.client import PrometheusClient, PrometheusError, regex_literal
from wandb_infra.bridge.prometheus.history import find_placement
from wandb_infra.catalog import series as S
from wandb_infra.common.runkey import RunKey

POINTS = 240  # samples per series: enough for a 1,100 px plot
MIN_PAD = 120.0  # seconds of context before and after the incident
OPEN_TAIL = 1800.0  # an open issue is plotted up to this long after its last alert began
_FIELDS = (("tensor activity", S.DCGM_TENSOR_ACTIVE), ("GPU utilisation", S.DCGM_GPU_UTIL))

Series = tuple[str, tuple[tuple[float, float], ...]]


@dataclass(frozen=True)
class Activity:
    """Mean activity ratios (0..1) of the run's GPUs over [start, end], or why there are none
    (``note``), read at ``read_at``."""

    read_at: float
    start: float
    end: float
    series: tuple[Series, ...] = ()
    gpus: int = 0
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        """As stored."""
        return {"read_at": self.read_at, "start": self.start, "end": self.end, "gpus": self.gpus,
                "note": self.note, "series": [[n, [list(p) for p in ps]] for n, ps in self.series]}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Activity:
        """Inverse of ``as_dict``."""
        return Activity(float(data["read_at"]), float(data["start"]), float(data["end"]),
                        tuple((str(n), tuple((float(t), float(v)) for t, v in ps))
                              for n, ps in data["series"]), int(data["gpus"]), str(data["note"]))


def window(issues: Sequence[Issue], now: float) -> tuple[float, float]:
    """[start, end] around the run's issues, padded on both sides. An open issue runs to now,
    but at most ``OPEN_TAIL`` past its last alert's onset, so a days-old open issue does not
    squash the drop into a few pixels."""
    lo = min(i.started_at.timestamp() for i in issues)
    hi = lo
    for issue in issues:
        if issue.ended_at is not None:
            hi = max(hi, issue.ended_at.timestamp())
        else:
            last = max(f.onset.timestamp() for f in (issue.root, *issue.consequences))
            hi = max(hi, min(now, last + OPEN_TAIL))
    pad = max(MIN_PAD, (hi - lo) * 0.25)
    return lo - pad, max(lo, min(now, hi + pad))


def read(prom: PrometheusClient, run: RunKey, issues: Sequence[Issue], now: float) -> Activity:
    """The run's activity around ``issues`` as Prometheus holds it now."""
    start, end = window(issues, now)
    step = max(1.0, (end - start) / POINTS)
    try:
        placement = find_placement(prom, run, start, end, step)
        hosts = "|".join(regex_literal(h) for h in sorted(placement.hosts))
        # One GPU regex for all hosts (the union of the run's GPU indices): a run holds the
        # same GPUs on every host in practice; unknown GPUs mean all of the host's.
        gpus = sorted({g for gs in placement.gpus.values() for g in gs})
        gpu_re = "|".join(regex_literal(g) for g in gpus) or ".*"
        out = []
        for name, field in _FIELDS:
            found = prom.range(f"avg({S.dcgm_gpu(field, hosts, gpu_re)})", start, end, step)
            if found:
                out.append((name, tuple((float(t), float(v)) for t, v in found[0]["values"])))
    except PrometheusError as exc:
        return Activity(now, start, end, note=f"No GPU activity plot: {exc}")
    if not out:
        return Activity(now, start, end, note=(
            "No GPU activity plot: dcgm-exporter has no tensor activity or utilisation series "
            f"for the run's hosts between {clock(start)} and {clock(end)}."))
    return Activity(now, start, end, tuple(out), sum(len(g) for g in placement.gpus.values()))
