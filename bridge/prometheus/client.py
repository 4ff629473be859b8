"""The bridge's one Prometheus client: one HTTP session, one timeout, one error type
(``PrometheusError``, naming Prometheus' own error, never the query's secrets). What a caller
does on failure (keep the last answer, back off, print the error) is that caller's policy.
"""

from __future__ import annotations

import re
from typing import Any

import requests


class PrometheusError(RuntimeError):
    """Prometheus did not answer, answered with an error, or has no trace of what was asked."""


class PrometheusClient:
    """Instant and range queries against Prometheus' HTTP API (``/api/v1/query[_range]``)."""

    def __init__(self, base_url: str, timeout: float = 5.0,
                 session: requests.Session | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = session or requests.Session()

    def instant(self, expr: str, at: float) -> list[dict[str, Any]]:
        """The result vector of ``expr`` evaluated at unix time ``at``."""
        return self._get("query", expr, {"time": f"{at:.3f}"})

    def now(self) -> float:
        """Prometheus' own clock: ``time()`` evaluated at its now (no ``time`` parameter)."""
        result = self._get("query", "time()", {})
        try:
            return float(result[1])  # type: ignore[arg-type]  # a scalar: [time, "value"]
        except (IndexError, TypeError, ValueError) as exc:
            raise PrometheusError(f"Prometheus at {self.base_url} answered time() without "
                                  "a time") from exc

    def range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """The result matrix of ``expr`` from ``start`` to ``end`` every ``step`` seconds."""
        return self._get("query_range", expr, {"start": f"{start:.3f}", "end": f"{end:.3f}",
                                               "step": f"{step:.3f}"})

    def _get(self, api: str, expr: str, params: dict[str, str]) -> list[dict[str, Any]]:
        try:
            resp = self.session.get(f"{self.base_url}/api/v1/{api}", timeout=self.timeout,
                                    params={"query": expr, **params})
            body = resp.json()
        except (requests.RequestException, ValueError) as exc:
            raise PrometheusError(f"Prometheus at {self.base_url} did not answer: "
                                  f"{type(exc).__name__}") from exc
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else "not a Prometheus answer"
            raise PrometheusError(f"Prometheus rejected {expr[:200]!r}: {str(error)[:200]}")
        result = body.get("data", {}).get("result") if isinstance(body.get("data"), dict) \
            else None
        if not isinstance(result, list):
            raise PrometheusError(f"Prometheus at {self.base_url} answered without a result")
        return result


def quote(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal (label values are untrusted)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def regex_literal(text: str) -> str:
    """``text`` as a literal inside a double-quoted PromQL regex (RE2 escapes, then the string
    literal's own backslash escaping)."""
    escaped = re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", text)
    return escaped.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
