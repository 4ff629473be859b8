"""Writing one run's view to W&B: tags, the notes section, the summary once the run ended,
plot markers, and a W&B alert for a new critical root cause. Everything slow (Prometheus, the
run's own metrics in W&B) happens before the run is read, so a user's edit can only land in one
W&B round trip, and is then read back and merged again.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from wandb_infra.bridge.diagnosis.impact import Impact, search_window, with_run_metric
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.root_cause import Diagnosis
from wandb_infra.bridge.ingest.outbox import OutboxRow
from wandb_infra.bridge.ingest.schema import Mark
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.joblog.sources import Pod, RunLogs, for_run
from wandb_infra.bridge.joblog.sources import read as read_job_log
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.markers import MISSING_SDK, MarkerWriter
from wandb_infra.bridge.projection.notes import issue_onsets, render_section, replace_section
from wandb_infra.bridge.projection.plan import (
    ALERT,
    RESTART,
    TAG,
    TAG_PREFIX,
    impact_entries,
    merged_tags,
    plan_markers,
    summary_entries,
)
from wandb_infra.bridge.projection.wandb_client import (
    PermanentError,
    TransientError,
    WandbClient,
    WandbError,
)
from wandb_infra.bridge.prometheus import activity
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.prometheus.impact_reader import ImpactHistory
from wandb_infra.bridge.prometheus.remediation import signature, summary_verdict
from wandb_infra.bridge.runs.service import UNANSWERED, RunService
from wandb_infra.bridge.runs.view import RunView
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.common.kubeapi import KubeApi
from wandb_infra.common.logsetup import log_fields
from wandb_infra.common.runkey import RunKey

if TYPE_CHECKING:
    from wandb_infra.bridge.projection.delivery import DeliveryPolicy

log = logging.getLogger(__name__)

VERIFY_ATTEMPTS = 3  # write, read back, merge again if the user changed the run meanwhile
CONFIRM_RETRY = 30.0  # a run with alerts Prometheus has not confirmed yet is tried again
ENDED = frozenset({"finished", "failed", "crashed"})  # W&B states of a run that ended
PLAIN_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")  # a host name as a DNS label


class ConfirmationUnanswered(RuntimeError):
    """Prometheus did not answer whether it raised the run's alerts: retry this run later."""


def latest_signature(marks: Sequence[Mark]) -> str:
    """The restart verdicts' signature of the run's last projection (that of nothing if none)."""
    return next((m.name for m in marks if m.kind == RESTART), signature({}))


class Projector:
    """Writes run views to W&B through one client (the delivery thread's)."""

    def __init__(self, store: Store, runs: RunService, *, client: WandbClient | None,
                 markers: MarkerWriter | None, links: GrafanaLinks, metrics: BridgeMetrics,
                 policy: DeliveryPolicy, prometheus: PrometheusClient | None,
                 clock: Callable[[], float]) -> None:
        self.store, self.runs, self.client, self.markers = store, runs, client, markers
        self.links, self.metrics, self.policy, self.clock = links, metrics, policy, clock
        self.prometheus = prometheus
        # what each issue cost the run, measured on its GPUs (bridge/diagnosis/impact.py)
        self.impact = None if prometheus is None else ImpactHistory(prometheus)
        self.kube = None if policy.joblog.kubernetes is None else KubeApi(
            policy.joblog.kubernetes, "joblog.kubernetes")
        # when a run must be looked at again (a marker settling, an alert not yet confirmed)
        self.settle_wake: dict[RunKey, float] = {}

    def measure(self, view: RunView) -> RunView:
        """The run's impacts measured now (Prometheus, and the run's own metrics in W&B) and
        its GPU activity plot, stored as its evidence, so pages show them without asking
        Prometheus; the view unchanged without Prometheus (impacts: or while it is down)."""
        if self.impact is None or not view.run.attributed:
            return view
        if view.issues and self.prometheus is not None:
            view = self.runs.record_activity(view, activity.read(
                self.prometheus, view.run, [i.issue for i in view.issues], self.clock()))
        row = view.delivery
        found = self.impact.for_diagnosis(view.run, view.diagnosis,
                                          None if row is None else row.run_state)
        if found is None:
            return view
        if self.client is not None and self.policy.run_metrics:
            found = self._own_metrics(view.run, view.diagnosis, found)
        return self.runs.record_impacts(view, found)

    def read_job_log(self, view: RunView, state: str | None) -> RunView:
        """An ended run's console log read once from the configured sources and stored as its
        evidence (its rank, host and GPU places come from its alerts' labels); the view
        unchanged while the run is running or once read."""
        if not self.policy.joblog.configured or view.job_log is not None or \
                not view.run.attributed or (view.outcome is None and state not in ENDED):
            return view
        labels = [f.labels for f in view.facts]
        run = RunLogs(view.run.entity, view.run.project, view.run.run_id,
                      slurm_job_id=next((x["slurm_job_id"] for x in labels
                                         if x.get("slurm_job_id")), ""),
                      nodes=tuple(sorted({f.hostname for f in view.facts if f.hostname})),
                      pods=tuple(sorted({Pod(x["namespace"], x["pod"], x.get("hostname"))
                                         for x in labels if x.get("pod") and x.get("namespace")},
                                        key=lambda p: (p.namespace, p.name))))
        client = self.client
        sources = for_run(self.policy.joblog, run, kube=self.kube,
                          wandb_base_url="" if client is None else client.base_url,
                          wandb_api_key=None if client is None else client.api_key)
        return self.runs.record_job_log(view, read_job_log(sources, self.policy.joblog.budget))

    def _own_metrics(self, run: RunKey, diagnosis: Diagnosis,
                     found: dict[str, Impact]) -> dict[str, Impact]:
        """Each measured impact, named after the run's own throughput or MFU (W&B history)
        where that fell in the issue's window (bridge/diagnosis/impact.py, with_run_metric)."""
        assert self.client is not None
        now, issues = self.clock(), [i for i in diagnosis.issues if i.key in found]
        bounds = {}
        for issue in issues:
            onset, fired = issue.root.onset.timestamp(), issue.root.starts_at.timestamp()
            ended = None if issue.ended_at is None else issue.ended_at.timestamp()
            earlier = [i.ended_at.timestamp() for i in diagnosis.issues
                       if i.ended_at is not None and i.ended_at <= issue.root.onset]
            bounds[issue.key] = (onset, fired, ended, max(earlier, default=0.0))
        metrics = self.client.run_metrics(
            run.entity, run.project, run.run_id, self.policy.run_metrics,
            {k: search_window(onset=o, fired=f, ended=e, not_before=nb, now=float("inf"),
                              run_end=None) for k, (o, f, e, nb) in bounds.items()})
        return {k: v if k not in metrics else with_run_metric(
                    v, metrics[k], onset=bounds[k][0], fired=bounds[k][1], ended=bounds[k][2],
                    not_before=bounds[k][3], now=now) for k, v in found.items()}

    def project(self, row: OutboxRow) -> tuple[str, str, int]:
        """Write the run's view to W&B: (storage id, W&B state, summary seq written)."""
        assert self.client is not None
        run = row.run
        view = self.runs.view(run)
        if view is None:
            raise PermanentError("nothing stored for this run")
        waiting = [u for u in view.unconfirmed if not u.final]
        if any(u.reason == UNANSWERED for u in waiting) or (waiting and not view.facts):
            raise ConfirmationUnanswered("Prometheus has not confirmed the run's alerts yet")
        if view.unconfirmed and not view.facts and view.outcome is None:
            raise PermanentError(f"not written: {view.unconfirmed[0].reason}")
        if waiting:  # written with what is confirmed; looked at again for the rest
            self.settle_wake[run] = min(self.settle_wake.get(run, math.inf),
                                         self.clock() + CONFIRM_RETRY)
        # Everything slow (Prometheus) happens before the run is read, so the read-to-write
        # window on the user's notes and tags is one W&B round trip.
        view = self.read_job_log(self.measure(self.runs.judged(view)), row.run_state)
        diagnosis, outcome = view.diagnosis, view.outcome
        written = {m.key for m in self.store.marks(run) if m.kind == TAG}
        info = self.client.find_run(run.entity, run.project, run.run_id)
        if view.job_log is None and info.state in ENDED:  # read once, as the run just ended
            view = self.read_job_log(view, info.state)
        # the run's step at each onset: read only for a run that logged steps, cached once the
        # run has logged past it, so the window stays one round trip after the first time
        steps = self.client.steps_at(info, run.entity, run.project, run.run_id,
                                     issue_onsets(view))
        section = render_section(view, self.links.for_run(run), steps=steps)
        summary = None
        summary_seq = row.summary_seq
        if info.state != "running":
            wanted = summary_entries(diagnosis) | summary_verdict(view.remediations, diagnosis)
            wanted |= outcome.summary() if outcome is not None else {}
            wanted |= impact_entries(diagnosis, view.impacts)
            joined = view.job_log_joined
            wanted |= {} if joined is None else joined.summary()
            if any(info.summary.get(k) != v for k, v in wanted.items()):
                summary = {**info.summary, **wanted}
            summary_seq = row.dirty_seq
        for attempt in range(VERIFY_ATTEMPTS):
            tags = merged_tags(info.tags, diagnosis, written)
            notes = replace_section(info.notes, section)
            if tags == list(info.tags) and notes == info.notes and summary is None:
                break  # W&B shows what it should (after a re-read: the user's edit kept ours)
            if attempt:
                log.info("run changed while the bridge wrote it; merged again",
                         extra=log_fields(run=run.path(), attempt=attempt))
            new_tags = [t for t in tags if t.startswith(TAG_PREFIX) and t not in info.tags]
            if new_tags:  # remembered before they are written: only these may be dropped
                self.store.add_marks(run, [Mark(TAG, t, self.clock()) for t in new_tags])
                written.update(new_tags)
            self.client.upsert(info.storage_id,
                               tags=tags if tags != list(info.tags) else None,
                               notes=notes if notes != info.notes else None, summary=summary)
            summary = None
            # Verified: a user's edit that landed meanwhile is read back and merged again.
            info = self.client.find_run(run.entity, run.project, run.run_id)
        self._write_markers(view)
        self._notify(view)
        if view.node_state_read:
            sig = signature(view.remediations)
            if sig != latest_signature(self.store.marks(run)):
                self.store.add_marks(run, [Mark(RESTART, "", self.clock(), sig)])
        return info.storage_id, info.state, summary_seq

    def _write_markers(self, view: RunView) -> None:
        """Append settled marker rows (see ``plan_markers``); remember when an unsettled issue
        will be ready so the run is looked at again then."""
        if self.markers is None:
            return
        now = self.clock()
        run = view.run
        plan = plan_markers(view.diagnosis, self.store.marks(run), now,
                            self.policy.marker_settle, issue_onsets(view))
        if plan.seen:
            self.store.add_marks(run, plan.seen)
        if plan.wake_at is not None:
            self.settle_wake[run] = min(plan.wake_at, self.settle_wake.get(run, math.inf))
        if not plan.rows:
            return
        try:
            self.markers.write(run, [r for _, r in plan.rows])
        except ImportError as exc:
            raise PermanentError(f"marker writer: {MISSING_SDK}") from exc
        except Exception as exc:
            raise TransientError(f"marker writer: {type(exc).__name__}: {exc}") from exc
        self.store.add_marks(run, [mark for mark, _ in plan.rows])
        self.metrics.markers.inc(len(plan.rows))

    def _notify(self, view: RunView) -> None:
        """A W&B alert for each new critical root cause Prometheus confirmed it raised (none
        without a Prometheus to ask), its text from the catalog and the bridge's own decision,
        never from alert-supplied prose or URLs (annotations can be forged through
        Alertmanager's API and would reach the run owner's Slack or e-mail). Sent at most
        once; a failure never fails the projection."""
        if not self.policy.notify_critical or self.client is None or \
                self.runs.confirmer is None:
            return
        run, remediations = view.run, view.remediations
        done = {m.key for m in self.store.marks(run) if m.kind == ALERT}
        for issue in view.diagnosis.open_issues:
            if issue.root.severity != "critical" or issue.key in done:
                continue
            known = ALERTS.get(issue.root.alertname)
            name = known.name if known is not None else "an alert outside the catalog"
            host = issue.root.hostname if PLAIN_HOST.fullmatch(issue.root.hostname) else ""
            rem = remediations.get(issue.key)
            text = " ".join(t for t in (
                f"{name} on {host}." if host else f"{name}.",
                known.summary if known is not None else "",
                known.impact if known is not None else "",
                rem.advice if rem is not None else "",
                f"Safe to restart? {rem.verdict}." if rem is not None else "",
                "Details in the run's notes.") if t)
            # At most once, across a kill -9 too: recorded before it is sent. It is optional
            # (the notes, already written, carry the issue), so a failure is logged and never
            # parks the run or holds back its other writes; it is not sent again.
            self.store.add_marks(run, [Mark(ALERT, issue.key, self.clock())])
            try:
                self.client.notify(run.entity, run.project, run.run_id,
                                   title=f"Infrastructure issue: {name}", text=text)
            except WandbError as exc:
                self.metrics.delivery_errors.labels("wandb_alert").inc()
                log.warning("W&B alert not sent (not retried: at most once); the run's notes "
                            "carry the issue", extra=log_fields(run=run.path(), issue=issue.key,
                                                                error=str(exc)[:300]))
