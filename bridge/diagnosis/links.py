"""Grafana deep links for an issue, built only from the catalog's dashboards and panel ids.

``/d/<uid>/<slug>?orgId=<org>&viewPanel=<id>&from=<ms>&to=<ms>&var-<name>=<value>...``. The panel
comes from the alert's ``dashboard_uid``/``panel_id`` annotations when they name a panel that
exists in the catalog, else from the catalog's entry for the alert, else the "alerts" panel. An
attributed run always links to the run dashboard (with the run's variables, whatever dashboard the
rule names), an unattributed alert to the dashboard its annotation names, else the node dashboard.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlencode

from wandb_infra.bridge.diagnosis.root_cause import AlertFact
from wandb_infra.catalog import panels as P
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.catalog.vocabulary import ANNOTATION_DASHBOARD_UID, ANNOTATION_PANEL_ID
from wandb_infra.common import labels as L
from wandb_infra.common.runkey import RunKey

_BY_UID = {d.uid: d for d in P.DASHBOARDS.values()}
_BY_ID = {p.id: p for p in P.PANELS.values()}


@dataclass(frozen=True)
class GrafanaLinks:
    """Builds links against one Grafana; an empty base URL disables links."""

    base_url: str
    org_id: int = 1
    before: timedelta = timedelta(minutes=30)
    after: timedelta = timedelta(minutes=30)

    def target(self, fact: AlertFact, run: RunKey) -> tuple[P.Dashboard, P.Panel]:
        """The dashboard and panel an alert links to (always one that exists in the catalog)."""
        wanted = P.RUN if run.attributed else P.NODE
        uid = fact.annotations.get(ANNOTATION_DASHBOARD_UID, "")
        if uid in _BY_UID and not run.attributed:
            wanted = _BY_UID[uid]
        panel = None
        raw_id = fact.annotations.get(ANNOTATION_PANEL_ID, "")
        if raw_id.isdigit() and int(raw_id) in _BY_ID:
            panel = _BY_ID[int(raw_id)]
        if panel is None and fact.alertname in ALERTS:
            panel = P.PANELS.get(ALERTS[fact.alertname].panel)
        if panel is None or wanted.key not in panel.dashboards:
            fallback = panel if panel is not None else P.PANELS["alerts"]
            wanted = next((P.DASHBOARDS[k] for k in fallback.dashboards), P.NODE)
            panel = fallback
        return wanted, panel

    def for_run(self, run: RunKey) -> Callable[[AlertFact, datetime, datetime | None], str]:
        """``link`` bound to one run (what the notes and pages take)."""
        return lambda fact, start, end: self.link(fact, run, start, end)

    def link(self, fact: AlertFact, run: RunKey, start: datetime,
             end: datetime | None) -> str:
        """The deep link for ``fact``, time window around [start, end], or "" when disabled."""
        if not self.base_url:
            return ""
        dashboard, panel = self.target(fact, run)
        values = {
            L.ENTITY: run.entity, L.PROJECT: run.project, L.RUN_ID: run.run_id,
            L.HOSTNAME: fact.hostname, L.GPU: fact.gpu,
        }
        params: list[tuple[str, str]] = [
            ("orgId", str(self.org_id)),
            ("viewPanel", str(panel.id)),
            ("from", str(int((start - self.before).timestamp() * 1000))),
            ("to", "now" if end is None else str(int((end + self.after).timestamp() * 1000))),
        ]
        params += [(f"var-{name}", values[name]) for name in dashboard.variables
                   if values.get(name)]
        return (f"{self.base_url.rstrip('/')}/d/{dashboard.uid}/{dashboard.slug}?"
                f"{urlencode(params)}")
