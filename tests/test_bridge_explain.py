"""explain's pure parts: firing periods, run membership, annotations, times, PromQL escaping."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.root_cause import AlertFact
from wandb_infra.bridge.prometheus.client import regex_literal
from wandb_infra.bridge.prometheus.history import (
    Placement,
    _belongs,
    _segments,
    catalog_annotations,
    fingerprint,
    parse_run,
    parse_when,
    pick_step,
)
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.catalog.panels import link_annotations
from wandb_infra.common.runkey import RunKey

RUN = RunKey("e", "p", "r1")
PLACEMENT = Placement(frozenset({"h1", "h2"}), {"h1": frozenset({"0", "1"})}, 0.0, 100.0)


def test_segments_split_on_gaps_longer_than_one_and_a_half_steps():
    values = [[t, "1"] for t in (0, 2, 4, 10, 12, 30)]
    assert _segments(values, 2.0) == [(0, 4), (10, 12), (30, 30)]
    assert _segments([], 2.0) == []


def test_membership_by_run_labels_or_by_host_and_gpu():
    assert _belongs({"wandb_entity": "e", "wandb_project": "p", "wandb_run_id": "r1"}, RUN,
                    PLACEMENT)
    assert not _belongs({"wandb_entity": "e", "wandb_project": "p", "wandb_run_id": "other",
                         "hostname": "h1"}, RUN, PLACEMENT)
    assert _belongs({"hostname": "h1", "gpu": "1"}, RUN, PLACEMENT)
    assert not _belongs({"hostname": "h1", "gpu": "5"}, RUN, PLACEMENT), "another run's GPU"
    assert _belongs({"hostname": "h2", "gpu": "5"}, RUN, PLACEMENT), "GPUs unknown on h2"
    assert not _belongs({"hostname": "h9"}, RUN, PLACEMENT)


def test_annotations_come_from_the_catalog_with_labels_filled_in():
    ann = catalog_annotations({"alertname": "InfinibandLinkDown", "hostname": "h1",
                               "device": "mlx5_0", "port": "1"})
    assert ann["impact"] and ann["remediation"] and ann["panel_id"].isdigit()
    assert "{{" not in ann["description"]
    assert catalog_annotations({"alertname": "SomethingElse"}) == {}


def test_times_and_runs_parse_or_fail_clearly():
    assert parse_when("2h", 10_000.0) == 10_000.0 - 7200
    assert parse_when("1700000000", 0) == 1_700_000_000.0
    assert parse_when("2026-11-29T10:00:00Z", 0) == parse_when("2026-11-29T10:00:00+00:00", 0)
    assert parse_when(None, 0) is None
    with pytest.raises(ValueError, match="cannot read time"):
        parse_when("yesterday", 0)
    assert parse_run("a/b/c") == RunKey("a", "b", "c")
    with pytest.raises(ValueError, match="ENTITY/PROJECT/RUN_ID"):
        parse_run("a/b")


def test_step_respects_the_point_limit_and_fingerprints_are_stable():
    assert pick_step(0, 3600, 15) == 15
    assert pick_step(0, 30 * 86400, 15) == 30 * 86400 / 10_000
    labels = {"alertname": "X", "hostname": "h"}
    assert fingerprint(labels, 5.0) == fingerprint(dict(reversed(labels.items())), 5.0)
    assert re.fullmatch(r"[0-9a-f]{16}", fingerprint(labels, 5.0))


def test_regex_literal_survives_promql_string_and_re2_escaping():
    # What Prometheus' parser turns the literal into (Go string unescaping), then RE2.
    for host in ("gpu-node-001", "a.b", "x|y", "n(1)"):
        literal = regex_literal(host)
        unescaped = literal.encode().decode("unicode_escape")
        assert re.fullmatch(unescaped, host)
        assert not re.fullmatch(unescaped, host + "x")


def test_live_and_explain_agree_on_onset_and_links_for_every_catalog_alert():
    """The rules' annotations (what the live bridge receives) and explain's rebuilt
    ones place every alert identically: same onset, same dashboard, panel and link."""
    rules_file = Path(__file__).resolve().parents[1] / "alert_rules" / "wandb-infra.rules.yml"
    live = {r["alert"]: r["annotations"] for g in yaml.safe_load(rules_file.read_text())["groups"]
            for r in g["rules"] if "alert" in r}
    assert set(live) == set(ALERTS)
    links = GrafanaLinks("https://grafana.example")
    fired = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    for name, known in ALERTS.items():
        labels = {"alertname": name, "hostname": "h1", "gpu": "0"}
        rebuilt = catalog_annotations(labels)
        assert {k: rebuilt.get(k) for k in ("dashboard_uid", "panel_id", "for_seconds")} == {
            k: live[name].get(k) for k in ("dashboard_uid", "panel_id", "for_seconds")}, name
        assert link_annotations(known.scope, known.panel, known.for_seconds).items() <= \
            live[name].items(), name
        facts = [AlertFact("f", name, fired, None, known.severity, known.category, "h1", "0",
                           labels, ann) for ann in (live[name], rebuilt)]
        assert facts[0].onset == facts[1].onset, name
        for run in (RUN, RunKey("", "", "")):
            assert links.link(facts[0], run, fired, None) == links.link(facts[1], run, fired,
                                                                         None), name
