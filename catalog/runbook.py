"""The runbook: one entry per alert (meaning, impact, how to confirm, what to do), as plain data.

Rendered twice from this one source: as Markdown into ``docs/runbook.md`` by the rule generator,
and as a page the bridge serves at ``PATH``. Alerts link to it through their ``runbook_url``
annotation, ``<base>/runbook#<anchor>``, where the base is the bridge's URL as operators reach it
(``alert_rules`` option ``runbook_base``); the default is the in-cluster Service of
``deploy/kubernetes/bridge.yaml``, so the link resolves wherever the shipped manifests run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from wandb_infra.catalog import panels
from wandb_infra.catalog.alerts import ALERTS, AlertDef
from wandb_infra.catalog.recovery import SPECS, Action
from wandb_infra.catalog.xid import CATALOG_URL, XIDS, XidClass

PATH = "/runbook"
# The bridge's Service in deploy/kubernetes/bridge.yaml (name.namespace.svc:port); a test checks
# the manifest still says so.
DEFAULT_BASE = "http://wandb-infra-bridge.monitoring.svc:9461"

# How to confirm a fault of each category on the node itself.
CONFIRM = {
    "gpu_hardware": "`nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT` on the node; "
                    "`dmesg | grep -i xid`; `dcgmi health -c`.",
    "gpu_thermal": "`nvidia-smi -q -d TEMPERATURE,PERFORMANCE` (clock event reasons); the "
                   "node's BMC inlet temperature and fan status.",
    "gpu_interconnect": "`nvidia-smi nvlink -e` and `nvidia-smi -q -d PCIE`; "
                        "`dcgmi diag -r 2`.",
    "network": "`ibstat` / `ibstatus` and `perfquery` for InfiniBand; `ip link` and "
               "`ethtool -S <iface>` for Ethernet/RoCE; the switch port's counters.",
    "node": "ping the node and check its BMC; `curl <target>/metrics` for the exporter; "
            "Prometheus' Targets page.",
    "workload": "the run's W&B system metrics and logs; `py-spy dump --pid <rank>`; "
                "`NCCL_DEBUG=INFO` output of the ranks.",
    "pipeline": "the exporter's or bridge's `/metrics`, `/healthz`, `/readyz` and its log (one "
                "structured line per event); the bridge's `/runs` page for parked runs.",
    "host": "`dmesg -T | grep -iE 'oom|edac|mce|i/o error'`, `free -g`, "
            "`cat /proc/pressure/memory`, `edac-util -v`; `smartctl -a <disk>`; the BMC's "
            "sensors and SEL (`ipmitool sdr elist`, `ipmitool sel list`).",
    "storage": "`findmnt -o TARGET,OPTIONS <mount>` (ro?), `df -h <mount>`, `stat -f <mount>` "
               "(hangs when not answering), `nfsstat -m` / `mountstats`; dmesg for the I/O "
               "error.",
    "maintenance": "`scontrol show node <node>` (State, Reason) and `scontrol show res`; "
                   "`kubectl describe node <node>` (taints, conditions); the cloud's host "
                   "events.",
}


_TEMPLATE = re.compile(r"\{\{\s*\$(?:labels\.(\w+)|(value))[^}]*\}\}")


def placeholders(text: str) -> str:
    """Alert templates as the reader's placeholders: ``{{ $labels.gpu }}`` becomes "gpu" in angle
    quotes, ``{{ $value | humanize }}`` "value" (the runbook documents every alert, not one
    firing), in docs/runbook.md and on the bridge's page alike."""
    return _TEMPLATE.sub(lambda m: f"‹{m.group(1) or m.group(2)}›", text)


def anchor(name: str) -> str:
    """An alert's anchor (lower case, as GitHub renders the Markdown heading)."""
    return name.lower()


def url(base: str, name: str) -> str:
    """The ``runbook_url`` of an alert for a runbook served at ``base``."""
    return f"{base.rstrip('/')}{PATH}#{anchor(name)}"


@dataclass(frozen=True)
class Entry:
    """What an on-call engineer reads about one alert."""

    alert: AlertDef
    anchor: str
    raised: str
    confirm: str
    needs: str

    @property
    def name(self) -> str:
        """The alert's name (the entry's heading)."""
        return self.alert.name


def entry(alert: AlertDef) -> Entry:
    """The runbook entry of one alert."""
    panel, dash = panels.panel(alert.panel), panels.dashboard_of(alert.scope)
    raised = (f"Severity `{alert.severity}`, category `{alert.category}`, raised per "
              f"{alert.scope}" + (f" after {alert.for_}" if alert.for_ not in ("", "0s") else "")
              + ".")
    confirm = (f"panel \"{panel.title}\" (id {panel.id}) on the \"{dash.title}\" dashboard; "
               f"{CONFIRM[alert.category]}")
    return Entry(alert, anchor(alert.name), raised, confirm, needs_text(alert))


def needs_text(alert: AlertDef) -> str:
    """What the alert's fault needs before its node takes a job again, and how that is seen."""
    if alert.needs is None:
        return ("what NVIDIA's catalog gives for the code (the XID table below; the bridge "
                "follows it per code).")
    spec = SPECS[alert.needs]
    if spec.out_of_service is False:
        return f"{spec.needs}: a restart may use the same node."
    return f"{spec.needs}; seen when: {spec.observed_by}."


# The alert each XID class raises (catalog/alerts.py selects the codes by the same classes).
CLASS_ALERT = {
    XidClass.HARDWARE: "GpuXidError", XidClass.CONTAINED_ECC: "GpuContainedEccError",
    XidClass.UNCONTAINED_ECC: "GpuUncontainedEccError", XidClass.FALLEN_OFF_BUS:
    "GpuFallenOffBus", XidClass.DECODE: "GpuXidDecodeRequired",
    XidClass.APPLICATION: "GpuXidApplicationError", XidClass.INFORMATIONAL: "GpuXidInformational",
}


def xid_rows() -> list[tuple[str, str, str, str, str]]:
    """The XID table: code, meaning, NVIDIA's immediate action, what it needs, its alert."""
    return [(str(x.code), x.meaning, x.bucket or "none published", SPECS[x.action].needs,
             CLASS_ALERT[x.cls]) for x in XIDS.values()]


SAFE_TO_RESTART = (
    "Each issue that names a host carries a restart verdict, decided from three facts: the "
    "action its root cause needs (the table below, per alert, and the XID table, per code, "
    f"from NVIDIA's catalog {CATALOG_URL}), whether telemetry shows that action happened "
    "(after the fault began), and the host's scheduler state. **safe**: the fault needs no "
    "hardware action (a restart may land on the same GPUs), or the action was seen done, or "
    "the host is out of the pool (drained, down, cordoned, tainted against the run's pods) or "
    "was taken out after the fault and returned by an operator. **unsafe**: the action has "
    "not happened and the host is schedulable; the issue gives the exact exclusion. "
    "**unknown**: the data to decide is missing (no Prometheus, no scheduler state, a code "
    "nobody publishes an action for, a sub-code to decode); the issue says which. The "
    "optional quarantine drains or cordons only where the action needs the node out of "
    "service. A site that disagrees with NVIDIA (XID 94: some drain anyway) sets the bridge's "
    "`restart_policy` per code, bucket or alert, and the issue states the choice.")


def action_rows() -> list[tuple[str, str, str, str]]:
    """The action table: action, what it needs, whether the node leaves the pool, seen when."""
    out = []
    for action in Action:
        spec = SPECS[action]
        leaves = {True: "yes", False: "no", None: "when resolved"}[spec.out_of_service]
        out.append((action.value, spec.needs, leaves, spec.observed_by))
    return out


def entries() -> list[Entry]:
    """Every alert's entry, in catalog order."""
    return [entry(a) for a in ALERTS.values()]
