"""The verdict every ended run gets: infrastructure, clear or incomplete. Pure.

Why: "no alert" is not an answer. A run with an issue is **infrastructure** (its headline, as
the notes already say); a run without one is **clear** only when its telemetry was complete for
its whole life (diagnosis/coverage.py), and **incomplete** otherwise, naming what was not seen, so a
blind host is never read as healthy. An alert that says telemetry is missing (the catalog's
``telemetry`` group: one exporter down on a live node) is such a window, not a fault. The same
text goes to W&B (summary and notes), the run page and ``explain``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from wandb_infra.bridge.diagnosis.coverage import WHAT, Blind, Coverage
from wandb_infra.bridge.diagnosis.root_cause import Diagnosis, Issue
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.catalog.series import TARGET_LABEL

INFRASTRUCTURE = "infrastructure"
CLEAR = "clear"
INCOMPLETE = "incomplete"
TELEMETRY = "telemetry"  # the catalog's group of alerts that say telemetry is missing
VERDICTS = (INFRASTRUCTURE, CLEAR, INCOMPLETE)
MAX_SUMMARY_TEXT = 1000


@dataclass(frozen=True)
class Outcome:
    """An ended run's verdict, its one-sentence reason and what was seen of it."""

    verdict: str
    text: str
    ended_at: float
    how: str  # what said the run ended: "join series gone", "W&B state crashed"
    coverage: Coverage | None  # None: Prometheus no longer holds the run's placement

    @property
    def coverage_line(self) -> str:
        """The "seen through" line (or why there is none)."""
        if self.coverage is None:
            return "seen through: nothing (the run's hosts are no longer in Prometheus)"
        return self.coverage.line()

    def summary(self) -> dict[str, Any]:
        """Summary keys for the W&B runs table (written once the run is not running)."""
        return {"infra/verdict": self.verdict,
                "infra/verdict_reason": self.text[:MAX_SUMMARY_TEXT],
                "infra/coverage": self.coverage_line[:MAX_SUMMARY_TEXT],
                "infra/blind_windows": 0 if self.coverage is None
                else len(self.coverage.blind)}

    def as_dict(self) -> dict[str, Any]:
        """JSON shape (store, pages, ``explain --json``)."""
        return {"verdict": self.verdict, "text": self.text, "ended_at": self.ended_at,
                "how": self.how, "coverage_line": self.coverage_line,
                "coverage": None if self.coverage is None else self.coverage.as_dict()}

    def dumps(self) -> str:
        """As stored."""
        return json.dumps(self.as_dict(), sort_keys=True)

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Outcome:
        """Inverse of ``as_dict``."""
        cov = data.get("coverage")
        return Outcome(str(data["verdict"]), str(data["text"]), float(data["ended_at"]),
                       str(data.get("how", "")), None if cov is None else Coverage.from_dict(cov))

    @staticmethod
    def loads(text: str) -> Outcome:
        """Inverse of ``dumps``."""
        return Outcome.from_dict(json.loads(text))


def telemetry_gap(issue: Issue, ended_at: float) -> Blind | None:
    """The window an issue of the catalog's ``telemetry`` group says nobody saw (None for any
    other issue)."""
    root = issue.root
    known = ALERTS.get(root.alertname)
    if known is None or known.group != TELEMETRY:
        return None
    end = ended_at if root.ends_at is None else min(ended_at, root.ends_at.timestamp())
    return Blind(root.hostname or "unknown host",
                 WHAT.get(root.labels.get(TARGET_LABEL, ""), "telemetry"),
                 root.onset.timestamp(), max(end, root.onset.timestamp()))


def judge(diagnosis: Diagnosis, coverage: Coverage | None, ended_at: float,
          how: str) -> Outcome:
    """The verdict: any fault makes it infrastructure; without one, clear only with complete
    coverage (telemetry-gap alerts count as gaps)."""
    gaps = {i.key: telemetry_gap(i, ended_at) for i in diagnosis.issues}
    head = next((i for i in diagnosis.ranked if gaps[i.key] is None), None)
    if head is not None:
        return Outcome(INFRASTRUCTURE, head.title, ended_at, how, coverage)
    if coverage is not None:
        seen = {(b.host, b.what) for b in coverage.blind}  # the reading's windows come first
        coverage = replace(coverage, blind=(*coverage.blind, *(
            b for b in gaps.values() if b is not None and (b.host, b.what) not in seen)))
    if coverage is None:
        return Outcome(INCOMPLETE, "no record in Prometheus of the run's hosts and GPUs over "
                       "its lifetime (retention, or the exporter's series are gone): a fault "
                       "would not have been seen", ended_at, how, None)
    if coverage.complete:
        return Outcome(CLEAR, f"no GPU, node or link fault on its {coverage.where()} "
                       f"{coverage.span()}; GPU and host telemetry present throughout: likely "
                       "an application problem", ended_at, how, coverage)
    shown = "; ".join(b.text(coverage.start) for b in coverage.blind[:5])
    more = len(coverage.blind) - 5
    if more > 0:
        shown += f"; and {more} more window(s)"
    return Outcome(INCOMPLETE, f"no GPU, node or link fault seen on its {coverage.where()} "
                   f"{coverage.span()}, but {shown}: a fault there would not have been seen",
                   ended_at, how, coverage)
