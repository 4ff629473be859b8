"""Every alert the project ships: identity, meaning and where it links.

This is the catalog the rule generator renders into ``alert_rules/`` and the bridge reads to rank
root causes. Alerts not listed here (a user's own rules) fall back to their ``category`` label.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bridge.catalog.vocabulary import CATEGORY_DEFAULT_CAUSE, CauseClass


@dataclass(frozen=True)
class AlertDef:
    """One alert. ``scope`` names the entity it is raised on: gpu, host, link or run."""

    name: str
    severity: str
    category: str
    cause: CauseClass
    scope: str
    summary: str
    description: str
    impact: str
    remediation: str
    panel: str
    expr: str = ""
    for_: str = "0s"
    keep_firing_for: str = ""
    extra_labels: dict[str, str] = field(default_factory=dict)


ALERTS: dict[str, AlertDef] = {}


def register(*defs: AlertDef) -> None:
    """Add alert definitions; a duplicate name is a bug in the catalog."""
    for d in defs:
        if d.name in ALERTS:
            raise ValueError(f"duplicate alert {d.name}")
        ALERTS[d.name] = d


def cause_of(alertname: str, category: str | None) -> CauseClass:
    """The cause class of an alert: from the catalog, else from its category, else a symptom."""
    known = ALERTS.get(alertname)
    if known is not None:
        return known.cause
    return CATEGORY_DEFAULT_CAUSE.get(category or "", CauseClass.SYMPTOM)
