"""What the bridge knows about one run, as one typed value every surface renders.

A ``RunView`` holds the run's facts split by what Prometheus confirmed, their diagnosis, each
issue's restart decision with the quarantine's decision, the measured impacts (computed by the
worker, with when), and the ended run's verdict. The W&B notes, tags and summary, the run page
(HTML and JSON), ``/runs`` and ``explain`` all render a view, so they cannot tell different
stories. Datetimes stay datetimes here; ``as_dict`` is the one JSON edge.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from wandb_infra.bridge.diagnosis.impact import (
    UNMEASURED,
    Impact,
    duration,
    hours_text,
    run_gpu_hours,
)
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.outcome import VERDICTS, Outcome
from wandb_infra.bridge.diagnosis.root_cause import AlertFact, Diagnosis, Issue
from wandb_infra.bridge.ingest.outbox import OutboxRow
from wandb_infra.bridge.joblog.join import Joined, join
from wandb_infra.bridge.joblog.reading import Reading
from wandb_infra.bridge.prometheus.activity import Activity
from wandb_infra.bridge.prometheus.remediation import Remediation, headline
from wandb_infra.catalog import runbook
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.common.runkey import RunKey

# What the pages need besides views (they import nothing from diagnosis or projection).
__all__ = ["UNMEASURED", "VERDICTS", "Activity", "AlertFact", "GrafanaLinks", "Impact", "Issue",
           "IssueView", "Joined", "LinkFn", "Outcome", "QuarantineView", "Reading", "Remediation",
           "RunRow", "RunView", "Unconfirmed", "duration", "hours_text", "runbook_url", "stamp",
           "when"]

LinkFn = Callable[[AlertFact, datetime, datetime | None], str]

# The quarantine's decision for an issue, by what the audit log says (actuator.Decision).
ACTED, REFUSED, DRY_RUN, FAILED, NOT_NEEDED, UNDECIDED = (
    "acted", "refused", "dry run", "failed", "not needed", "not decided yet")
_OUTCOMES = {"done": ACTED, "already_out": ACTED, "acting": ACTED, "dry_run": DRY_RUN,
             "refused": REFUSED, "failed": FAILED}


def stamp(value: datetime | None) -> str | None:
    """The one JSON time format: RFC 3339 UTC with ``Z``."""
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def when(value: datetime | float) -> str:
    """``2026-11-29 12:00:40 UTC`` (to the second): how the pages show a time."""
    at = value if isinstance(value, datetime) else datetime.fromtimestamp(value, UTC)
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def runbook_url(fact: AlertFact) -> str:
    """The bridge's own runbook entry for the alert, never a URL the alert carries (labels and
    annotations can be forged through Alertmanager's API); "" outside the catalog."""
    return f"{runbook.PATH}#{runbook.anchor(fact.alertname)}" if fact.alertname in ALERTS else ""


@dataclass(frozen=True)
class QuarantineView:
    """What the quarantine decided for an issue: one of the states above and its text."""

    state: str
    text: str

    @staticmethod
    def of(decisions: list[tuple[str, str]], rem: Remediation | None) -> QuarantineView:
        """From the audit log's (outcome, text) lines for the issue and its restart decision."""
        if decisions:
            return QuarantineView(_OUTCOMES.get(decisions[-1][0], decisions[-1][0]),
                                  "; ".join(text for _, text in decisions))
        if rem is None or not rem.drain:
            needs = f": the fault needs {rem.needs}" if rem is not None and rem.needs else ""
            return QuarantineView(NOT_NEEDED, f"not needed{needs}")
        return QuarantineView(UNDECIDED, "not decided yet (the quarantine process has not "
                                         "looked at this issue)")


@dataclass(frozen=True)
class IssueView:
    """One issue with everything decided about it."""

    issue: Issue
    remediation: Remediation | None
    impact: Impact | None
    quarantine: QuarantineView | None  # None: no quarantine configured

    @property
    def advice(self) -> str:
        """What to do: the restart decision's advice where there is one, else the alert's."""
        if self.remediation is not None and self.remediation.advice:
            return self.remediation.advice
        return self.issue.root.text("remediation")

    @property
    def onset(self) -> datetime:
        """The issue's onset everywhere: the measured change where the impact moved it."""
        if self.impact is not None and self.impact.kind != UNMEASURED:
            return datetime.fromtimestamp(self.impact.onset, UTC)
        return self.issue.started_at


@dataclass(frozen=True)
class Unconfirmed:
    """A stored alert Prometheus did not confirm (or has not answered for), and why."""

    fact: AlertFact
    reason: str
    final: bool  # Prometheus said it did not raise it (else: not yet known)


@dataclass(frozen=True)
class RunView:
    """One run as every surface shows it (see module docstring)."""

    run: RunKey
    facts: tuple[AlertFact, ...]  # the confirmed alerts the diagnosis is made of
    diagnosis: Diagnosis
    issues: tuple[IssueView, ...]  # in the diagnosis' order (oldest first)
    outcome: Outcome | None = None
    measured_at: float | None = None  # when the worker last measured the impacts
    unconfirmed: tuple[Unconfirmed, ...] = ()
    confirmation: str = ""  # how the facts were checked (said on the page)
    delivery: OutboxRow | None = None
    wandb_enabled: bool = True
    node_state_read: bool = True  # False: the verdicts say what they can without Prometheus
    job_log: Reading | None = None  # the job's own console log, as the worker last read it
    activity: Activity | None = None  # the GPU activity plot's data, as the worker last read it
    state_read_at: float | None = None  # when the worker last read the hosts' state

    @property
    def head(self) -> IssueView | None:
        """The headline issue's view."""
        root = self.diagnosis.root_cause
        return None if root is None else self.issues[self.diagnosis.issues.index(root)]

    @property
    def ranked(self) -> tuple[IssueView, ...]:
        """Headline first, then the others oldest first."""
        head = self.head
        return () if head is None else (head, *(i for i in self.issues if i is not head))

    @property
    def remediations(self) -> dict[str, Remediation]:
        """Issue key -> restart decision (issues naming a host)."""
        return {i.issue.key: i.remediation for i in self.issues if i.remediation is not None}

    @property
    def impacts(self) -> dict[str, Impact] | None:
        """Issue key -> measured impact; None when never measured (or nothing to measure)."""
        if self.measured_at is None or not self.issues:
            return None
        return {i.issue.key: i.impact for i in self.issues if i.impact is not None}

    @property
    def gpu_hours(self) -> float | None:
        """GPU-hours the run lost, as last measured (None: not measured)."""
        impacts = self.impacts
        return None if impacts is None else round(run_gpu_hours(impacts.values()), 3)

    @property
    def firing(self) -> int:
        """Confirmed alerts still firing."""
        return sum(1 for f in self.facts if f.ends_at is None)

    @property
    def job_log_joined(self) -> Joined | None:
        """The job log's reading joined with the diagnosis' root cause (None: not read)."""
        if self.job_log is None:
            return None
        return join(self.job_log, self.diagnosis.root_cause,
                    "" if self.outcome is None else self.outcome.coverage_line)

    def headline_remediation(self) -> Remediation | None:
        """The run-level restart verdict (the headline's, else the first issue's)."""
        return headline(self.remediations, self.diagnosis)

    # JSON edge --------------------------------------------------------------------------------
    def delivery_status(self) -> dict[str, Any]:
        """Where the W&B projection stands (``off`` instead of a pending that never ends)."""
        row = self.delivery
        if row is not None and row.parked:
            return {"state": "parked", "reason": row.parked}
        if not self.wandb_enabled:
            return {"state": "off"}
        if row is None:
            return {"state": "not queued"}
        if row.dirty_seq > row.delivered_seq:
            return {"state": "pending", "attempts": row.attempts, "last_error": row.last_error}
        return {"state": "delivered", "at": row.delivered_at}

    def row(self) -> RunRow:
        """The run's row of ``/runs``."""
        head = self.head
        return RunRow(self.run, len(self.facts), self.firing, len(self.issues),
                      len(self.diagnosis.open_issues), None if head is None else head.issue,
                      None if head is None else head.onset, self.delivery_status(),
                      self.outcome, self.gpu_hours, len(self.unconfirmed),
                      None if self.job_log_joined is None else str(self.job_log_joined.verdict))

    def as_dict(self, link_for: LinkFn) -> dict[str, Any]:
        """The run page's JSON (and ``explain --json``)."""
        out: dict[str, Any] = {
            "entity": self.run.entity, "project": self.run.project, "run_id": self.run.run_id,
            "wandb": self.delivery_status(),
            "issues": [_issue(i, link_for) for i in self.issues],
            "unconfirmed": [{"alert": _fact(u.fact, ""), "reason": u.reason, "final": u.final}
                            for u in self.unconfirmed],
            "confirmation": self.confirmation,
        }
        head = self.head
        if head is not None:
            out["headline"] = {"issue": self.issues.index(head), "title": head.issue.title,
                               "reason": self.diagnosis.headline_reason,
                               "advice": head.advice}
        if self.outcome is not None:
            out["verdict"] = self.outcome.as_dict()
        rem = self.headline_remediation()
        if rem is not None:
            out["remediation"] = rem.as_dict()
            out["remediations"] = {i.issue.key: _remediation(i) for i in self.issues
                                   if i.remediation is not None}
        joined = self.job_log_joined
        if self.job_log is not None and joined is not None:
            out["job_log"] = {**self.job_log.as_dict(), **joined.as_dict()}
        impacts = self.impacts
        if impacts is not None:
            out["impacts"] = {k: v.as_dict() for k, v in impacts.items()}
            out["gpu_hours_lost"] = self.gpu_hours
            out["impacts_measured_at"] = self.measured_at
        if self.activity is not None:
            out["activity"] = self.activity.as_dict()
        if self.state_read_at is not None:
            out["hosts_state_read_at"] = self.state_read_at
        return out


@dataclass(frozen=True)
class RunRow:
    """One row of ``/runs``: what the list shows of a view (kept for many runs, so it holds
    the headline issue, not every alert), or why the run cannot be shown."""

    run: RunKey
    alerts: int
    firing: int
    issues: int
    open_issues: int
    head: Issue | None
    started_at: datetime | None
    wandb: dict[str, Any]
    outcome: Outcome | None = None
    gpu_hours: float | None = None
    unconfirmed: int = 0
    job_log: str | None = None
    error: str = ""

    def as_dict(self, *, full_verdict: bool = False) -> dict[str, Any]:
        """The row's JSON (``full_verdict``: the verdict with its reason and coverage)."""
        root = None if self.head is None else self.head.root
        out: dict[str, Any] = {
            "entity": self.run.entity, "project": self.run.project, "run_id": self.run.run_id,
            "alerts": self.alerts, "firing": self.firing,
            "issues": self.issues, "open_issues": self.open_issues,
            "root_cause": None if self.head is None or root is None else {
                "alertname": root.alertname, "where": self.head.where},
            "severity": None if root is None else root.severity,
            "started_at": stamp(self.started_at), "wandb": self.wandb,
            "verdict": None if self.outcome is None else (
                self.outcome.as_dict() if full_verdict else self.outcome.verdict),
            "gpu_hours_lost": self.gpu_hours,
            "gpu_hours_text": None if self.gpu_hours is None else hours_text(self.gpu_hours),
            "unconfirmed": self.unconfirmed, "job_log": self.job_log,
        }
        return out | ({"error": self.error} if self.error else {})


def _remediation(issue: IssueView) -> dict[str, Any]:
    assert issue.remediation is not None
    out = issue.remediation.as_dict()
    if issue.quarantine is not None:
        out["quarantine"] = {"state": issue.quarantine.state, "text": issue.quarantine.text}
    return out


def _fact(fact: AlertFact, link: str) -> dict[str, Any]:
    return {
        "alertname": fact.alertname, "severity": fact.severity, "category": fact.category,
        "hostname": fact.hostname, "gpu": fact.gpu, "where": fact.where,
        "cause_class": fact.cause.name.lower(),
        "onset": stamp(fact.onset), "starts_at": stamp(fact.starts_at),
        "ends_at": stamp(fact.ends_at),
        "summary": fact.text("summary"), "description": fact.text("description"),
        "impact": fact.text("impact"), "remediation": fact.text("remediation"),
        "runbook_url": runbook_url(fact), "grafana": link,
    }


def _issue(view: IssueView, link_for: LinkFn) -> dict[str, Any]:
    issue = view.issue
    return {
        "key": issue.key, "title": issue.title, "where": issue.where,
        "started_at": stamp(issue.started_at), "onset": stamp(view.onset),
        "ended_at": stamp(issue.ended_at), "open": issue.open,
        "reasoning": issue.reasoning, "advice": view.advice,
        # the root's remediation is the issue's one decision, never the catalog's generic text
        # beside it (after a repair that text still says to reset or exclude)
        "root_cause": _fact(issue.root, link_for(issue.root, issue.started_at, issue.ended_at))
        | {"remediation": view.advice},
        "consequences": [_fact(c, link_for(c, c.onset, c.ends_at)) for c in issue.consequences],
    }

