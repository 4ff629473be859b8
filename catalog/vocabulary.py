"""Closed sets of label values used across rules, dashboards and the bridge (contract 2)."""

from __future__ import annotations

from enum import IntEnum

SEVERITIES: tuple[str, ...] = ("critical", "warning", "info")
CATEGORIES: tuple[str, ...] = (
    "gpu_hardware", "gpu_thermal", "gpu_interconnect", "network", "node", "workload", "pipeline",
    # the host around the GPUs (memory, power, chassis, local disks), the run's
    # filesystems, and the scheduler's or cloud's maintenance of a node.
    "host", "storage", "maintenance",
)

# Alert annotations that carry the Grafana deep-link target to the bridge.
ANNOTATION_DASHBOARD_UID = "dashboard_uid"
ANNOTATION_PANEL_ID = "panel_id"
# The rule's ``for`` in seconds: Prometheus stamps ``startsAt`` when an alert fires, this long
# after its condition began; the bridge subtracts it to place the issue at the fault's onset.
ANNOTATION_FOR_SECONDS = "for_seconds"
# History keys of the bridge's plot markers (bridge/projection/plan.py). No summary key the
# bridge writes has one of these names: where the server derives a run's summary from its history
# (it does for a shared-mode writer's rows), a shared name would let one overwrite the other.
MARKER_ISSUE = "infra/issue"  # 1 at an issue's onset, 0 at its end: the plotted series
MARKER_ALERT = "infra/issue_alert"  # the issue's root-cause alert
MARKER_CAUSE = "infra/issue_cause"  # its cause class (hardware, node_loss, ...)
MARKER_SUPERSEDED = "infra/issue_superseded"  # 1 on the end row of a replaced root cause
MARKER_KEYS: tuple[str, ...] = (MARKER_ISSUE, MARKER_ALERT, MARKER_CAUSE, MARKER_SUPERSEDED)

REQUIRED_ANNOTATIONS: tuple[str, ...] = (
    "summary", "description", "impact", "remediation", "runbook_url",
    ANNOTATION_DASHBOARD_UID, ANNOTATION_PANEL_ID,
)


class CauseClass(IntEnum):
    """Root-cause precedence: a lower value explains a higher one (hardware explains a stall)."""

    HARDWARE = 0
    # A node taken for maintenance (the scheduler's state or reason, a cloud's scheduled event):
    # it explains whatever follows on that host, and is never called a hardware fault.
    MAINTENANCE = 1
    NODE_LOSS = 2
    LINK_LOSS = 3
    # The host ran out of something a job needs: memory (an OOM kill), a filesystem (full,
    # read-only, not answering). It explains the NCCL errors and stalls that follow, but not a
    # later hardware fault.
    HOST_RESOURCE = 4
    DEGRADATION = 5
    SYMPTOM = 6


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
    "host": CauseClass.HARDWARE,
    "storage": CauseClass.HOST_RESOURCE,
    "maintenance": CauseClass.MAINTENANCE,
}
