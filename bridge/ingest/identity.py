"""Which W&B run (and which host/GPU) an alert is about.

Identity is read from each alert with configurable JSONPath expressions (defaults: the contract-2
labels), never from ``commonLabels``, which Alertmanager computes over the alerts it kept after
``max_alerts`` truncation. Alerts without run labels can optionally be attributed by asking
Prometheus which runs were on that host/GPU at ``startsAt`` (the exporter's join metrics).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

import requests
from jsonpath_ng import parse as jsonpath_parse
from jsonpath_ng.exceptions import JsonPathParserError

from wandb_infra.common import labels as L
from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.runkey import RunKey

log = logging.getLogger(__name__)

DEFAULT_PATHS: dict[str, str] = {
    "entity": f"$.labels.{L.ENTITY}",
    "project": f"$.labels.{L.PROJECT}",
    "run_id": f"$.labels.{L.RUN_ID}",
    "hostname": f"$.labels.{L.HOSTNAME}",
    "gpu": f"$.labels.{L.GPU}",
}


UNATTRIBUTED = RunKey()


class Identity(NamedTuple):
    """Where an alert happened and which run it hit (a tuple: built once per alert of a
    storm, and a frozen dataclass costs three times as much)."""

    run: RunKey
    hostname: str
    gpu: str


_PARTS = ("entity", "project", "run_id", "hostname", "gpu")
_SIMPLE = re.compile(r"^\$((?:\.[A-Za-z_][A-Za-z0-9_]*|\['[^'\\]*'\])+)$")
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\['([^'\\]*)'\]")


def simple_keys(expr: str) -> tuple[str, ...] | None:
    """``$.a.b`` / ``$['a']['b']`` as a key tuple (a fast dict walk), else None."""
    m = _SIMPLE.match(expr.strip())
    if not m:
        return None
    return tuple(a or b for a, b in _STEP.findall(m.group(1)))


def _text(value: object) -> str:
    """A label value as text: strings (UTF-8-encodable) and integers, "" for anything else."""
    if type(value) is str:
        if value.isascii():
            return value
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return ""
        return value
    if type(value) is int:
        return str(value)
    return ""


def _walk(alert: dict[str, Any], path: tuple[str, ...]) -> str:
    """The text at ``path`` (dict keys) in ``alert``; the two-step path of every default is
    unrolled, since it runs five times per alert of a storm."""
    if len(path) == 2:
        inner = alert.get(path[0])
        return _text(inner.get(path[1])) if type(inner) is dict else ""
    value: Any = alert
    for part in path:
        if type(value) is not dict:
            return ""
        value = value.get(part)
    return _text(value)


class IdentityReader:
    """Applies the configured JSONPath expressions to one alert (its raw JSON object).

    Plain child paths (the defaults) are walked as dict lookups, which gives the same answer as
    jsonpath-ng at a fraction of the cost on a 1,536-alert notification; anything else goes
    through jsonpath-ng.
    """

    def __init__(self, paths: dict[str, str] | None = None) -> None:
        merged = {**DEFAULT_PATHS, **(paths or {})}
        unknown = sorted(set(merged) - set(DEFAULT_PATHS))
        if unknown:
            raise ConfigError(f"identity: unknown keys {', '.join(unknown)}")
        self._compiled = {}
        self._simple = {key: simple_keys(expr) for key, expr in merged.items()}
        for key, expr in merged.items():
            try:
                self._compiled[key] = jsonpath_parse(expr)
            except (JsonPathParserError, Exception) as exc:
                raise ConfigError(f"identity.{key}: invalid JSONPath {expr!r}: {exc}") from exc

    def _first(self, key: str, alert: dict[str, Any]) -> str:
        path = self._simple[key]
        if path is not None:
            return _walk(alert, path)
        for match in self._compiled[key].find(alert):
            value = _text(match.value)
            if value:
                return value
        return ""

    def read(self, alert: dict[str, Any]) -> Identity:
        """The run (possibly unattributed), hostname and GPU of a raw alert object."""
        run = RunKey(self._first("entity", alert), self._first("project", alert),
                     self._first("run_id", alert))
        if not run.attributed:
            run = UNATTRIBUTED
        return Identity(run, self._first("hostname", alert), self._first("gpu", alert))

    def read_all(self, alerts: Sequence[dict[str, Any]]) -> list[Identity]:
        """``read`` of every alert, one part at a time across them (a storm's notification has
        thousands), with one RunKey per distinct run."""
        entities, projects, run_ids, hostnames, gpus = (self._column(key, alerts)
                                                        for key in _PARTS)
        keys = list(zip(entities, projects, run_ids, strict=True))
        runs = {key: RunKey(*key) if all(key) else UNATTRIBUTED for key in set(keys)}
        return list(map(Identity._make, zip(map(runs.__getitem__, keys), hostnames, gpus,
                                            strict=True)))

    def _column(self, key: str, alerts: Sequence[dict[str, Any]]) -> list[str]:
        """``_first(key, alert)`` of every alert; the two-step path of every default inlined."""
        path = self._simple[key]
        if path is not None and len(path) == 2:
            outer, inner = path
            return [_text(value.get(inner)) if type(value := alert.get(outer)) is dict else ""
                    for alert in alerts]
        return [self._first(key, alert) for alert in alerts]


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class PrometheusRunLookup:
    """Asks Prometheus which runs were on a host (and GPU) at a moment, via the join metrics."""

    def __init__(self, base_url: str, timeout: float = 5.0,
                 session: requests.Session | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = session or requests.Session()

    def runs_at(self, hostname: str, gpu: str, at: datetime) -> list[RunKey]:
        """Runs on ``hostname`` (and ``gpu`` when given and known) at ``at``; [] on any error."""
        if not hostname:
            return []
        if gpu:
            expr = (f"max by ({L.ENTITY},{L.PROJECT},{L.RUN_ID}) "
                    f"({L.GPU_INFO}{{{L.HOSTNAME}={_quote(hostname)},{L.GPU}={_quote(gpu)}}})")
            found = self._query(expr, at)
            if found:
                return found
        expr = (f"max by ({L.ENTITY},{L.PROJECT},{L.RUN_ID}) "
                f"({L.NODE_INFO}{{{L.HOSTNAME}={_quote(hostname)}}})")
        return self._query(expr, at)

    def placed(self, run: RunKey, hostname: str, at: datetime) -> bool | None:
        """Whether the join metrics put ``run`` on ``hostname`` at ``at`` (Prometheus' lookback
        before it); None when Prometheus cannot answer. Alert labels are untrusted: a run is
        written only where the exporter placed it."""
        expr = (f"count({L.NODE_INFO}{{{L.ENTITY}={_quote(run.entity)},"
                f"{L.PROJECT}={_quote(run.project)},{L.RUN_ID}={_quote(run.run_id)},"
                f"{L.HOSTNAME}={_quote(hostname)}}})")
        result = self._vector(expr, at, "placement check")
        return None if result is None else bool(result)

    def _vector(self, expr: str, at: datetime, what: str) -> list[dict] | None:
        """An instant query's result at ``at``; None (logged) when Prometheus cannot answer."""
        try:
            resp = self.session.get(f"{self.base_url}/api/v1/query",
                                    params={"query": expr, "time": f"{at.timestamp():.3f}"},
                                    timeout=self.timeout)
            body = resp.json()
        except (requests.RequestException, ValueError) as exc:
            log.warning("prometheus %s failed: %s", what, type(exc).__name__)
            return None
        if body.get("status") != "success":
            log.warning("prometheus %s failed: %s", what, str(body.get("error"))[:200])
            return None
        return list(body.get("data", {}).get("result", []))

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
