"""The delivery worker: projects each run's diagnosis onto W&B from the store's outbox.

At most one projection per run per flush interval, whatever the alert count: the outbox holds one
row per run, and a projection writes the run's whole current state (tags, notes section, summary,
markers), so later changes are folded into the next flush and per-run order cannot be violated.
Transient failures back off exponentially with jitter, at least as long as ``Retry-After`` asks,
and pause the whole worker (W&B being down is not a per-run problem, so no retry storm); permanent
failures, and anything else one run's rendering or delivery raises, park that run, counted and
visible, without blocking other runs. With Prometheus configured, each issue also shows its faulty
hosts' scheduler state and a restart verdict (prometheus/remediation.py); recently active runs are
re-checked every ``node_state_refresh`` seconds and re-projected when that changed.
"""

from __future__ import annotations

import logging
import math
import random
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from wandb_infra.bridge.diagnosis.impact import Impact, search_window, with_run_metric
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.root_cause import Diagnosis
from wandb_infra.bridge.diagnosis.verdict import Policy
from wandb_infra.bridge.ingest.store import OutboxRow, Store, StoreError
from wandb_infra.bridge.joblog.sources import Pod, RunLogs, Settings, for_run
from wandb_infra.bridge.joblog.sources import read as read_job_log
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.markers import MARKER_SETTLE, MISSING_SDK, MarkerWriter
from wandb_infra.bridge.projection.notes import issue_onsets, render_section, replace_section
from wandb_infra.bridge.projection.plan import (
    TAG_PREFIX,
    impact_entries,
    merged_tags,
    plan_markers,
    summary_entries,
)
from wandb_infra.bridge.projection.wandb_client import (
    RUN_METRICS,
    PermanentError,
    TransientError,
    WandbClient,
    WandbError,
)
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.prometheus.confirm import AlertConfirmer
from wandb_infra.bridge.prometheus.endings import EndingsPass, EndingsPolicy, RunEndings
from wandb_infra.bridge.prometheus.impact_reader import ImpactHistory
from wandb_infra.bridge.prometheus.remediation import (
    NodeStateHistory,
    signature,
    summary_verdict,
)
from wandb_infra.bridge.prometheus.run_lookup import PrometheusRunLookup
from wandb_infra.bridge.quarantine.actuator import Quarantine
from wandb_infra.bridge.quarantine.actuator import build as build_quarantine
from wandb_infra.bridge.runs.service import (
    UNANSWERED,
    RunService,
    offer_to_quarantine,
    recent_runs,
)
from wandb_infra.bridge.runs.view import RunView
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.common.kubeapi import KubeApi
from wandb_infra.common.logsetup import log_fields
from wandb_infra.common.nodestate import DEFAULT_TOLERATED
from wandb_infra.common.runkey import RunKey

log = logging.getLogger(__name__)

TAG_MARK = "tag|"  # marker: tag|<tag> for every tag the bridge wrote (only those are removed)
VERIFY_ATTEMPTS = 3  # write, read back, merge again if the user changed the run meanwhile
REMEDIATION = "remediation"  # marker: remediation|<epoch>|<signature> after each projection
ENDED = frozenset({"finished", "failed", "crashed"})  # W&B states of a run that ended
CONFIRM_RETRY = 30.0  # a run with alerts Prometheus has not confirmed yet is tried again
# Parked runs are tried again after 5 minutes, doubling to at most 6 hours per run.
PARK_RETRY_BASE, PARK_RETRY_MAX, PARK_RETRY_CHECK = 300.0, 6 * 3600.0, 60.0
PLAIN_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")  # a host name as a DNS label


class ConfirmationUnanswered(RuntimeError):
    """Prometheus did not answer whether it raised the run's alerts: retry this run later."""


def _latest_signature(markers: set[str]) -> str:
    """The remediation signature of the run's last projection (that of nothing if none)."""
    found = [m.split("|", 2) for m in markers if m.startswith(REMEDIATION + "|")]
    return max(found, key=lambda p: float(p[1]))[2] if found else signature({})


@dataclass(frozen=True)
class DeliveryPolicy:
    """Timing knobs (seconds)."""

    flush_interval: float = 10.0
    backoff_base: float = 2.0
    backoff_max: float = 300.0
    state_check_interval: float = 300.0
    retention: float = 30 * 86400.0
    notify_critical: bool = False
    incident_gap: float = 600.0
    marker_settle: float = MARKER_SETTLE
    node_state_refresh: float = 60.0
    quarantine: Mapping[str, Any] | None = None
    restart_policy: Policy = field(default_factory=Policy)
    # Whether this process acts on the quarantine's decisions. ``serve`` sets False: the receiver
    # of untrusted webhooks holds no scheduler rights, ``wandb-infra-bridge quarantine`` acts.
    quarantine_acts: bool = True
    # With Prometheus, write a run only with the alerts Prometheus confirms it raised.
    confirm_alerts: bool = True
    tolerated_taints: tuple[str, ...] = DEFAULT_TOLERATED
    # The exclusion's syntax (slurm, kubernetes) when no faulty host's state names its scheduler.
    scheduler: str = ""
    # With Prometheus: every ended run gets a verdict (bridge/prometheus/endings.py); None: off.
    endings: EndingsPolicy | None = None
    # History keys of the run's own throughput or MFU the impact line names where one fell.
    run_metrics: tuple[str, ...] = RUN_METRICS
    # Where an ended run's console log is read (the bridge config's ``joblog`` section).
    joblog: Settings = field(default_factory=Settings)


def run_service(store: Store, prom: PrometheusClient | None, policy: DeliveryPolicy,
                quarantine: Quarantine | None, *, wandb_enabled: bool,
                clock: Callable[[], float] = time.time,
                history: NodeStateHistory | None = None) -> RunService:
    """The run service the worker and the pages each build on their own Prometheus client:
    with Prometheus, only the alerts it raised count (alert labels are untrusted)."""
    if prom is not None and history is None and policy.node_state_refresh > 0:
        history = NodeStateHistory(prom, cache_seconds=min(10.0, policy.node_state_refresh),
                                   tolerated_taints=policy.tolerated_taints)
    return RunService(
        store, confirmer=AlertConfirmer(prom, clock)
        if prom is not None and policy.confirm_alerts else None,
        history=history, quarantine=quarantine, gap=timedelta(seconds=policy.incident_gap),
        restart_policy=policy.restart_policy, scheduler=policy.scheduler,
        wandb_enabled=wandb_enabled, clock=clock)


def backoff(attempts: int, policy: DeliveryPolicy, retry_after: float | None,
            rng: random.Random) -> float:
    """Exponential backoff with jitter (50-100 %), never shorter than ``Retry-After``."""
    delay = min(policy.backoff_max, policy.backoff_base * (2 ** max(0, attempts)))
    delay *= 0.5 + rng.random() / 2
    return max(delay, retry_after or 0.0)


class DeliveryWorker:
    """Runs in its own thread; ``run_once`` is the unit tests and benchmarks drive directly."""

    def __init__(self, store: Store, *, client: WandbClient | None,
                 markers: MarkerWriter | None, links: GrafanaLinks, metrics: BridgeMetrics,
                 policy: DeliveryPolicy, lookup: PrometheusRunLookup | None = None,
                 clock: Callable[[], float] = time.time, seed: int | None = None) -> None:
        self.store = store
        self.client = client
        self.markers = markers
        self.links = links
        self.metrics = metrics
        self.policy = policy
        self.lookup = lookup
        self.clock = clock
        self.rng = random.Random(seed)
        self.paused_until = 0.0
        self._pause_end = 0.0  # the same pause on the monotonic clock
        self._last_now = 0.0
        self.consecutive_transient = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_purge = 0.0
        self._last_unpark = 0.0
        self._settle_wake: dict[RunKey, float] = {}
        # The faulty hosts' scheduler state, from the same Prometheus as attribution.
        self.remediation = (NodeStateHistory(lookup.client,
                                             cache_seconds=min(10.0, policy.node_state_refresh),
                                             tolerated_taints=policy.tolerated_taints)
                            if lookup is not None and policy.node_state_refresh > 0 else None)
        # What each issue cost the run, measured on its GPUs (bridge/diagnosis/impact.py).
        self.impact = ImpactHistory(lookup.client) if lookup is not None else None
        metrics.read_gpu_hours_from(store.gpu_hours_by_project)  # kept across restarts
        self._next_refresh = 0.0
        self.endings = (EndingsPass(store, RunEndings(lookup.client, policy.endings),
                                    store.facts, incident_gap=policy.incident_gap,
                                    deliver=client is not None,
                                    state=None if client is None else self._wandb_state)
                        if lookup is not None and policy.endings is not None
                        and policy.endings.enabled else None)
        self.quarantine = build_quarantine(policy.quarantine,
                                           Path(store.path).resolve().parent,
                                           acting=policy.quarantine_acts)
        self.runs = run_service(store, None if lookup is None else lookup.client, policy,
                                self.quarantine, wandb_enabled=client is not None, clock=clock,
                                history=self.remediation)
        self.kube = None if policy.joblog.kubernetes is None else KubeApi(
            policy.joblog.kubernetes, "joblog.kubernetes")
        self._audit_status()

    def _wandb_state(self, run: RunKey) -> str | None:
        """A run's W&B state, the second witness of its ending (None: W&B has no such run)."""
        assert self.client is not None
        try:
            return self.client.find_run(run.entity, run.project, run.run_id).state
        except PermanentError:
            return None

    def _audit_status(self) -> None:
        """The quarantine audit log's health on /metrics (damage never stops the bridge)."""
        if self.quarantine is not None:
            self.metrics.audit_damaged.set(len(self.quarantine.audit_problems))
            self.metrics.audit_writable.set(int(self.quarantine.audit_writable))

    # thread ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the background loop."""
        self._thread = threading.Thread(target=self._loop, name="bridge-delivery", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop and wait for the current projection to finish."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wake(self) -> None:
        """New data arrived: look at the outbox now rather than at the next tick."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except StoreError as exc:
                log.error("store unavailable in delivery worker", extra=log_fields(error=str(exc)))
            except Exception:
                log.exception("delivery worker iteration failed")
            self._wake.wait(1.0)
            self._wake.clear()
        self.store.close()

    # one pass -------------------------------------------------------------------------------
    def run_once(self) -> int:
        """Attribute, deliver what is due, refresh gauges, purge old data. Returns deliveries."""
        now = self.clock()
        if now < self._last_now - 1.0:
            self._clock_stepped_back(now)
        self._last_now = now
        if self.lookup is not None:
            try:
                self._attribute(now)
            except StoreError:
                raise
            except Exception:  # a bad lookup must not stop delivery of attributed runs
                log.exception("attribution by Prometheus lookup failed")
        if self.endings is not None and self.endings.due(now):
            try:
                self.endings.run(now)
            except StoreError:
                raise
            except Exception:  # Prometheus down: the cursor stays, the next pass catches up
                log.exception("looking for ended runs failed")
        delivered = 0
        if self.client is not None and now >= self.paused_until:
            for row in self.store.due(now, self.policy.flush_interval):
                if self._stop.is_set():
                    break
                if not self._deliver(row):
                    break
                delivered += 1
        if (self.remediation is not None or self.quarantine is not None
                or self.impact is not None) and now >= self._next_refresh:
            self._next_refresh = now + (self.policy.node_state_refresh or 60.0)
            if self.quarantine is not None and self.quarantine.acting:
                self.quarantine_pass(now)
            elif self.quarantine is not None:
                self.quarantine.refresh()  # what the quarantine process decided, to show
            delivered += self._refresh(now)
        if self.client is not None:
            stats = self.store.queue_stats(self.clock())
            self.metrics.queue_depth.set(stats.pending_runs)
            self.metrics.oldest_age.set(stats.oldest_pending_age)
            self.metrics.parked.set(stats.parked_runs)
        if self.client is not None and now - self._last_unpark >= PARK_RETRY_CHECK:
            self._last_unpark = now
            if self.store.unpark_due(now, PARK_RETRY_BASE, PARK_RETRY_MAX):
                self._wake.set()
        if now - self._last_purge > 3600:
            self._last_purge = now
            self.store.purge(now - self.policy.retention, delivering=self.client is not None)
        return delivered

    def _clock_stepped_back(self, now: float) -> None:
        """A backward wall-clock step (NTP, a VM restored): the pause and the runs' retry times
        were set on the old time, so they are re-based on what is left of the pause on the
        monotonic clock (they would otherwise wait out the step, e.g. an hour)."""
        log.warning("wall clock stepped back; retry times re-based",
                    extra=log_fields(step_seconds=round(self._last_now - now, 1)))
        self.paused_until = now + max(0.0, self._pause_end - time.monotonic())
        self.store.rebase_retries(now, self.paused_until)

    def measure(self, view: RunView) -> RunView:
        """The run's impacts measured now (Prometheus, and the run's own metrics in W&B) and
        stored as its evidence, so pages show them without measuring; the view unchanged
        without Prometheus or while it is down."""
        if self.impact is None or not view.run.attributed:
            return view
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

    def quarantine_pass(self, now: float) -> None:
        """Offer what needs a node out of service to the quarantine (``offer_to_quarantine``)."""
        assert self.quarantine is not None
        offer_to_quarantine(self.runs, self.quarantine, now)
        self._audit_status()

    def _refresh(self, now: float) -> int:
        """Re-measure the impacts of recently active runs with an open issue or none measured
        yet, and re-project those whose faulty hosts' state changed since their last
        projection (drained, cordoned, back in service) through the normal delivery path."""
        delivered = 0
        for run in recent_runs(self.store, now, firing_only=False):
            if self._stop.is_set():
                break
            view = self.runs.view(run)
            if view is None or not view.issues:
                continue
            if self.client is None:  # no W&B projection: the pages still get the job log
                view = self.read_job_log(view, None)
            stale = view.measured_at is None or (bool(view.diagnosis.open_issues) and \
                now - view.measured_at >= (self.policy.node_state_refresh or 60.0))
            if stale or set(view.impacts or {}) != {i.issue.key for i in view.issues}:
                view = self.measure(view)
            row = view.delivery
            if self.client is None or now < self.paused_until or row is None or row.parked \
                    or not view.node_state_read or signature(view.remediations) == \
                    _latest_signature(self.store.markers(run)):
                continue
            if not self._deliver(row):
                break
            delivered += 1
        return delivered

    def _attribute(self, now: float) -> None:
        assert self.lookup is not None
        for fact in self.store.unattributed_for_lookup():
            runs = self.lookup.runs_at(fact.hostname, fact.gpu, fact.starts_at)
            self.store.attach_runs(fact, runs, now)
        self.store.propagate_resolutions(now)

    def _deliver(self, row: OutboxRow) -> bool:
        """Project one run; False when W&B is failing transiently (stop this pass)."""
        assert self.client is not None
        run = row.run
        calls_before = self.client.calls
        try:
            storage_id, state, summary_seq = self._project(row)
        except ConfirmationUnanswered as exc:
            now = self.clock()
            self.store.retry_later(run, now, now + CONFIRM_RETRY, str(exc))
            log.warning("run's alerts not confirmed yet, will retry",
                        extra=log_fields(run=run.path(), retry_in=CONFIRM_RETRY))
            return True
        except TransientError as exc:
            now = self.clock()
            delay = backoff(self.consecutive_transient, self.policy, exc.retry_after, self.rng)
            self.consecutive_transient += 1
            self.paused_until = now + delay
            self._pause_end = time.monotonic() + delay
            self.store.retry_later(run, now, now + delay, str(exc))
            self.metrics.deliveries.labels("transient").inc()
            log.warning("W&B delivery failed, will retry",
                        extra=log_fields(run=run.path(), error=str(exc), retry_in=round(delay, 1)))
            return False
        except (PermanentError, WandbError) as exc:
            self._park(run, exc, str(exc))
            log.error("W&B delivery failed permanently, parked",
                      extra=log_fields(run=run.path(), error=str(exc)))
            return True
        except StoreError:
            raise
        except Exception as exc:  # a bug or poison data in one run must not stop the others
            self._park(run, exc, f"internal error: {type(exc).__name__}: {exc}")
            log.exception("delivery of one run raised, parked", extra=log_fields(run=run.path()))
            return True
        finally:
            self.metrics.wandb_calls.inc(self.client.calls - calls_before)
        now = self.clock()
        self.consecutive_transient = 0
        next_check = now + self.policy.state_check_interval if state == "running" else None
        wake = self._settle_wake.pop(run, None)  # a marker waits for its root cause to settle
        if wake is not None:
            next_check = wake if next_check is None else min(next_check, wake)
        self.store.delivered(run, row.dirty_seq, now, storage_id=storage_id,
                             run_state=state, summary_seq=summary_seq,
                             next_state_check=next_check)
        if self.endings is not None and state in ENDED and row.run_state != state:
            self.store.add_endings([(run, now, f"W&B state {state}")], now)  # judged next pass
        self.metrics.deliveries.labels("ok").inc()
        self.metrics.last_success.set(now)
        return True

    def _park(self, run: RunKey, exc: Exception, reason: str) -> None:
        """Park a run with its reason (shown in /runs); new alerts for it unpark it, and it is
        tried again with backoff (``PARK_RETRY_BASE`` doubling to ``PARK_RETRY_MAX``)."""
        self.store.park(run, self.clock(), reason)
        self.metrics.deliveries.labels("parked").inc()
        self.metrics.delivery_errors.labels(type(exc).__name__).inc()

    def _project(self, row: OutboxRow) -> tuple[str, str, int]:
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
            self._settle_wake[run] = min(self._settle_wake.get(run, math.inf),
                                         self.clock() + CONFIRM_RETRY)
        # Everything slow (Prometheus) happens before the run is read, so the read-to-write
        # window on the user's notes and tags is one W&B round trip.
        view = self.read_job_log(self.measure(view), row.run_state)
        diagnosis, outcome = view.diagnosis, view.outcome
        ending = self.store.ending(run)
        if outcome is not None and ending is not None and outcome.verdict != ending.verdict:
            # an alert that arrived after the run was judged changed its verdict
            self.store.record_outcome(run, outcome.verdict, outcome.dumps(), self.clock(),
                                      deliver=False)
        written = {m.removeprefix(TAG_MARK) for m in self.store.markers(run)
                   if m.startswith(TAG_MARK)}
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
                self.store.add_markers(run, [TAG_MARK + t for t in new_tags], self.clock())
                written.update(new_tags)
            self.client.upsert(info.storage_id,
                               tags=tags if tags != list(info.tags) else None,
                               notes=notes if notes != info.notes else None, summary=summary)
            summary = None
            # Verified: a user's edit that landed meanwhile is read back and merged again.
            info = self.client.find_run(run.entity, run.project, run.run_id)
        self._write_markers(run, diagnosis)
        self._notify(view)
        if view.node_state_read:
            sig = signature(view.remediations)
            if sig != _latest_signature(self.store.markers(run)):
                self.store.add_markers(run, [f"{REMEDIATION}|{self.clock():.3f}|{sig}"],
                                       self.clock())
        return info.storage_id, info.state, summary_seq

    def _write_markers(self, run: RunKey, diagnosis: Diagnosis) -> None:
        """Append settled marker rows (see ``plan_markers``); remember when an unsettled issue
        will be ready so the run is looked at again then."""
        if self.markers is None:
            return
        now = self.clock()
        plan = plan_markers(diagnosis, self.store.markers(run), now, self.policy.marker_settle)
        if plan.seen:
            self.store.add_markers(run, plan.seen, now)
        if plan.wake_at is not None:
            self._settle_wake[run] = min(plan.wake_at, self._settle_wake.get(run, math.inf))
        if not plan.rows:
            return
        try:
            self.markers.write(run, [r for _, r in plan.rows])
        except ImportError as exc:
            raise PermanentError(f"marker writer: {MISSING_SDK}") from exc
        except Exception as exc:
            raise TransientError(f"marker writer: {type(exc).__name__}: {exc}") from exc
        self.store.add_markers(run, [mid for mid, _ in plan.rows], now)
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
        done = self.store.markers(run)
        for issue in view.diagnosis.open_issues:
            mid = f"alert:{issue.key}"
            if issue.root.severity != "critical" or mid in done:
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
            self.store.add_markers(run, [mid], self.clock())
            try:
                self.client.notify(run.entity, run.project, run.run_id,
                                   title=f"Infrastructure issue: {name}", text=text)
            except WandbError as exc:
                self.metrics.delivery_errors.labels("wandb_alert").inc()
                log.warning("W&B alert not sent (not retried: at most once); the run's notes "
                            "carry the issue", extra=log_fields(run=run.path(), issue=issue.key,
                                                                error=str(exc)[:300]))
