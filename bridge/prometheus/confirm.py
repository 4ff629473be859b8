"""Whether Prometheus itself raised an alert: alert labels are untrusted input.

Alertmanager's API takes alerts from anyone who can reach it. The rules attribute each alert to
its run in PromQL, so the bridge checks only that Prometheus raised it: an alert is confirmed
when ``ALERTS{alertstate="firing"}`` holds a series of its name whose every label the alert
carries with the same value, within ``BEFORE``/``AFTER`` of its ``startsAt`` (labels added on the
way, such as external labels, do not matter). One instant query per run and time cluster, newest
first, at most ``MAX_QUERIES`` per look (so old forged alerts cannot hold back a real one); the
caller stores the final answers and hands them back as ``known``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from wandb_infra.bridge.diagnosis.root_cause import AlertFact
from wandb_infra.bridge.prometheus.client import (
    PrometheusClient,
    PrometheusError,
    quote,
    regex_literal,
)
from wandb_infra.common import labels as L

log = logging.getLogger(__name__)

# ALERTS carries the firing sample from the evaluation that sent the alert (its ``startsAt``);
# the margins cover an HA pair's two evaluations and remote-write delays (vmalert).
BEFORE, AFTER = 300.0, 120.0
CLUSTER = 1800.0  # alerts starting within this span share one query
MAX_QUERIES = 16  # per look at a run (newest clusters first)
_IGNORED = frozenset({"__name__", "alertstate"})


@dataclass(frozen=True)
class Confirmation:
    """A run's alerts split by what Prometheus said: raised, not raised (with the reason), not
    seen yet while the alert's window is still open (``pending``: asked again later), and not
    answered (Prometheus down)."""

    confirmed: tuple[AlertFact, ...]
    refused: tuple[tuple[AlertFact, str], ...] = ()
    pending: tuple[AlertFact, ...] = ()
    unanswered: tuple[AlertFact, ...] = ()
    checked: bool = True  # False: no Prometheus to ask, every alert is taken as it came
    asked: bool = True  # False: answers as stored; ``unanswered`` were not asked about yet

    @staticmethod
    def unchecked(facts: Sequence[AlertFact]) -> Confirmation:
        """Without Prometheus: nothing refused, nothing confirmed by it either."""
        return Confirmation(tuple(facts), checked=False)


def matches(series: Mapping[str, str], fact: AlertFact) -> bool:
    """Every label of Prometheus' series is on the alert with the same value."""
    labels = {**fact.labels, "alertname": fact.alertname}
    return all(labels.get(k) == v for k, v in series.items() if k not in _IGNORED)


class AlertConfirmer:
    """Asks Prometheus' ``ALERTS`` series whether it raised each alert."""

    def __init__(self, prom: PrometheusClient, clock: Callable[[], float]) -> None:
        self.prom, self.clock = prom, clock

    def confirm(self, facts: Sequence[AlertFact],
                known: Mapping[tuple[str, datetime], str] | None = None) -> Confirmation:
        """Split ``facts`` (one run's alerts) into confirmed, refused, pending and unanswered;
        ``known`` holds final answers given before ((fingerprint, start) -> "" raised, else
        why not): those alerts are not asked about again."""
        known = known or {}
        answers: dict[int, str | bool | None] = {
            id(f): known[(f.fingerprint, f.starts_at)] for f in facts
            if (f.fingerprint, f.starts_at) in known}
        todo = [f for f in facts if id(f) not in answers]
        for n, cluster in enumerate(reversed(_clusters(todo))):
            answers.update(self._ask(cluster) if n < MAX_QUERIES
                           else dict.fromkeys(map(id, cluster), False))
        confirmed, refused, pending, unanswered = [], [], [], []
        for fact in facts:
            answer = answers.get(id(fact))
            if answer is None:
                unanswered.append(fact)
            elif answer is False:
                pending.append(fact)
            elif isinstance(answer, str) and answer:
                refused.append((fact, answer))
            else:
                confirmed.append(fact)
        return Confirmation(tuple(confirmed), tuple(refused), tuple(pending), tuple(unanswered))

    def _ask(self, cluster: list[AlertFact]) -> dict[int, str | bool | None]:
        """One query for alerts starting close together: "" raised, the reason it was not,
        False not seen while its window is open, None unanswered."""
        now = self.clock()
        start = min(f.starts_at.timestamp() for f in cluster) - BEFORE
        end = max(f.starts_at.timestamp() for f in cluster) + AFTER
        at = min(end, now)
        names = "|".join(sorted({regex_literal(f.alertname) for f in cluster}))
        # the run labels every alert of the cluster shares narrow the read to the run's own
        shared = {k: v for k, v in cluster[0].labels.items() if k in L.RUN_LABELS
                  and all(f.labels.get(k) == v for f in cluster)}
        where = "".join(f",{k}={quote(v)}" for k, v in sorted(shared.items()))
        expr = (f'max_over_time(ALERTS{{alertstate="firing",alertname=~"{names}"{where}}}'
                f"[{max(1.0, at - start):.0f}s])")
        try:
            raised = [s.get("metric", {}) for s in self.prom.instant(expr, at)]
        except PrometheusError as exc:
            log.warning("alert confirmation not answered: %s", str(exc)[:200])
            return {id(f): None for f in cluster}
        out: dict[int, str | bool | None] = {}
        for fact in cluster:
            if any(matches(series, fact) for series in raised):
                out[id(fact)] = ""
            elif end <= now:
                at_text = fact.starts_at.strftime("%Y-%m-%d %H:%M:%S")
                out[id(fact)] = (f"Prometheus raised no firing {fact.alertname} with this "
                                 f"alert's labels around its start, {at_text} UTC (sent to "
                                 "Alertmanager by someone else, or relabelled on the way)")
            else:  # its series may not be written yet (remote write): asked again later
                out[id(fact)] = False
        return out


def _clusters(facts: list[AlertFact]) -> list[list[AlertFact]]:
    """Alerts grouped by start time, each group spanning at most ``CLUSTER`` seconds."""
    out: list[list[AlertFact]] = []
    for fact in sorted(facts, key=lambda f: f.starts_at):
        if out and (fact.starts_at - out[-1][0].starts_at).total_seconds() <= CLUSTER:
            out[-1].append(fact)
        else:
            out.append([fact])
    return out
