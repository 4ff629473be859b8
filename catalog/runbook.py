"""The runbook: one entry per alert (meaning, impact, how to confirm, what to do), as plain data.

Rendered twice from this one source: as Markdown into ``docs/runbook.md`` by the rule generator,
and as a page the bridge serves at ``PATH``. Alerts link to it through their ``runbook_url``
annotation, ``<base>/runbook#<anchor>``, where the base is the bridge's URL as operators reach it
(``alert_rules`` option ``runbook_base``); the default is the in-cluster Service of
``deploy/kubernetes/bridge.yaml``, so the link resolves wherever the shipped manifests run.
"""

from __future__ import annotations

from dataclasses import dataclass

from wandb_infra.catalog import panels
from wandb_infra.catalog.alerts import ALERTS, AlertDef

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
}


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
    return Entry(alert, anchor(alert.name), raised, confirm)


def entries() -> list[Entry]:
    """Every alert's entry, in catalog order."""
    return [entry(a) for a in ALERTS.values()]
