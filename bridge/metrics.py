"""The bridge's own Prometheus metrics (prefix ``wandb_infra_bridge_``), one registry per app."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

PREFIX = "wandb_infra_bridge_"
MAX_PROJECTS = 200  # label sets on /metrics; later projects are summed as _other/_other
OTHER = "_other"
ALL = "_all"  # the only label value an unauthenticated scrape sees (PublicView)
GPU_HOURS_HELP = ("GPU-hours lost to infrastructure issues, summed over the project's runs in "
                  "the bridge's store (bridge/diagnosis/impact.py; a run leaves with its last "
                  "alert).")

ProjectHours = Iterable[tuple[str, str, float]]  # (entity, project, GPU-hours lost)


def project_totals(rows: ProjectHours) -> dict[tuple[str, str], float]:
    """Per-project totals with the first ``MAX_PROJECTS`` projects (in key order) labelled by
    name and the rest summed as ``_other``: the label sets on /metrics stay bounded."""
    totals: dict[tuple[str, str], float] = {}
    for entity, project, hours in sorted(rows):
        label = (entity, project)
        if label not in totals and len(totals) >= MAX_PROJECTS:
            label = (OTHER, OTHER)
        totals[label] = totals.get(label, 0.0) + hours
    return totals


class GpuHoursLost(Collector):
    """``gpu_hours_lost`` per project, read at each scrape from where the per-run figures are
    kept (the store), so it survives a restart; the last answer stands while the store fails."""

    def __init__(self) -> None:
        self.source: Callable[[], ProjectHours] | None = None
        self._last: dict[tuple[str, str], float] = {}

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(PREFIX + "gpu_hours_lost", GPU_HOURS_HELP,
                                 labels=["entity", "project"])

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The family's name, without reading the store."""
        yield self._family()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """One sample per project."""
        if self.source is not None:
            try:
                self._last = project_totals(self.source())
            except Exception:  # a failing store must not fail the whole scrape
                log.warning("GPU-hours lost not read from the store; last figures kept",
                            exc_info=True)
        family = self._family()
        for (entity, project), hours in self._last.items():
            family.add_metric([entity, project], round(hours, 3))
        yield family


class PublicView(CollectorRegistry):
    """The registry as an unauthenticated scrape sees it: entity and project names are the
    users' (what a W&B team works on), so ``gpu_hours_lost`` is one sum labelled ``_all``
    there; a scrape with the webhook's or the pages' credentials gets it per project."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(auto_describe=False)
        self.full = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.full.collect():
            if family.name != PREFIX + "gpu_hours_lost":
                yield family
                continue
            total = GaugeMetricFamily(family.name, family.documentation,
                                      labels=["entity", "project"])
            total.add_metric([ALL, ALL], round(sum(s.value for s in family.samples), 3))
            yield total


class BridgeMetrics:
    """Counters and gauges for ingest, storage, delivery and backlog; no label carries a secret."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=r)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(PREFIX + name, doc, registry=r)

        self.notifications = counter("notifications_total", "Webhook requests by outcome "
                                     "(stored, rejected reason, store_error).", "outcome")
        self.alerts_received = counter("alerts_received_total",
                                       "Alerts in accepted notifications.")
        self.alerts_stored = counter("alerts_stored_total", "Alerts stored for the first time.")
        self.alerts_resolved = counter("alerts_resolved_total",
                                       "Stored alerts closed by a resolved notification.")
        self.duplicates = counter("alerts_duplicate_total",
                                  "Alerts that changed nothing (repeats, HA duplicates).")
        self.connections_refused = counter("connections_refused_total", "Connections closed "
                                           "at once because listen.max_connections were open "
                                           "and busy.")
        self.connections_evicted = counter("connections_evicted_total", "Idle connections "
                                           "closed to make room for a new one at "
                                           "listen.max_connections.")
        self.inflight_bytes = gauge("inflight_body_bytes",
                                    "Announced bytes of webhook bodies being received or stored.")
        self.ack_seconds = Histogram(PREFIX + "ack_seconds",
                                     "Time from request to durable acknowledgement.",
                                     buckets=(.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5,
                                              5, 10), registry=r)
        self.deliveries = counter("deliveries_total", "Run projections to W&B by outcome (ok, "
                                  "transient, parked).", "outcome")
        self.delivery_errors = counter("delivery_errors_total", "Run projections that failed "
                                       "and parked the run, by error class (the reason is in "
                                       "/runs).", "error")
        self.wandb_calls = counter("wandb_calls_total", "GraphQL requests sent to W&B.")
        self.markers = counter("markers_written_total",
                               "History marker rows written with the wandb SDK.")
        self.queue_depth = gauge("queue_runs", "Runs with changes not yet delivered to W&B.")
        self.oldest_age = gauge("oldest_undelivered_seconds",
                                "Age of the oldest change not yet delivered to W&B.")
        self.parked = gauge("parked_runs", "Runs whose delivery failed permanently (see /runs).")
        self.last_success = gauge("last_wandb_success_timestamp_seconds",
                                  "Unix time of the last successful W&B write.")
        self.store_ok = gauge("store_writable", "1 when the last store write succeeded.")
        self.store_ok.set(1)
        self.audit_damaged = gauge("quarantine_audit_damaged_lines", "Lines of the quarantine "
                                   "audit log skipped as damaged (bad bytes, truncated) when it "
                                   "was read; the log names them.")
        self.audit_writable = gauge("quarantine_audit_writable", "0 while the quarantine audit "
                                    "log cannot be written (then nothing is quarantined: no "
                                    "record, no action).")
        self.audit_writable.set(1)
        self.gpu_hours = GpuHoursLost()
        r.register(self.gpu_hours)
        self.public = PublicView(r)
