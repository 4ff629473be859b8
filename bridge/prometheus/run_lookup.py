"""Which runs the join metrics put on a host (and GPU) at a moment: attribution for alerts
that carry no run labels (the rules attribute the others in PromQL). Never raises: when
Prometheus cannot answer, the lookup says ``[]`` and the alert stays unattributed."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from wandb_infra.bridge.prometheus.client import PrometheusClient, PrometheusError, quote
from wandb_infra.common import labels as L
from wandb_infra.common.runkey import RunKey

log = logging.getLogger(__name__)


class PrometheusRunLookup:
    """Asks Prometheus which runs were on a host (and GPU) at a moment, via the join metrics."""

    def __init__(self, client: PrometheusClient) -> None:
        self.client = client

    def runs_at(self, hostname: str, gpu: str, at: datetime) -> list[RunKey]:
        """Runs on ``hostname`` (and ``gpu`` when given and known) at ``at``; [] on any error."""
        if not hostname:
            return []
        if gpu:
            expr = (f"max by ({L.ENTITY},{L.PROJECT},{L.RUN_ID}) "
                    f"({L.GPU_INFO}{{{L.HOSTNAME}={quote(hostname)},{L.GPU}={quote(gpu)}}})")
            found = self._query(expr, at)
            if found:
                return found
        expr = (f"max by ({L.ENTITY},{L.PROJECT},{L.RUN_ID}) "
                f"({L.NODE_INFO}{{{L.HOSTNAME}={quote(hostname)}}})")
        return self._query(expr, at)

    def _vector(self, expr: str, at: datetime, what: str) -> list[dict[str, Any]] | None:
        """An instant query's result at ``at``; None (logged) when Prometheus cannot answer."""
        try:
            return self.client.instant(expr, at.timestamp())
        except PrometheusError as exc:
            log.warning("prometheus %s failed: %s", what, str(exc)[:200])
            return None

    def _query(self, expr: str, at: datetime) -> list[RunKey]:
        result = self._vector(expr, at, "run lookup")
        if result is None:
            return []
        keys = []
        for series in result:
            metric = series.get("metric", {})
            key = RunKey(metric.get(L.ENTITY, ""), metric.get(L.PROJECT, ""),
                         metric.get(L.RUN_ID, ""))
            if key.attributed:
                keys.append(key)
        return sorted(set(keys))
