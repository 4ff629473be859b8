"""Dashboards and their panels: uids, slugs, stable numeric panel ids, variable names.

Declared once here; ``dashboards/generate.py`` builds panels with exactly these ids and the bridge
builds deep links from them. Panel ids never change once released: add, never renumber.
"""

from __future__ import annotations

from dataclasses import dataclass

from wandb_infra.catalog.vocabulary import (
    ANNOTATION_DASHBOARD_UID,
    ANNOTATION_FOR_SECONDS,
    ANNOTATION_PANEL_ID,
)
from wandb_infra.common import labels


@dataclass(frozen=True)
class Dashboard:
    """A generated dashboard: uid and slug form the link path, variables its query string."""

    key: str
    uid: str
    slug: str
    title: str
    variables: tuple[str, ...]


@dataclass(frozen=True)
class Panel:
    """A panel an alert can link to; ``dashboards`` lists the dashboard keys that contain it."""

    key: str
    id: int
    title: str
    dashboards: tuple[str, ...]


RUN = Dashboard(
    key="run",
    uid="wandb-run-infra",
    slug="w-and-b-run-infrastructure",
    title="W&B run infrastructure",
    variables=("datasource", labels.ENTITY, labels.PROJECT, labels.RUN_ID, labels.HOSTNAME,
               labels.GPU),
)
NODE = Dashboard(
    key="node",
    uid="wandb-node-gpu-health",
    slug="node-gpu-health",
    title="Node GPU health",
    variables=("datasource", labels.HOSTNAME, labels.GPU),
)
PIPELINE = Dashboard(
    key="pipeline",
    uid="wandb-infra-pipeline",
    slug="w-and-b-infra-pipeline",
    title="W&B infra pipeline",
    variables=("datasource",),
)
DASHBOARDS: dict[str, Dashboard] = {d.key: d for d in (RUN, NODE, PIPELINE)}

_BOTH = ("run", "node")
PANELS: dict[str, Panel] = {
    p.key: p
    for p in (
        Panel("alerts", 1, "Firing and recent alerts", _BOTH),
        Panel("issue_timeline", 2, "Issue timeline", ("run",)),
        Panel("gpu_temperature", 10, "GPU temperature", _BOTH),
        Panel("hbm_temperature", 11, "HBM temperature", _BOTH),
        Panel("thermal_violation", 12, "Thermal violation (% of time throttled)", _BOTH),
        Panel("power_violation", 13, "Power violation (% of time throttled)", _BOTH),
        Panel("clock_events", 14, "Clock-event reasons (HW slowdown, thermal, power brake)", _BOTH),
        Panel("power_usage", 15, "Power draw", _BOTH),
        Panel("xid_errors", 20, "XID errors", _BOTH),
        Panel("ecc_errors", 21, "ECC errors and retired pages", _BOTH),
        Panel("row_remap", 22, "Row remapping (pending, failed, uncorrectable)", _BOTH),
        Panel("gpu_count", 23, "GPUs reporting per host", _BOTH),
        Panel("nvlink_errors", 30, "NVLink errors", _BOTH),
        Panel("pcie_replays", 31, "PCIe replays", _BOTH),
        Panel("tensor_activity", 40, "Tensor and engine activity (MFU proxy)", _BOTH),
        Panel("gpu_memory", 41, "GPU memory used", _BOTH),
        Panel("gpu_util_spread", 42, "Utilisation spread across the run's GPUs", ("run",)),
        Panel("ib_link_state", 50, "InfiniBand link state", _BOTH),
        Panel("ib_errors", 51, "InfiniBand error rates", _BOTH),
        Panel("net_interfaces", 52, "Ethernet/RoCE interfaces (up, carrier changes)", _BOTH),
        Panel("targets_up", 53, "Telemetry targets up (node_exporter, dcgm-exporter)", _BOTH),
        Panel("pipeline_targets", 60, "Exporter and bridge up; runs and hosts mapped",
              ("pipeline",)),
        Panel("pipeline_sources", 61, "Exporter sources: up and time since last success",
              ("pipeline",)),
        Panel("pipeline_delivery", 62, "Bridge delivery: queue, parked runs, backlog age, store",
              ("pipeline",)),
        # the host around the GPUs
        Panel("host_memory", 70, "Host memory: OOM kills, memory pressure, DIMM errors", _BOTH),
        Panel("filesystems", 71, "Run filesystems: free space, read-only, not answering", _BOTH),
        Panel("local_disks", 72, "Local disks (SMART, smartctl_exporter)", _BOTH),
        Panel("reboots", 73, "Reboots and maintenance", _BOTH),
        Panel("fabric", 74, "NVSwitch fatal errors and Fabric Manager status", _BOTH),
        Panel("power_chassis", 75, "Power and chassis sensors (IPMI)", _BOTH),
        Panel("repeat_offenders", 76, "Hardware-fault episodes (repeat offenders)",
              ("run", "node", "pipeline")),
    )
}


def panel(key: str) -> Panel:
    """Look up a panel by key; a KeyError here means a catalog entry names a missing panel."""
    return PANELS[key]


def dashboard_of(scope: str) -> Dashboard:
    """Where an alert of ``scope`` links: run-scoped alerts to the run dashboard, this project's
    own pipeline to its dashboard, all others to the node dashboard."""
    if scope == "pipeline":
        return PIPELINE
    return RUN if scope == "run" else NODE


def link_annotations(scope: str, panel_key: str, for_seconds: int) -> dict[str, str]:
    """The annotations that place an alert, decided here once for the rules, the live bridge
    and ``explain``: the dashboard (``dashboard_of``), the panel, and the rule's ``for`` so the
    issue starts at the fault's onset rather than when the alert fired."""
    dashboard = dashboard_of(scope)
    out = {ANNOTATION_DASHBOARD_UID: dashboard.uid, ANNOTATION_PANEL_ID: str(panel(panel_key).id)}
    if for_seconds:
        out[ANNOTATION_FOR_SECONDS] = str(for_seconds)
    return out
