"""How often each rule group is evaluated: the cost/latency trade-off in one place.

``FAST`` groups carry no ``interval`` and follow the global ``evaluation_interval`` (30 s
recommended): the job-ending signals (XIDs, InfiniBand/Ethernet link down, node down) and every
alert reading only sparse records. ``MEDIUM`` reads per-GPU telemetry whose alerts wait minutes
anyway (temperatures, clock events, stall inputs). ``SLOW`` reads the state gauges, violation
rates, GPU presence, target maps and pod rows. ``WEAR`` reads the error counters of parts that
degrade (ECC, retired pages, row remaps, PCIe/NVLink replays, InfiniBand errors and flaps):
their job-ending forms reach the alerts as XIDs or link-down on the fast path, so these counters
only need to be read a few times per 10-15 minute window; and what does not change within
minutes: the links and GPUs idle all hour, the runs whose GPUs are unknown, the stragglers.

A recorded sample vanishes from plain reads after the 5-minute lookback. Records of a tier up to
``SLOW`` are read as they are (4 minutes + evaluation time < lookback); records of a slower tier
are read by other groups and dashboards as ``last_over_time(record[interval + READ_MARGIN])``
(``generate.reading``, substituted for the record's placeholder in an alert's condition
template): the last evaluation's value until the next one has written,
without a gap that would reset the readers' ``for``. Those records are sparse (only faulty
entities), so the range read costs nothing. Alert groups run at ``SLOW`` at most, so ``ALERTS``
stays continuous for queries. Windows read at a tier are longer than its interval, so no counter
increase falls between two evaluations.
"""

from __future__ import annotations

FAST: str | None = None
MEDIUM = "3m"
SLOW = "4m"
WEAR = "8m"
LOOKBACK_SECONDS = 300
# Longest a group's evaluation may take before its records count as stale to readers.
READ_MARGIN = "1m"
# The range another group reads a ``WEAR`` record over (``generate.reading``).
WEAR_READ = f"{int(WEAR[:-1]) + int(READ_MARGIN[:-1])}m"
