"""The delivery worker: schedules everything that writes, on one thread (``write.py`` writes a
run's view, the run service builds it, Prometheus readers return evidence).

The outbox holds one row per run and a projection writes the run's whole state, so a run is
written at most once per flush interval and later changes fold into the next one. Transient
failures back off exponentially with jitter (at least ``Retry-After``) and pause the whole worker;
permanent ones, and anything else one run raises, park that run without blocking the others.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.need import Policy
from wandb_infra.bridge.ingest.outbox import OutboxRow
from wandb_infra.bridge.ingest.store import Store, StoreError
from wandb_infra.bridge.joblog.sources import Settings
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.markers import MARKER_SETTLE, MarkerWriter
from wandb_infra.bridge.projection.wandb_client import (
    RUN_METRICS,
    PermanentError,
    TransientError,
    WandbClient,
    WandbError,
)
from wandb_infra.bridge.projection.write import (
    CONFIRM_RETRY,
    ENDED,
    ConfirmationUnanswered,
    Projector,
    latest_signature,
)
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.prometheus.confirm import AlertConfirmer
from wandb_infra.bridge.prometheus.endings import EndingsPass, EndingsPolicy, RunEndings
from wandb_infra.bridge.prometheus.remediation import NodeStateHistory, signature
from wandb_infra.bridge.quarantine.actuator import Quarantine
from wandb_infra.bridge.quarantine.actuator import build as build_quarantine
from wandb_infra.bridge.runs.service import RunService, recent_runs
from wandb_infra.common.logsetup import log_fields
from wandb_infra.common.nodestate import DEFAULT_TOLERATED
from wandb_infra.common.runkey import RunKey

log = logging.getLogger(__name__)

# Parked runs are tried again after 5 minutes, doubling to at most 6 hours per run.
PARK_RETRY_BASE, PARK_RETRY_MAX, PARK_RETRY_CHECK = 300.0, 6 * 3600.0, 60.0


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
                clock: Callable[[], float] = time.time, reads: bool = True,
                records: bool = False) -> RunService:
    """The run service of the worker (``records``), the quarantine process and the pages (not
    ``reads``: what the worker stored, never Prometheus itself): with Prometheus, only the
    alerts it raised count (alert labels are untrusted)."""
    asks = prom if reads else None
    return RunService(
        store, confirmer=AlertConfirmer(asks, clock) if asks is not None and
        policy.confirm_alerts else None, confirms=prom is not None and policy.confirm_alerts,
        history=NodeStateHistory(asks, tolerated_taints=policy.tolerated_taints)
        if asks is not None and policy.node_state_refresh > 0 else None, quarantine=quarantine,
        gap=timedelta(seconds=policy.incident_gap), restart_policy=policy.restart_policy,
        scheduler=policy.scheduler, wandb_enabled=wandb_enabled, records=records, clock=clock)


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
                 policy: DeliveryPolicy, prometheus: PrometheusClient | None = None,
                 clock: Callable[[], float] = time.time, seed: int | None = None) -> None:
        self.store, self.client, self.markers, self.links = store, client, markers, links
        self.metrics, self.policy, self.clock = metrics, policy, clock
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
        # /metrics' per-project GPU-hours, read from the store at each scrape (kept on restart)
        metrics.gpu_hours.source = store.gpu_hours_by_project
        self._next_refresh = 0.0
        # The quarantine's decisions, to show: the worker never acts (the receiver of untrusted
        # webhooks holds no scheduler rights; ``wandb-infra-bridge quarantine`` acts).
        self.quarantine = build_quarantine(policy.quarantine,
                                           Path(store.path).resolve().parent, acting=False)
        self.runs = run_service(store, prometheus, policy, self.quarantine, records=True,
                                wandb_enabled=client is not None, clock=clock)
        self.projector = Projector(
            store, self.runs, client=client, markers=markers, links=links, metrics=metrics,
            policy=policy, clock=clock, prometheus=prometheus)
        # Ended runs are judged on the alerts Prometheus confirmed, as every surface shows them.
        self.endings = (EndingsPass(store, RunEndings(prometheus, policy.endings),
                                    lambda run: list(self.runs.confirm(run, store.facts(run))
                                                     .confirmed),
                                    incident_gap=policy.incident_gap,
                                    deliver=client is not None,
                                    state=None if client is None else self._wandb_state)
                        if prometheus is not None and policy.endings is not None
                        and policy.endings.enabled else None)
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
        """Deliver what is due, refresh gauges, purge old data. Returns deliveries."""
        now = self.clock()
        if now < self._last_now - 1.0:
            self._clock_stepped_back(now)
        self._last_now = now
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
        if (self.runs.history is not None or self.quarantine is not None
                or self.projector.impact is not None) and now >= self._next_refresh:
            self._next_refresh = now + (self.policy.node_state_refresh or 60.0)
            if self.quarantine is not None:
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
            view = self.runs.judged(view)  # a late alert may change an ended run's verdict
            if self.client is None:  # no W&B projection: the pages still get the job log
                view = self.projector.read_job_log(view, None)
            stale = view.measured_at is None or (bool(view.diagnosis.open_issues) and \
                now - view.measured_at >= (self.policy.node_state_refresh or 60.0))
            if stale or set(view.impacts or {}) != {i.issue.key for i in view.issues}:
                view = self.projector.measure(view)
            row = view.delivery
            if self.client is None or now < self.paused_until or row is None or row.parked \
                    or not view.node_state_read or signature(view.remediations) == \
                    latest_signature(self.store.marks(run)):
                continue
            if not self._deliver(row):
                break
            delivered += 1
        return delivered

    def _deliver(self, row: OutboxRow) -> bool:
        """Project one run; False when W&B is failing transiently (stop this pass)."""
        assert self.client is not None
        run = row.run
        calls_before = self.client.calls
        try:
            storage_id, state, summary_seq = self.projector.project(row)
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
        wake = self.projector.settle_wake.pop(run, None)  # a marker settling, an alert pending
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
