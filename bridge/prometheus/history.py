"""Post-mortem: explain a run from Prometheus history, before or without the live bridge.

Most crashed runs happened before anyone installed the bridge, but Prometheus kept what the rules
concluded: ``ALERTS`` (with run labels, since the rules attribute faults to runs themselves) and the
join metrics over the run's lifetime. ``explain`` reads both with range queries, rebuilds the alerts
(start and end of every firing period), runs the same ``diagnose`` as the bridge and prints the
timeline with the root cause. ``--post`` stores the rebuilt alerts and delivers them to W&B through
the bridge's own store and delivery worker, so W&B shows exactly what the live bridge would have.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from wandb_infra.bridge.diagnosis.root_cause import AlertFact
from wandb_infra.bridge.ingest.payload import Alert, Notification
from wandb_infra.bridge.prometheus.client import (
    PrometheusClient,
    PrometheusError,
    quote,
    regex_literal,
)
from wandb_infra.catalog import panels as P
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.common import labels as L
from wandb_infra.common.runkey import RunKey

MAX_POINTS = 10_000  # Prometheus refuses range queries over 11,000 points per series
_TEMPLATE = re.compile(r"\{\{\s*\$labels\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_RUN_PATH = re.compile(r"^([^/\s]+)/([^/\s]+)/([^/\s]+)$")


def parse_run(text: str) -> RunKey:
    """``ENTITY/PROJECT/RUN_ID`` -> RunKey, or ValueError with the expected shape."""
    match = _RUN_PATH.match(text.strip())
    if not match:
        raise ValueError(f"expected ENTITY/PROJECT/RUN_ID, got {text!r}")
    return RunKey(*match.groups())


def _selector(run: RunKey) -> str:
    """The run's join-series matchers. ``quote``, not ``json.dumps``: JSON escapes a character
    outside the Basic Multilingual Plane as a surrogate pair, which PromQL refuses, so a run
    whose entity or project held an emoji never got a placement or a verdict."""
    return (f"{L.ENTITY}={quote(run.entity)},{L.PROJECT}={quote(run.project)},"
            f"{L.RUN_ID}={quote(run.run_id)}")


def pick_step(start: float, end: float, minimum: float) -> float:
    """The finest step (>= ``minimum``) that keeps a range query under Prometheus' point limit."""
    return max(minimum, (end - start) / MAX_POINTS)


@dataclass(frozen=True)
class Placement:
    """Where the run ran, and when Prometheus saw it: hosts, GPUs per host, lifetime."""

    hosts: frozenset[str]
    gpus: Mapping[str, frozenset[str]]
    first_seen: float
    last_seen: float


def find_placement(prom: PrometheusClient, run: RunKey, start: float, end: float,
                   min_step: float) -> Placement:
    """The run's hosts and GPUs over [start, end] from the join metrics."""
    step = pick_step(start, end, min_step)
    nodes = prom.range(f"max by ({L.HOSTNAME}) ({L.NODE_INFO}{{{_selector(run)}}})",
                       start, end, step)
    if not nodes:
        raise PrometheusError(f"no {L.NODE_INFO} series for {run.path()} between "
                           f"{_iso(start)} and {_iso(end)}: the exporter never saw this run "
                           f"there (widen --start/--end?)")
    gpu_series = prom.range(f"max by ({L.HOSTNAME}, {L.GPU}) ({L.GPU_INFO}{{{_selector(run)}}})",
                            start, end, step)
    gpus: dict[str, set[str]] = {}
    for series in gpu_series:
        metric = series["metric"]
        if metric.get(L.GPU):
            gpus.setdefault(metric.get(L.HOSTNAME, ""), set()).add(metric[L.GPU])
    stamps = [float(ts) for series in nodes for ts, _ in series["values"]]
    return Placement(frozenset(s["metric"].get(L.HOSTNAME, "") for s in nodes),
                     {h: frozenset(g) for h, g in gpus.items()}, min(stamps), max(stamps))


def _segments(values: list[list[Any]], step: float) -> list[tuple[float, float]]:
    """Contiguous runs of samples: a gap of more than 1.5 steps ends a firing period."""
    out: list[tuple[float, float]] = []
    for ts_raw, _ in values:
        ts = float(ts_raw)
        if out and ts - out[-1][1] <= 1.5 * step:
            out[-1] = (out[-1][0], ts)
        else:
            out.append((ts, ts))
    return out


def fingerprint(labels: Mapping[str, str], starts_at: float) -> str:
    """A stable 16-hex id for a rebuilt alert (its label set and when it started)."""
    text = json.dumps(sorted(labels.items())) + f"@{starts_at:.0f}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def catalog_annotations(labels: Mapping[str, str]) -> dict[str, str]:
    """What the rule's annotations said, from the catalog (ALERTS keeps no annotations).

    Label templates are filled in; a description that depends on the measured value falls back
    to the static summary, since the value is not in ``ALERTS``."""
    known = ALERTS.get(labels.get("alertname", ""))
    if known is None:
        return {}
    description = known.summary if "$value" in known.description else known.description
    description = _TEMPLATE.sub(lambda m: labels.get(m.group(1), ""), description)
    return {"summary": known.summary, "description": description, "impact": known.impact,
            "remediation": known.remediation,
            **P.link_annotations(known.scope, known.panel, known.for_seconds)}


def _belongs(labels: Mapping[str, str], run: RunKey, placement: Placement) -> bool:
    if labels.get(L.RUN_ID):
        return (labels.get(L.ENTITY), labels.get(L.PROJECT), labels.get(L.RUN_ID)) == (
            run.entity, run.project, run.run_id)
    host = labels.get(L.HOSTNAME, "")
    if host not in placement.hosts:
        return False
    gpu, known = labels.get(L.GPU, ""), placement.gpus.get(host)
    return not (gpu and known and gpu not in known)


def rebuild_alerts(prom: PrometheusClient, run: RunKey, placement: Placement, start: float,
                   end: float, *, min_step: float) -> list[Alert]:
    """Every firing period of an alert that hit the run (attributed, or on its hosts/GPUs)."""
    step = pick_step(start, end, min_step)
    hosts = "|".join(regex_literal(h) for h in sorted(placement.hosts))
    series = prom.range(f'ALERTS{{alertstate="firing",{_selector(run)}}}', start, end, step)
    series += prom.range(f'ALERTS{{alertstate="firing",{L.RUN_ID}="",{L.HOSTNAME}=~"{hosts}"}}',
                         start, end, step)
    alerts: list[Alert] = []
    for item in series:
        labels = {k: v for k, v in item["metric"].items() if k not in ("__name__", "alertstate")}
        if not _belongs(labels, run, placement):
            continue
        annotations = catalog_annotations(labels)
        for first, last in _segments(item["values"], step):
            firing = last >= end - 1.5 * step
            starts = datetime.fromtimestamp(first, UTC)
            ends = None if firing else datetime.fromtimestamp(last + step, UTC)
            status, key = "firing" if firing else "resolved", fingerprint(labels, first)
            alerts.append(Alert(key, status, starts, ends, labels, annotations))
    alerts.sort(key=lambda a: (a.starts_at, a.alertname, a.fingerprint))
    return alerts


def as_facts(alerts: Iterable[Alert]) -> list[AlertFact]:
    """The diagnosis' view of rebuilt alerts."""
    return [AlertFact(a.fingerprint, a.alertname, a.starts_at, a.ends_at,
                      a.labels.get("severity", ""), a.labels.get("category", ""),
                      a.labels.get(L.HOSTNAME, ""), a.labels.get(L.GPU, ""), a.labels,
                      a.annotations) for a in alerts]


def as_notification(alerts: list[Alert]) -> Notification:
    """Rebuilt alerts as one notification, for the bridge's store."""
    return Notification("explain", "firing", alerts, "explain", 0)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def parse_when(text: str | None, now: float) -> float | None:
    """RFC 3339, a unix timestamp, or a duration ago such as ``6h``/``2d`` -> unix seconds."""
    if not text:
        return None
    if match := re.fullmatch(r"(\d+)([smhd])", text):
        return now - int(match[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match[2]]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"cannot read time {text!r}: use RFC 3339, unix seconds or e.g. 6h"
                         ) from exc
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


@dataclass(frozen=True)
class Explanation:
    """What ``explain`` found: placement, the window it read and the rebuilt alerts."""

    run: RunKey
    placement: Placement
    start: float
    end: float
    alerts: list[Alert]


def explain(prom: PrometheusClient, run: RunKey, start: float | None, end: float | None, *,
            lookback: timedelta = timedelta(days=7), margin: timedelta = timedelta(minutes=10),
            min_step: float = 15.0, now: float | None = None) -> Explanation:
    """Find the run's lifetime (unless given), then rebuild the alerts that hit it."""
    now = time.time() if now is None else now
    search_end = end if end is not None else now
    search_start = start if start is not None else search_end - lookback.total_seconds()
    if search_start >= search_end:
        raise ValueError("--start must be before --end")
    placement = find_placement(prom, run, search_start, search_end, min_step)
    window_start = start if start is not None else placement.first_seen - margin.total_seconds()
    window_end = end if end is not None else min(now, placement.last_seen
                                                 + margin.total_seconds())
    alerts = rebuild_alerts(prom, run, placement, window_start, window_end, min_step=min_step)
    return Explanation(run, placement, window_start, window_end, alerts)
