"""Finding ended runs and reading their coverage from Prometheus: the HTTP edge of verdicts.

Why this shape: the cost must grow with the runs that end, not with the runs that exist. Each
pass asks one instant question over a short window (the runs whose join series were present in
the window before the grace period and are gone within it: ``unless``), so only ended runs come
back; after a restart the first pass looks back ``lookback`` (runs that ended while the bridge
was down). Each ended run then costs four range queries over its own hosts: its placement (the
join metrics, as ``explain``), its exporters' ``up`` joined to the target maps, and its GPUs'
presence record.

A verdict is final only when two witnesses say the run ended: its join series gone (asked at
Prometheus' own time, so a bridge clock running ahead never ends a live run) and its W&B state
(finished, failed, crashed, or no such run in W&B). A run the join series alone say ended
waits while W&B says it runs; without W&B to ask, the join series' verdict is given but stays
provisional. An ending with one witness is withdrawn, verdict and all, when the run's join
series come back (an exporter outage, a registration that expired and was renewed).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta

from wandb_infra.bridge.diagnosis.coverage import Coverage, judge
from wandb_infra.bridge.diagnosis.outcome import Outcome
from wandb_infra.bridge.diagnosis.outcome import judge as judge_outcome
from wandb_infra.bridge.diagnosis.root_cause import AlertFact, diagnose
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.prometheus.client import PrometheusClient, PrometheusError, regex_literal
from wandb_infra.bridge.prometheus.history import Placement, find_placement, pick_step
from wandb_infra.catalog import series as S
from wandb_infra.common import labels as L
from wandb_infra.common.logsetup import log_fields
from wandb_infra.common.runkey import RunKey

log = logging.getLogger(__name__)

RUN_LABELS = f"{L.ENTITY}, {L.PROJECT}, {L.RUN_ID}"
JOIN_GONE = "join series gone"
WANDB_ENDED = frozenset({"finished", "failed", "crashed"})  # W&B states of a run that ended
NOT_IN_WANDB = "no such run in W&B"
PRESENCE_CHUNK = 100  # runs per presence query (a run-id regex per run)
UNCONFIRMED_PER_PASS = 500  # one-witness endings re-checked per pass, newest first


@dataclass(frozen=True)
class EndingsPolicy:
    """When a run counts as ended and how its coverage is read (seconds)."""

    enabled: bool = True
    grace: float = 300.0  # join series absent this long: the run ended
    interval: float = 60.0  # how often the bridge looks for ended runs
    lookback: float = 86400.0  # on start, runs that ended this far back are judged too
    max_run: float = 7 * 86400.0  # how far before its end a run's start is looked for
    step: float = 30.0  # finest coverage step (the scrape interval)
    per_pass: int = 100  # runs judged per pass at most (the rest wait for the next)


def host_matcher(hosts: Iterable[str]) -> str:
    """``hostname=~"a|b"`` with every name a literal."""
    return f'{L.HOSTNAME}=~"{"|".join(regex_literal(h) for h in sorted(hosts))}"'


def vanished_query(window: float, grace: float) -> str:
    """Runs with a join sample in the ``window`` before the last ``grace`` seconds and none in
    those ``grace`` seconds (range selections skip staleness markers). The window is rounded
    up: rounded to the nearest second, up to half a second between passes was never searched,
    and a run whose last sample fell there never got a verdict."""
    return (f"group by ({RUN_LABELS}) (last_over_time({L.NODE_INFO}"
            f"[{math.ceil(window + grace)}s])) "
            f"unless on ({RUN_LABELS}) "
            f"group by ({RUN_LABELS}) (last_over_time({L.NODE_INFO}[{grace:.0f}s]))")


def present_query(runs: Iterable[RunKey], grace: float) -> str:
    """The runs among ``runs`` with a join sample in the last ``grace`` seconds."""
    ids = "|".join(regex_literal(r.run_id) for r in sorted(set(runs)))
    return (f"group by ({RUN_LABELS}) (last_over_time({L.NODE_INFO}"
            f'{{{L.RUN_ID}=~"{ids}"}}[{grace:.0f}s]))')


def targets_query(hosts: Iterable[str], step: float) -> str:
    """Each host's exporters: 1 where a scrape succeeded within the last two steps, 0 where every
    scrape failed, absent where the target was not scraped at all (gone from discovery). One
    failed scrape blinds no rule (counters carry the fault to the next scrape, and every alert
    holds longer than a scrape interval), so it is no gap; two in a row are."""
    return (f"min by ({L.HOSTNAME}, {S.TARGET_LABEL}) (max_over_time(up[{2 * step:.0f}s]) "
            f"* on (instance, job) group_left ({L.HOSTNAME}, {S.TARGET_LABEL}) "
            f"{S.TARGET_HOSTS}{{{host_matcher(hosts)}}})")


def gpus_query(hosts: Iterable[str]) -> str:
    """Every GPU dcgm-exporter reported on the hosts (the dense presence record)."""
    return f"max by ({L.HOSTNAME}, {L.GPU}) ({S.GPU_PRESENT}{{{host_matcher(hosts)}}})"


def _run(metric: dict[str, str]) -> RunKey:
    return RunKey(metric.get(L.ENTITY, ""), metric.get(L.PROJECT, ""), metric.get(L.RUN_ID, ""))


class RunEndings:
    """Asks Prometheus which runs ended and what was seen of them."""

    def __init__(self, prom: PrometheusClient, policy: EndingsPolicy) -> None:
        self.prom, self.policy = prom, policy
        self.queries = 0  # Prometheus queries made (bench and /metrics figures)

    def now(self) -> float:
        """Prometheus' clock (``time()`` evaluated at its now): endings are judged by it, not
        by the bridge's."""
        self.queries += 1
        return self.prom.now()

    def present(self, runs: Iterable[RunKey], now: float) -> set[RunKey]:
        """Those of ``runs`` whose join series have a sample within the grace before ``now``."""
        wanted, found = sorted(set(runs)), set[RunKey]()
        for start in range(0, len(wanted), PRESENCE_CHUNK):
            chunk = wanted[start:start + PRESENCE_CHUNK]
            self.queries += 1
            found.update(_run(s["metric"]) for s in self.prom.instant(
                present_query(chunk, self.policy.grace), now))
        return found & set(wanted)

    def vanished(self, since: float, now: float) -> list[RunKey]:
        """Runs whose join series disappeared between ``since - grace`` and ``now - grace``."""
        window = max(self.policy.step, now - since)
        self.queries += 1
        found = self.prom.range(vanished_query(window, self.policy.grace), now, now, 1.0)
        return sorted({r for r in map(_run, (s["metric"] for s in found)) if r.attributed})

    def placement(self, run: RunKey, ended_at: float) -> Placement | None:
        """Where and when the run ran (None: Prometheus no longer holds its join series)."""
        self.queries += 2
        start, end = ended_at - self.policy.max_run, ended_at + self.policy.step
        try:
            found = find_placement(self.prom, run, start, end, self.policy.step)
        except PrometheusError as exc:
            if "no " + L.NODE_INFO in str(exc):
                return None
            raise
        coarse = pick_step(start, end, self.policy.step)
        if coarse <= self.policy.step:
            return found
        # a long search window reads coarsely: the run's own span again at the finest step
        self.queries += 2
        return find_placement(self.prom, run, max(start, found.first_seen - coarse),
                              min(end, found.last_seen + coarse), self.policy.step)

    def coverage(self, placement: Placement) -> Coverage:
        """What the rules could see of the run's hosts and GPUs over its lifetime."""
        start, end = placement.first_seen, max(placement.last_seen, placement.first_seen)
        step = pick_step(start, end, self.policy.step)
        hosts = sorted(placement.hosts)
        self.queries += 2
        targets: dict[tuple[str, str], list[float]] = {}
        for s in self.prom.range(targets_query(hosts, step), start, end, step):
            key = (s["metric"].get(L.HOSTNAME, ""), s["metric"].get(S.TARGET_LABEL, ""))
            targets.setdefault(key, []).extend(
                float(ts) for ts, value in s["values"] if float(value) >= 1)
        present: dict[tuple[str, str], list[float]] = {}
        for s in self.prom.range(gpus_query(hosts), start, end, step):
            key = (s["metric"].get(L.HOSTNAME, ""), s["metric"].get(L.GPU, ""))
            present.setdefault(key, []).extend(float(ts) for ts, _ in s["values"])
        return judge(hosts, placement.gpus, start=start, end=end, step=step, targets=targets,
                     present=present)



SCAN = "endings"  # the store's scan cursor for ended runs
RETRY = 300.0  # a run Prometheus could not answer for is tried again after this


class EndingsPass:
    """One pass of the verdict work, driven by the delivery worker: find the runs that ended
    since the last pass (or within ``lookback`` on the first), gather a second witness for the
    ones with one (or withdraw them when their join series are back), then judge at most
    ``per_pass`` of the pending ones. Everything is kept in the store, so a restart resumes.
    ``state`` answers a run's W&B state (None: W&B has no such run); without it there is no
    second witness to ask."""

    def __init__(self, store: Store, endings: RunEndings,
                 facts: Callable[[RunKey], list[AlertFact]], *, incident_gap: float,
                 deliver: bool, state: Callable[[RunKey], str | None] | None = None) -> None:
        self.store, self.endings, self.facts = store, endings, facts
        self.incident_gap = timedelta(seconds=incident_gap)
        self.deliver, self.state = deliver, state
        self.next_pass = 0.0
        self.judged = 0
        self.withdrawn = 0

    def due(self, now: float) -> bool:
        """Whether a pass should run now."""
        return now >= self.next_pass

    def run(self, now: float) -> int:
        """Find and judge; returns how many runs were judged. Raises what Prometheus raised
        when the search itself failed (the cursor then stays, nothing is lost). ``now`` is the
        bridge's clock, used only to schedule retries; Prometheus' clock decides endings."""
        policy = self.endings.policy
        self.next_pass = now + policy.interval
        prom_now = self.endings.now()
        since = max(self.store.scanned_to(SCAN) or 0.0, prom_now - policy.lookback)
        if prom_now - since >= 1.0:
            found = self.endings.vanished(since, prom_now)
            self.store.add_endings([(run, prom_now - policy.grace, JOIN_GONE) for run in found],
                                   now)
            self.store.set_scanned_to(SCAN, prom_now)
        self._witness(prom_now, now)
        judged = 0
        for ending in self.store.pending_endings(now, policy.per_pass):
            witnesses = self.store.witnesses(ending.run) or [ending.how]
            if len(witnesses) < 2 and self.state is not None:
                self.store.ending_failed(ending.run, now + policy.interval,
                                         f"only one witness ({witnesses[0]}): waiting for "
                                         "another")
                continue
            try:
                outcome = self.judge(ending.run, ending.ended_at, " and ".join(witnesses))
            except PrometheusError as exc:
                self.store.ending_failed(ending.run, now + RETRY, str(exc))
                log.warning("cannot judge an ended run yet", extra=log_fields(
                    run=ending.run.path(), error=str(exc)[:300]))
                continue
            self.store.record_outcome(ending.run, outcome.verdict, outcome.dumps(), now,
                                      deliver=self.deliver)
            judged += 1
        self.judged += judged
        return judged

    def _witness(self, prom_now: float, now: float) -> None:
        """For each ending with one witness: withdraw it if the run's join series are back,
        add the join series' absence to a W&B ending, ask W&B about a join-series ending."""
        policy = self.endings.policy
        unconfirmed = self.store.unconfirmed_endings(prom_now - policy.lookback,
                                                     UNCONFIRMED_PER_PASS)
        if not unconfirmed:
            return
        present = self.endings.present([e.run for e in unconfirmed], prom_now)
        for ending in unconfirmed:
            witnesses = self.store.witnesses(ending.run) or [ending.how]
            if ending.run in present:
                if JOIN_GONE in witnesses:  # it was alive after all
                    self.store.withdraw_ending(ending.run, now)
                    self.withdrawn += 1
                    log.warning("ended run seen again: its ending and verdict are withdrawn",
                                extra=log_fields(run=ending.run.path()))
                continue
            if JOIN_GONE not in witnesses:
                self.store.add_endings([(ending.run, prom_now - policy.grace, JOIN_GONE)], now)
            elif self.state is not None:
                try:
                    state = self.state(ending.run)
                except Exception as exc:
                    log.info("W&B state of an ended run not known yet", extra=log_fields(
                        run=ending.run.path(), error=f"{type(exc).__name__}: {exc}"[:300]))
                    continue
                if state is None or state in WANDB_ENDED:
                    how = NOT_IN_WANDB if state is None else f"W&B state {state}"
                    self.store.add_endings([(ending.run, prom_now - policy.grace, how)], now)

    def judge(self, run: RunKey, ended_at: float, how: str) -> Outcome:
        """The run's verdict from its stored alerts and its coverage in Prometheus."""
        placement = self.endings.placement(run, ended_at)
        coverage = None if placement is None else self.endings.coverage(placement)
        end = coverage.end if coverage is not None else ended_at
        return judge_outcome(diagnose(self.facts(run), self.incident_gap), coverage, end, how)
