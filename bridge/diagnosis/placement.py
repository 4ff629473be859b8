"""Which of a run's alerts the join metrics confirm: alert labels are untrusted input.

Alertmanager accepts alerts from anyone who can reach it and delivers them to the bridge with its
own valid credentials, so a forged ``wandb_run_id`` label could otherwise write into any run the
W&B key reaches. With Prometheus configured, an alert counts for a run only if the exporter's
``wandb_run_node_info`` put that run on the alert's host when the alert began; the others are left
out of what is written (and a run with none left is parked, visible in ``/runs``). Answers are
remembered per alert instance: a placement does not change after the fact.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from wandb_infra.bridge.diagnosis.root_cause import AlertFact
from wandb_infra.common.runkey import RunKey

MAX_REMEMBERED = 100_000


class Placer(Protocol):
    """What the check asks (``PrometheusRunLookup.placed``)."""

    def placed(self, run: RunKey, hostname: str, at: datetime) -> bool | None: ...


@dataclass(frozen=True)
class Placement:
    """A run's confirmed alerts, the refused ones, and whether Prometheus could not answer."""

    confirmed: tuple[AlertFact, ...]
    refused: tuple[AlertFact, ...]
    unanswered: bool

    def reason(self, run: RunKey) -> str:
        """Why nothing of the run is written (for /runs)."""
        hosts = ", ".join(sorted({f.hostname or "no host" for f in self.refused})[:5])
        return (f"not written: the join metrics never placed {run.path()} on {hosts} when its "
                "alerts began (forged or mislabelled run labels?)")


class PlacementCheck:
    """Confirms alerts against the join metrics, remembering each alert instance's answer."""

    def __init__(self, placer: Placer) -> None:
        self.placer = placer
        self._lock = threading.Lock()
        self._known: dict[tuple[RunKey, str, str], bool] = {}

    def check(self, run: RunKey, facts: Sequence[AlertFact]) -> Placement:
        """Split ``facts`` into confirmed and refused; an alert without a host cannot be placed
        and is refused; an unanswered one is neither (``unanswered``: try again later)."""
        confirmed: list[AlertFact] = []
        refused: list[AlertFact] = []
        unanswered = False
        for fact in facts:
            key = (run, fact.fingerprint, fact.starts_at.isoformat())
            with self._lock:
                known = self._known.get(key)
            if known is None:
                known = self.placer.placed(run, fact.hostname, fact.starts_at) \
                    if fact.hostname else False
                if known is None:
                    unanswered = True
                    continue
                with self._lock:
                    if len(self._known) >= MAX_REMEMBERED:
                        self._known.clear()
                    self._known[key] = known
            (confirmed if known else refused).append(fact)
        return Placement(tuple(confirmed), tuple(refused), unanswered)
