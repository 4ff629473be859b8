"""How often each rule group is evaluated: the cost/latency trade-off in one place.

``FAST`` groups carry no ``interval`` and follow the global ``evaluation_interval`` (30 s
recommended): the job-ending signals (XIDs, InfiniBand/Ethernet link down, node down) and every
alert reading only sparse records. ``MEDIUM`` reads per-GPU telemetry whose alerts wait minutes
anyway (temperatures, violation and error rates over 5 minutes, stall inputs). ``SLOW`` reads
the state gauges and counters over 10-15 minute windows and the 1-hour histories.

Every recorded series is read by alerts in other groups, so no interval may reach the 5-minute
lookback (a sample older than that vanishes and would reset the readers' ``for``): the slowest
tier stays at 4 minutes. Windows read at a tier are longer than its interval, so no counter
increase falls between two evaluations.
"""

from __future__ import annotations

FAST: str | None = None
MEDIUM = "3m"
SLOW = "4m"
LOOKBACK_SECONDS = 300
