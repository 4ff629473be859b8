"""Closed sets of label values used across rules, dashboards and the bridge (contract 2)."""

from __future__ import annotations

from enum import IntEnum

SEVERITIES: tuple[str, ...] = ("critical", "warning", "info")
CATEGORIES: tuple[str, ...] = (
    "gpu_hardware", "gpu_thermal", "gpu_interconnect", "network", "node", "workload", "pipeline",
)

# Alert annotations that carry the Grafana deep-link target to the bridge.
ANNOTATION_DASHBOARD_UID = "dashboard_uid"
ANNOTATION_PANEL_ID = "panel_id"
# The rule's ``for`` in seconds: Prometheus stamps ``startsAt`` when an alert fires, this long
# after its condition began; the bridge subtracts it to place the issue at the fault's onset.
ANNOTATION_FOR_SECONDS = "for_seconds"
REQUIRED_ANNOTATIONS: tuple[str, ...] = (
    "summary", "description", "impact", "remediation", "runbook_url",
    ANNOTATION_DASHBOARD_UID, ANNOTATION_PANEL_ID,
)


class CauseClass(IntEnum):
    """Root-cause precedence: a lower value explains a higher one (hardware explains a stall)."""

    HARDWARE = 0
    NODE_LOSS = 1
    LINK_LOSS = 2
    DEGRADATION = 3
    SYMPTOM = 4


# Fallback when an alert is not in the catalog (a user's own rule routed to the bridge).
CATEGORY_DEFAULT_CAUSE: dict[str, CauseClass] = {
    "gpu_hardware": CauseClass.HARDWARE,
    "node": CauseClass.NODE_LOSS,
    "network": CauseClass.LINK_LOSS,
    "gpu_interconnect": CauseClass.DEGRADATION,
    "gpu_thermal": CauseClass.DEGRADATION,
    "workload": CauseClass.SYMPTOM,
    # This project's own telemetry path; never on a run, so never a run's root cause.
    "pipeline": CauseClass.SYMPTOM,
}
