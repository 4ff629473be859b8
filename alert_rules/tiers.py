"""How often each rule group is evaluated: the cost/latency trade-off in one place.

``FAST`` groups carry no ``interval`` and follow the global ``evaluation_interval`` (30 s
recommended): the job-ending signals (XIDs, InfiniBand/Ethernet link down, node down) and every
alert reading only sparse records. ``MEDIUM`` reads per-GPU telemetry whose alerts wait minutes
anyway (temperatures, clock events, stall inputs). ``SLOW`` reads the state gauges, violation
rates, GPU presence and target maps. ``WEAR`` reads the error counters of parts that
degrade (ECC, retired pages, row remaps, PCIe/NVLink replays, InfiniBand errors and flaps):
their job-ending forms reach the alerts as XIDs or link-down on the fast path, so these counters
only need to be read a few times per 10-15 minute window; and what does not change within
minutes or arrives on a faster path too: the links and GPUs idle all hour, where each run is
(its pods' GPUs, the runs whose GPUs are unknown), the stragglers, the GPUs gone within the hour
(a host's GPU count drops at ``SLOW``, an XID 79 on the fast path).

A recorded sample vanishes from plain reads after the 5-minute lookback. Records of a tier up to
``SLOW`` are read as they are (4 minutes + evaluation time < lookback); records of a slower tier
are read by other groups and dashboards as ``last_over_time(record[interval + READ_MARGIN])``
(``reading``, substituted for the record's placeholder in an alert's condition
template): the last evaluation's value until the next one has written,
without a gap that would reset the readers' ``for``. Those records are sparse (only faulty
entities), so the range read costs nothing. Alert groups run at ``SLOW`` at most, so ``ALERTS``
stays continuous for queries. Windows read at a tier are longer than its interval, so no counter
increase falls between two evaluations.
"""

from __future__ import annotations

from wandb_infra.catalog.alerts import duration_seconds

FAST: str | None = None
MEDIUM = "3m"
SLOW = "4m"
WEAR = "8m"
LOOKBACK_SECONDS = 300
# Longest a group's evaluation may take before its records count as stale to readers.
READ_MARGIN = "1m"


def tier_seconds(tier: str | None) -> float:
    """A tier's interval in seconds (0 for the global interval)."""
    return duration_seconds(tier) if tier else 0.0


def duration(seconds: float) -> str:
    """Seconds as a Prometheus duration (``540`` -> ``9m``)."""
    return f"{seconds / 60:g}m" if seconds % 60 == 0 else f"{seconds:g}s"


def read_window(tier: str | None) -> float:
    """How old a record of ``tier`` can be when read: its interval plus the evaluation margin."""
    return tier_seconds(tier) + duration_seconds(READ_MARGIN)


def outlives_lookback(tier: str | None) -> bool:
    """Whether a record of ``tier`` can be older than the lookback when read."""
    return read_window(tier) > LOOKBACK_SECONDS


def reading(record: str, tier: str | None) -> str:
    """How another group reads ``record``: by name, or, when its tier is slower than the lookback
    allows, as ``last_over_time(record[interval + margin])``, the last evaluation's value until
    the next one has written."""
    if not outlives_lookback(tier):
        return record
    return f"last_over_time({record}[{duration(read_window(tier))}])"
