"""Names of the exporter's and the bridge's own metrics that the pipeline alerts and dashboard
read. The services define them (``exporter/collector.py``, ``bridge/metrics.py``); a test checks
that each name here is on their real ``/metrics``."""

from __future__ import annotations

from wandb_infra.common import labels

_EXPORTER = labels.SELF_METRIC_PREFIX
BRIDGE_PREFIX = "wandb_infra_bridge_"

EXPORTER_SOURCE_UP = _EXPORTER + "source_up"
EXPORTER_SOURCE_LAST_SUCCESS = _EXPORTER + "source_last_success_timestamp_seconds"
EXPORTER_RUNS = _EXPORTER + "runs"
EXPORTER_HOSTS = _EXPORTER + "hosts"

BRIDGE_QUEUE_RUNS = BRIDGE_PREFIX + "queue_runs"
BRIDGE_OLDEST_UNDELIVERED = BRIDGE_PREFIX + "oldest_undelivered_seconds"
BRIDGE_PARKED_RUNS = BRIDGE_PREFIX + "parked_runs"
BRIDGE_STORE_WRITABLE = BRIDGE_PREFIX + "store_writable"
BRIDGE_LAST_WANDB_SUCCESS = BRIDGE_PREFIX + "last_wandb_success_timestamp_seconds"

EXPORTER_METRICS = (EXPORTER_SOURCE_UP, EXPORTER_SOURCE_LAST_SUCCESS, EXPORTER_RUNS,
                    EXPORTER_HOSTS)
BRIDGE_METRICS = (BRIDGE_QUEUE_RUNS, BRIDGE_OLDEST_UNDELIVERED, BRIDGE_PARKED_RUNS,
                  BRIDGE_STORE_WRITABLE, BRIDGE_LAST_WANDB_SUCCESS)
