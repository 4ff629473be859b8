"""Static checks of the generated dashboards: up to date, dashboard-linter conventions, catalog
panel ids, deep links, and the Grafana provisioning files."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from wandb_infra.alert_rules.generate import records_read
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.root_cause import AlertFact
from wandb_infra.catalog import panels as catalog
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.common.runkey import RunKey
from wandb_infra.dashboards import generate

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "deploy" / "grafana"
RANGE = re.compile(r"\[([^\]]+)\]")
RATE_FUNCS = re.compile(r"\b(rate|irate|increase|delta|idelta|deriv)\s*\(")


def load(board: catalog.Dashboard) -> dict:
    return json.loads((generate.OUT_DIR / f"{board.uid}.json").read_text())


def panels_of(data: dict) -> list[dict]:
    out = []
    for panel in data["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


BOARDS = list(catalog.DASHBOARDS.values())


def test_check_mode_reports_a_stale_file(tmp_path, monkeypatch):
    monkeypatch.setattr(generate, "OUT_DIR", tmp_path)
    assert generate.main(["--check"]) == 1
    assert list(tmp_path.iterdir()) == []  # --check writes nothing
    assert generate.main([]) == 0
    assert generate.main(["--check"]) == 0


def test_each_query_names_the_records_it_reads_at_every_step():
    """A target's minimum step comes from the records its Query names: one left out would get too
    short a step and a broken graph. Records read over ``$__range`` are always found."""
    for key, spec in generate.specs(generate.RUN_SELECTOR, "run").items():
        for query in spec.queries:
            read = set(records_read(query.expr, generate.RECORD_TIERS))
            whole_range = {r for r in read
                           if re.search(rf"{re.escape(r)}(\{{[^}}]*\}})?\[\$__range\]", query.expr)}
            assert set(query.records) == read - whole_range, (key, query.expr)


@pytest.mark.parametrize("board", BOARDS, ids=lambda b: b.key)
def test_lint_conventions(board):
    """The dashboard-linter rules kubernetes-mixin adopts, plus ours."""
    data = load(board)
    assert data["uid"] == board.uid and data["title"] == board.title
    assert data["description"] and data["tags"]
    variables = {v["name"]: v for v in data["templating"]["list"]}
    ds = [v for v in variables.values() if v["type"] == "datasource"]
    assert [v["name"] for v in ds] == ["datasource"] and ds[0]["query"] == "prometheus"
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert var["description"]
    ids = []
    for panel in panels_of(data):
        ids.append(panel.get("id"))
        assert isinstance(panel.get("id"), int), panel.get("title")
        assert panel["title"]
        if panel["type"] == "row":
            continue
        where = f"{board.key}/{panel['title']}"
        assert panel.get("description"), where
        assert panel["fieldConfig"]["defaults"].get("unit"), where
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert panel["targets"], where
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", where
            expr = target["expr"]
            ranges = RANGE.findall(expr)
            for window in ranges:
                # No hard-coded windows: Grafana sizes them to the scrape interval and step.
                assert window in ("$__rate_interval", "$__range"), (where, expr)
            if RATE_FUNCS.search(expr):
                assert "$__rate_interval" in expr, (where, expr)
        gp = panel["gridPos"]
        assert 0 < gp["w"] <= 24 and gp["x"] + gp["w"] <= 24 and gp["h"] > 0
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for annotation in data["annotations"]["list"]:
        assert annotation["datasource"]["uid"] == "${datasource}"
        assert annotation["expr"].startswith("ALERTS{")


@pytest.mark.parametrize("board", BOARDS, ids=lambda b: b.key)
def test_every_catalog_panel_exists_with_its_id(board):
    by_id = {p["id"]: p for p in panels_of(load(board))}
    for entry in catalog.PANELS.values():
        if board.key in entry.dashboards:
            assert entry.id in by_id, entry.key
            assert by_id[entry.id]["title"] == entry.title
            assert by_id[entry.id]["type"] != "row"
    catalog_ids = {p.id for p in catalog.PANELS.values()}
    for panel_id, panel in by_id.items():
        if panel["type"] != "row":
            assert panel_id in catalog_ids, f"panel {panel_id} is not declared in the catalog"
    names = [v["name"] for v in load(board)["templating"]["list"]]
    assert names == list(board.variables)


def test_alert_panels_exist_in_their_dashboards():
    assert ALERTS, "the alert catalog is empty"
    for alert in ALERTS.values():
        entry = catalog.panel(alert.panel)
        for key in entry.dashboards:
            ids = {p["id"] for p in panels_of(load(catalog.DASHBOARDS[key]))}
            assert entry.id in ids, (alert.name, key)


def test_rule_annotations_point_at_existing_panels():
    rule_files = sorted((ROOT / "alert_rules").glob("*.rules.yml"))
    assert rule_files, "alert_rules/ has no rule files: run make generate"
    by_uid = {b.uid: {p["id"] for p in panels_of(load(b))} for b in BOARDS}
    seen = 0
    for path in rule_files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" not in rule:
                    continue
                ann = rule["annotations"]
                assert ann["dashboard_uid"] in by_uid, rule["alert"]
                assert int(ann["panel_id"]) in by_uid[ann["dashboard_uid"]], rule["alert"]
                seen += 1
    assert seen


def test_every_deep_link_the_bridge_builds_resolves():
    links = GrafanaLinks("https://grafana.example")
    runs = [RunKey("team", "llm", "run-1"), RunKey()]
    start = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    checked = 0
    for alert in ALERTS.values():
        for run in runs:
            fact = AlertFact(fingerprint="f", alertname=alert.name, starts_at=start,
                                       hostname="gpu-node-017", gpu="3")
            url = urlparse(links.link(fact, run, start, None))
            _, _d, uid, slug = url.path.split("/")
            board = next(b for b in BOARDS if b.uid == uid)
            assert slug == board.slug
            data = load(board)
            query = parse_qs(url.query)
            ids = {p["id"] for p in panels_of(data) if p["type"] != "row"}
            assert int(query["viewPanel"][0]) in ids, (alert.name, run)
            variables = {v["name"] for v in data["templating"]["list"]}
            for key in query:
                if key.startswith("var-"):
                    assert key[4:] in variables, (alert.name, key)
            checked += 1
    assert checked == 2 * len(ALERTS)


def test_grafana_provisioning_files():
    datasources = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert datasources["apiVersion"] == 1
    assert [d["type"] for d in datasources["datasources"]] == ["prometheus"]
    providers = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "wandb-infra.yaml").read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    compose = yaml.safe_load((GRAFANA / "compose.yaml").read_text())
    mounts = {}
    for volume in compose["services"]["grafana"]["volumes"]:
        source, target, *_ = volume.split(":")
        path = (GRAFANA / source).resolve()
        assert path.exists(), volume
        mounts[target] = path
    assert mounts["/etc/grafana/provisioning/datasources"] == (
        GRAFANA / "provisioning" / "datasources").resolve()
    assert mounts["/etc/grafana/provisioning/dashboards"] == (
        GRAFANA / "provisioning" / "dashboards").resolve()
    served = mounts[provider["options"]["path"]]
    assert served == generate.OUT_DIR
    uids = {json.loads(p.read_text())["uid"] for p in served.glob("*.json")}
    assert uids == {b.uid for b in BOARDS}


@pytest.mark.parametrize("board", BOARDS, ids=lambda b: b.key)
def test_links_between_dashboards_resolve(board):
    data = load(board)
    urls = [link["url"] for link in data["links"]]
    for panel in panels_of(data):
        urls += [link["url"] for link in panel.get("fieldConfig", {}).get("defaults", {})
                 .get("links", [])]
    assert urls
    known = {(b.uid, b.slug): b for b in BOARDS}
    for url in urls:
        parsed = urlparse(url)
        _, _d, uid, slug = parsed.path.split("/")
        target = known[(uid, slug)]
        for key in parse_qs(parsed.query):
            if key.startswith("var-"):
                assert key[4:] in target.variables, url
