"""What Prometheus shows of a faulty host, as plain data: its GPUs' UUIDs and the driver's
recovery action, its boot time and GPU count, and its scheduler state over time
(``prometheus/remediation.py`` reads them; ``need.py`` and ``verdict.py`` decide from them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from wandb_infra.common.nodestate import schedulable


@dataclass(frozen=True)
class GpuEvidence:
    """One GPU over the history window: its UUIDs in order of appearance (the last is current,
    empty when it is not reporting now) and the driver's recovery action as (time, value)
    changes, 0 where the sparse record had no series while the GPU reported."""

    uuids: tuple[str, ...] = ()
    reporting: bool = True
    driver: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True)
class HostEvidence:
    """A host's boot time now, its GPU count now and at the start of the window, its GPUs, and
    its hardware-fault episodes in the repeat window when that makes it a repeat offender
    (``HostRepeatOffender``'s own condition; 0 otherwise)."""

    boot_time: float | None = None
    gpus_now: int | None = None
    gpus_before: int | None = None
    gpus: Mapping[str, GpuEvidence] = field(default_factory=dict)
    repeat_episodes: int = 0


@dataclass(frozen=True)
class Change:
    """A host's scheduler state from ``at`` on (``state`` empty: no data then)."""

    at: float
    scheduler: str
    state: str
    reason: str

    @property
    def in_pool(self) -> bool:
        """True when new jobs may start on the host in this state."""
        return bool(self.state) and schedulable(self.scheduler, self.state)


@dataclass(frozen=True)
class Timeline:
    """One host's state changes, oldest first; ``current`` is None when there is no data now."""

    hostname: str
    changes: tuple[Change, ...]
    current: Change | None
