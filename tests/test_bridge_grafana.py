"""Every Grafana link the bridge can build points at a dashboard panel that exists."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from harness.bridge_payloads import T0
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.root_cause import AlertFact
from wandb_infra.bridge.ingest.identity import UNATTRIBUTED
from wandb_infra.catalog import panels as P
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.common.runkey import RunKey

ROOT = Path(__file__).resolve().parent.parent
FIXED = ["GpuXidError", "GpuContainedEccError", "GpuUncontainedEccError", "GpuXidApplicationError",
         "GpuFallenOffBus", "GpuThermalViolation", "GpuTemperatureCritical", "GpuNvlinkErrors",
         "GpuPcieReplayRate", "InfinibandLinkDown", "InfinibandLinkFlapping", "NodeDown",
         "TrainingStalled", "TrainingStraggler"]


def _generated() -> dict[str, dict]:
    """Dashboard JSON by uid from dashboards/."""
    out: dict[str, dict] = {}
    for path in (ROOT / "dashboards").glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        dash = data.get("dashboard", data)
        if isinstance(dash, dict) and "uid" in dash:
            out[dash["uid"]] = dash
    return out


def test_generated_dashboards_have_the_catalog_uids_and_variables():
    generated = _generated()
    assert generated, "no dashboards in dashboards/: run make generate"
    for dashboard in P.DASHBOARDS.values():
        assert dashboard.uid in generated, dashboard.uid
        names = {v["name"] for v in generated[dashboard.uid].get("templating", {}).get(
            "list", [])}
        assert set(dashboard.variables) <= names, (dashboard.uid, names)


def _generated_panels() -> dict[str, set[int]]:
    """Panel ids per dashboard uid in dashboards/."""
    out: dict[str, set[int]] = {}
    for path in (ROOT / "dashboards").rglob("*.json") if (ROOT / "dashboards").exists() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        dash = data.get("dashboard", data)
        if not isinstance(dash, dict) or "uid" not in dash:
            continue
        ids: set[int] = set()
        stack = list(dash.get("panels", []))
        while stack:
            panel = stack.pop()
            if "id" in panel:
                ids.add(panel["id"])
            stack.extend(panel.get("panels", []))
        out[dash["uid"]] = ids
    return out


def _candidates() -> list[AlertFact]:
    facts = []
    names = sorted(set(FIXED) | set(ALERTS))
    annotation_sets = [{}] + [
        {"dashboard_uid": d.uid, "panel_id": str(p.id)}
        for d in P.DASHBOARDS.values() for p in P.PANELS.values()
    ] + [{"dashboard_uid": "nope", "panel_id": "999"}, {"panel_id": "x"}]
    for name in names:
        for ann in annotation_sets:
            facts.append(AlertFact("f", name, T0, None, "critical", "gpu_hardware", "h1", "2", {},
                                   ann))
    return facts


def test_every_link_targets_an_existing_panel():
    links = GrafanaLinks("https://grafana.example/", org_id=3)
    generated = _generated_panels()
    assert {d.uid for d in P.DASHBOARDS.values()} <= set(generated)
    for fact in _candidates():
        for run in (RunKey("e", "p", "r"), UNATTRIBUTED):
            dashboard, panel = links.target(fact, run)
            assert dashboard.key in panel.dashboards
            assert P.PANELS[panel.key] == panel
            if dashboard.uid in generated:
                assert panel.id in generated[dashboard.uid], (dashboard.uid, panel.id)
            url = urlparse(links.link(fact, run, T0, None))
            assert url.path == f"/d/{dashboard.uid}/{dashboard.slug}"
            query = parse_qs(url.query)
            assert query["viewPanel"] == [str(panel.id)] and query["orgId"] == ["3"]
            for name in query:
                if name.startswith("var-"):
                    assert name[4:] in dashboard.variables


def test_link_window_and_variables():
    links = GrafanaLinks("https://g.example")
    fact = AlertFact("f", "GpuThermalViolation", T0, None, "warning", "gpu_thermal", "h 1", "5",
                     {}, {"dashboard_uid": P.RUN.uid,
                          "panel_id": str(P.PANELS["thermal_violation"].id)})
    url = urlparse(links.link(fact, RunKey("ent", "pro", "run&1"), T0, T0))
    query = parse_qs(url.query)
    assert query["viewPanel"] == [str(P.PANELS["thermal_violation"].id)]
    assert int(query["from"][0]) == int(T0.timestamp() * 1000) - 30 * 60 * 1000
    assert int(query["to"][0]) == int(T0.timestamp() * 1000) + 30 * 60 * 1000
    assert query["var-wandb_run_id"] == ["run&1"] and query["var-hostname"] == ["h 1"]
    assert query["var-gpu"] == ["5"]
    open_ended = parse_qs(urlparse(links.link(fact, RunKey("e", "p", "r"), T0, None)).query)
    assert open_ended["to"] == ["now"]
    assert GrafanaLinks("").link(fact, RunKey("e", "p", "r"), T0, None) == ""


def test_attributed_alert_links_to_the_run_dashboard_with_run_variables():
    links = GrafanaLinks("https://g.example")
    fact = AlertFact("f", "GpuContainedEccError", T0, None, "critical", "gpu_hardware",
                     "gpu-node-017", "3", {}, {"dashboard_uid": P.NODE.uid,
                                               "panel_id": str(P.PANELS["xid_errors"].id)})
    url = urlparse(links.link(fact, RunKey("ent", "pro", "abc"), T0, None))
    assert url.path == f"/d/{P.RUN.uid}/{P.RUN.slug}"
    query = parse_qs(url.query)
    assert query["var-wandb_run_id"] == ["abc"] and query["var-hostname"] == ["gpu-node-017"]
    assert query["var-gpu"] == ["3"] and query["viewPanel"] == [str(P.PANELS["xid_errors"].id)]
    unattributed = urlparse(links.link(fact, UNATTRIBUTED, T0, None))
    assert unattributed.path == f"/d/{P.NODE.uid}/{P.NODE.slug}"
