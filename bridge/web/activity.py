"""The run's GPU activity over an incident window, from Prometheus, for the run page's plot.

The run's hosts and GPUs come from the join metrics (``wandb_run_node_info``/``wandb_run_gpu_info``,
as ``explain`` reads them); tensor-pipe activity (an MFU proxy) and GPU utilisation are read from
dcgm-exporter with the dashboards' selector (both host-label spellings, both field generations)
and averaged over those GPUs. Any failure becomes a note on the page, never an error: the page
must render while Prometheus is down.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from wandb_infra.bridge.prometheus.client import PrometheusClient, PrometheusError, regex_literal
from wandb_infra.bridge.prometheus.history import find_placement
from wandb_infra.bridge.web.timeline import onset, seconds
from wandb_infra.catalog import series as S
from wandb_infra.common.runkey import RunKey

POINTS = 240  # samples per series: enough for a 1,100 px plot
MIN_PAD = 120.0  # seconds of context before and after the incident
OPEN_TAIL = 1800.0  # an open issue is plotted up to this long after its last alert began
_FIELDS = (("tensor activity", S.DCGM_TENSOR_ACTIVE), ("GPU utilisation", S.DCGM_GPU_UTIL))


def window(issues: list[dict[str, Any]], now: float | None = None) -> tuple[float, float]:
    """[start, end] around the run's issues, padded on both sides. An open issue runs to now,
    but at most ``OPEN_TAIL`` past its last alert's onset, so a days-old open issue does not
    squash the drop into a few pixels."""
    now = time.time() if now is None else now
    lo = min(seconds(i["started_at"]) for i in issues)
    hi = lo
    for issue in issues:
        if issue.get("ended_at"):
            hi = max(hi, seconds(issue["ended_at"]))
        else:
            last = max(onset(f) for f in (issue["root_cause"], *issue["consequences"]))
            hi = max(hi, min(now, last + OPEN_TAIL))
    pad = max(MIN_PAD, (hi - lo) * 0.25)
    return lo - pad, max(lo, min(now, hi + pad))


def fetch(prom: PrometheusClient, run: RunKey, start: float, end: float) -> dict[str, Any]:
    """``{"series": [{"name", "points": [[t, ratio], ...]}], "start", "end", "gpus"}``, or
    ``{"note": why there is no plot}``."""
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
                out.append({"name": name, "points": [[float(t), float(v)]
                                                     for t, v in found[0]["values"]]})
    except PrometheusError as exc:
        return {"note": f"No GPU activity plot: {exc}"}
    if not out:
        return {"note": "No GPU activity plot: dcgm-exporter has no tensor activity or "
                        f"utilisation series for the run's hosts between {_iso(start)} and "
                        f"{_iso(end)}."}
    count = sum(len(g) for g in placement.gpus.values())
    return {"series": out, "start": start, "end": end, "gpus": count}


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
