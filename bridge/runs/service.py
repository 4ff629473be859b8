"""Turns a run key into its ``RunView``: the one assembly path every surface uses.

The run's alerts are read once, confirmed once (an alert Prometheus did not raise is listed apart,
never diagnosed), diagnosed once; each issue gets its restart decision with the quarantine's, the
impacts the worker measured and the verdict it stored. Only a service given Prometheus readers
(the worker's, the quarantine's) asks Prometheus, and the worker's ``records`` what it found; the
pages' service reads what was stored, so a page view never asks Prometheus, writes the store or
calls W&B. New evidence plugs in the same way: the worker stores it
(``Store.record_evidence``), ``view`` reads it into a field of ``RunView``, surfaces render it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from datetime import timedelta

from wandb_infra.bridge.diagnosis.impact import Impact
from wandb_infra.bridge.diagnosis.need import Policy
from wandb_infra.bridge.diagnosis.outcome import Outcome
from wandb_infra.bridge.diagnosis.outcome import judge as judge_outcome
from wandb_infra.bridge.diagnosis.root_cause import DEFAULT_GAP, AlertFact, Diagnosis, diagnose
from wandb_infra.bridge.diagnosis.verdict import NO_PROMETHEUS, NOT_ANSWERING
from wandb_infra.bridge.ingest.outbox import OutboxRow
from wandb_infra.bridge.ingest.store import Store, from_iso
from wandb_infra.bridge.joblog.reading import Reading
from wandb_infra.bridge.prometheus.activity import Activity
from wandb_infra.bridge.prometheus.confirm import AlertConfirmer, Confirmation
from wandb_infra.bridge.prometheus.remediation import (
    NodeStateHistory,
    Remediation,
    remediations_for,
)
from wandb_infra.bridge.quarantine.actuator import Quarantine
from wandb_infra.bridge.runs.view import IssueView, QuarantineView, RunView, Unconfirmed
from wandb_infra.common.runkey import RunKey

IMPACTS = "impacts"  # evidence kind: {issue key: Impact as a dict}
RESTART = "restart"  # evidence kind: {issue key: Remediation} as the worker last read them
JOB_LOG = "job_log"  # evidence kind: the job's console log read (joblog.reading.Reading)
ACTIVITY = "activity"  # evidence kind: the run's GPU activity plot (prometheus.activity)
RECENT_RUNS = 200  # the periodic passes look at most at this many recently active runs
RECENT = 3 * 86400.0  # ... whose latest alert started within this time
UNANSWERED = "not confirmed yet: Prometheus has not answered whether it raised this alert"
NOT_ASKED = "not confirmed yet: the bridge has not asked Prometheus about it yet"
UNCHECKED = "alerts not checked against Prometheus (no prometheus.url configured)"
CONFIRMED = "every alert shown was confirmed by Prometheus' own ALERTS series"
NOT_READ = "the bridge has not read the hosts' state from Prometheus yet"
PENDING = ("not confirmed yet: Prometheus holds no firing series of it so far (asked again "
           "until its window closes)")


class RunService:
    """Builds run views from the store and the readers it is given (see module docstring)."""

    def __init__(self, store: Store | None, *, confirmer: AlertConfirmer | None = None,
                 history: NodeStateHistory | None = None, quarantine: Quarantine | None = None,
                 gap: timedelta = DEFAULT_GAP, restart_policy: Policy | None = None,
                 scheduler: str = "", wandb_enabled: bool = True, confirms: bool | None = None,
                 records: bool = False, clock: Callable[[], float] = time.time) -> None:
        self.store, self.confirmer = store, confirmer
        # whether alerts are checked at all (by this service's confirmer or from the answers
        # the worker stored), and whether this service stores what its readers found
        self.confirms = confirmer is not None if confirms is None else confirms
        self.records, self.history, self.quarantine, self.gap = records, history, quarantine, gap
        self.restart_policy = restart_policy or Policy()
        self.scheduler, self.wandb_enabled, self.clock = scheduler, wandb_enabled, clock

    def view(self, run: RunKey, *, remediate: bool = True) -> RunView | None:
        """The run's view; None when the store holds neither alerts nor a verdict for it.
        ``remediate`` False leaves out the restart decisions (``/runs`` rows show none)."""
        assert self.store is not None, "a service without a store only assembles"
        facts = self.store.facts(run)
        ending = self.store.ending(run) if run.attributed else None
        stored = None if ending is None or ending.outcome is None else Outcome.loads(
            ending.outcome)
        if not facts and stored is None:
            return None
        measured = self.store.evidence(run, IMPACTS) if run.attributed else None
        impacts = None if measured is None else (
            {k: Impact(**v) for k, v in json.loads(measured[0]).items()}, measured[1])
        view = self.assemble(run, self.confirm(run, facts), stored=stored, impacts=impacts,
                             delivery=self.store.outbox(run), remediate=remediate)
        if not run.attributed:
            return view
        read, plot, state = (self.store.evidence(run, k) for k in (JOB_LOG, ACTIVITY, RESTART))
        return replace(view, job_log=None if read is None else Reading.from_dict(
                           json.loads(read[0])),
                       activity=None if plot is None else Activity.from_dict(
                           json.loads(plot[0])),
                       state_read_at=None if state is None else state[1])

    def confirm(self, run: RunKey, facts: Sequence[AlertFact]) -> Confirmation:
        """Which alerts Prometheus raised: the answers stored with them, the others asked now by
        a service with a confirmer (and stored when it ``records``), else not answered yet;
        all, unchecked, where no Prometheus is configured."""
        if not self.confirms or not facts:
            return Confirmation.unchecked(facts)
        known = {} if self.store is None else self.store.confirmations(run)
        if self.confirmer is None:
            answers = [(f, known.get((f.fingerprint, f.starts_at))) for f in facts]
            return Confirmation(tuple(f for f, a in answers if a == ""),
                                tuple((f, a) for f, a in answers if a),
                                unanswered=tuple(f for f, a in answers if a is None),
                                asked=False)
        found = self.confirmer.confirm(facts, known)
        new = [(f, why) for f, why in (*((f, "") for f in found.confirmed), *found.refused)
               if (f.fingerprint, f.starts_at) not in known]
        if new and self.records and self.store is not None:
            self.store.record_confirmations(run, new)
        return found

    def assemble(self, run: RunKey, confirmation: Confirmation, *, stored: Outcome | None = None,
                 impacts: tuple[Mapping[str, Impact], float] | None = None,
                 delivery: OutboxRow | None = None, remediate: bool = True) -> RunView:
        """A view from facts already read and confirmed (``explain`` reads them from
        Prometheus' history rather than the store)."""
        diagnosis = diagnose(confirmation.confirmed, self.gap)
        remediations, read = self._remediations(run, diagnosis) if remediate else ({}, False)
        issues = []
        for issue in diagnosis.issues:
            rem = remediations.get(issue.key)
            quarantine = None
            if self.quarantine is not None:
                lines = [(d.outcome, d.text()) for d in self.quarantine.decisions(issue.key)]
                quarantine = QuarantineView.of(lines, rem)
                if lines and rem is not None:
                    rem = replace(rem, action=quarantine.text)
            issues.append(IssueView(issue, rem, None if impacts is None
                                    else impacts[0].get(issue.key), quarantine))
        unconfirmed = (*(Unconfirmed(f, why, True) for f, why in confirmation.refused),
                       *(Unconfirmed(f, PENDING, False) for f in confirmation.pending),
                       *(Unconfirmed(f, UNANSWERED if confirmation.asked else NOT_ASKED, False)
                         for f in confirmation.unanswered))
        return RunView(
            run, confirmation.confirmed, diagnosis, tuple(issues),
            outcome=stored,
            measured_at=None if impacts is None else impacts[1], unconfirmed=unconfirmed,
            confirmation=CONFIRMED if confirmation.checked else UNCHECKED, delivery=delivery,
            wandb_enabled=self.wandb_enabled, node_state_read=read)

    def _remediations(self, run: RunKey, diagnosis: Diagnosis
                      ) -> tuple[dict[str, Remediation], bool]:
        """Issue key -> restart decision, and whether the hosts' state was read (else each
        verdict says what it could decide without it): read from Prometheus by a service with
        a history reader (and stored when it ``records``), else as the worker last stored it."""
        rems = None if self.history is None else self.history.for_diagnosis(
            diagnosis, self.restart_policy, scheduler=self.scheduler)
        if rems is not None:
            if self.records and self.store is not None and run.attributed and rems:
                self.store.record_evidence(run, RESTART, json.dumps(
                    {k: asdict(r) for k, r in rems.items()}), self.clock())
            return rems, True
        unread = (NOT_ANSWERING if self.history is not None else NOT_READ if self.confirms
                  else NO_PROMETHEUS)
        rems = remediations_for(diagnosis, self.restart_policy, None, self.clock(),
                                scheduler=self.scheduler, unread=unread)
        stored = None if self.store is None or not run.attributed else self.store.evidence(
            run, RESTART)
        if stored is not None:  # what the worker read, for the issues it read them for
            rems |= {k: Remediation.from_dict(v) for k, v in json.loads(stored[0]).items()
                     if k in rems}
        return rems, self.history is None

    def record_impacts(self, view: RunView, impacts: Mapping[str, Impact]) -> RunView:
        """Store impacts the worker just measured (and the run's GPU-hours, for ``/runs`` and
        ``/metrics``); returns the view showing them."""
        assert self.store is not None
        now = self.clock()
        body = json.dumps({k: asdict(v) for k, v in impacts.items()}, sort_keys=True)
        self.store.record_evidence(view.run, IMPACTS, body, now)
        view = self.with_impacts(view, impacts, now)
        if view.gpu_hours is not None:  # the run's figure (overlapping issues counted once)
            self.store.record_gpu_hours(view.run, view.gpu_hours, now)
        return view

    def judged(self, view: RunView) -> RunView:
        """The ended run's verdict judged again on its diagnosis now, stored when it changed
        (an alert that arrived after the run was judged): the worker judges, views read."""
        if view.outcome is None:
            return view
        old = view.outcome
        outcome = judge_outcome(view.diagnosis, old.coverage, old.ended_at, old.how)
        if outcome != old and self.store is not None:
            self.store.record_outcome(view.run, outcome.verdict, outcome.dumps(), self.clock(),
                                      deliver=False)
        return replace(view, outcome=outcome)

    def record_job_log(self, view: RunView, reading: Reading) -> RunView:
        """Store the job log's reading the worker just made; returns the view showing it."""
        assert self.store is not None
        self.store.record_evidence(view.run, JOB_LOG, json.dumps(reading.as_dict()),
                                   self.clock())
        return replace(view, job_log=reading)

    def record_activity(self, view: RunView, activity: Activity) -> RunView:
        """Store the GPU activity the worker just read; returns the view showing it."""
        assert self.store is not None
        self.store.record_evidence(view.run, ACTIVITY, json.dumps(activity.as_dict()),
                                   activity.read_at)
        return replace(view, activity=activity)

    @staticmethod
    def with_impacts(view: RunView, impacts: Mapping[str, Impact], at: float) -> RunView:
        """The view with impacts measured at ``at``."""
        issues = tuple(replace(i, impact=impacts.get(i.issue.key)) for i in view.issues)
        return replace(view, issues=issues, measured_at=at)


def recent_runs(store: Store, now: float, *, firing_only: bool = False) -> list[RunKey]:
    """Attributed runs with an alert firing, however long ago it started, or (unless
    ``firing_only``) whose latest alert started within ``RECENT``; at most ``RECENT_RUNS``, most
    recent first: the runs the worker's and the quarantine's passes look at. A fault firing for
    days still needs its hosts' state read and its quarantine offered."""
    return [run for run, _alerts, firing, last in store.runs(limit=RECENT_RUNS)
            if run.attributed and (firing or (
                not firing_only and from_iso(last).timestamp() >= now - RECENT))]


def offer_to_quarantine(runs: RunService, quarantine: Quarantine, now: float) -> int:
    """One quarantine pass: the open issues of recently active runs whose restart decision lets
    the hosts be taken out are offered to the quarantine, which checks its own limits. Only
    alerts Prometheus confirmed make issues, so none of this runs without a Prometheus to ask
    (a forged alert never drains a node). Returns the decisions made."""
    if runs.confirmer is None or runs.store is None:
        return 0
    made = 0
    for run in recent_runs(runs.store, now, firing_only=True):
        view = runs.view(run)
        for issue in () if view is None else view.issues:
            if issue.issue.open and issue.remediation is not None and issue.remediation.drain:
                made += len(quarantine.consider(issue.issue))
    return made
