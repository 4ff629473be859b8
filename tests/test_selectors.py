"""The exporter selectors the generator puts into the rules (alert_rules/selectors.py): every raw
series of a configured exporter gets its matchers, nothing else changes."""

from __future__ import annotations

import yaml

from wandb_infra.alert_rules import generate, selectors
from wandb_infra.alert_rules.selectors import apply, exporter_of, reads, vector_selectors

SELECT = {"dcgmExporter": 'job="dcgm"', "nodeExporter": 'job="node"'}


def test_names_functions_keywords_and_label_lists_are_told_apart():
    expr = ('max by (hostname, gpu) (rate(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m] offset 5m) > 1e9)'
            ' * on (instance, job) group_left (hostname) node_uname_info'
            ' or sum without (device) (node_network_up{device!~"lo|docker.*"})'
            ' unless count_values by (Hostname) ("xid", {__name__=~"DCGM_FI_DEV_XID_ERRORS|'
            'DCGM_FI_DEV_XID_ERROR",err_code!="0"}) and up == 0 and gpu:dcgm_gpu:present')
    found = list(vector_selectors(expr))
    assert [n for n, _ in found] == ["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "node_uname_info",
                                     "node_network_up", None, "up", "gpu:dcgm_gpu:present"]
    selected = apply(expr, SELECT)
    assert "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{job=\"dcgm\"}[10m] offset 5m" in selected
    assert 'node_uname_info{job="node"}' in selected
    assert 'node_network_up{job="node",device!~"lo|docker.*"}' in selected
    assert '{job="dcgm",__name__=~"DCGM_FI_DEV_XID_ERRORS|' in selected
    assert "max by (hostname, gpu) (" in selected and "on (instance, job) group_left" in selected
    assert selected.endswith(" and up == 0 and gpu:dcgm_gpu:present")


def test_each_selector_comes_with_the_range_or_subquery_it_is_read_over():
    expr = ('increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{job="d"} [10m] offset 5m) > 0'
            ' and on (hostname) max_over_time(gpu:dcgm_gpu:present[1h:5m])'
            ' or count_over_time({__name__=~"A|B"}[2m]) or up == 0')
    assert list(reads(expr)) == [("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", '{job="d"}', "[10m]"),
                                 ("gpu:dcgm_gpu:present", "", "[1h:5m]"),
                                 (None, '{__name__=~"A|B"}', "[2m]"), ("up", "", "")]


def test_no_selector_changes_nothing():
    """Blank selectors, and selectors of exporters a rule does not read, leave it as it was: the
    walk over its pieces gives back every character."""
    rules = yaml.safe_load(generate.rules_text(generate.DEFAULTS))
    walked = 0
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert apply(rule["expr"], {"dcgmExporter": "", "nodeExporter": "  "}) == rule["expr"]
            read = {exporter_of(m) for name, braces in vector_selectors(rule["expr"])
                    for m in ([name] if name else selectors.names_in(braces))}
            unread = {k: f'job="{k}"' for k in selectors.EXPORTERS if k not in read}
            if len(unread) < len(selectors.EXPORTERS):
                walked += 1
                assert apply(rule["expr"], unread) == rule["expr"], rule
    assert walked > 50


def test_every_raw_series_the_rules_read_belongs_to_an_exporter():
    """A new raw metric with an unknown prefix would silently escape the selectors."""
    rules = yaml.safe_load(generate.rules_text(generate.DEFAULTS))
    unowned = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            for name, braces in vector_selectors(rule["expr"]):
                for metric in [name] if name else selectors.names_in(braces):
                    if ":" not in metric and exporter_of(metric) is None:
                        unowned.add(metric)
    assert unowned == {"up", "ALERTS"}


def test_selected_rules_keep_every_configured_series_selected():
    cfg = {**generate.DEFAULTS, "selectors": {k: f'job="{k}"' for k in selectors.EXPORTERS}}
    for group in generate.groups(cfg):
        for rule in group["rules"]:
            for name, braces in vector_selectors(rule["expr"]):
                names = [name] if name else selectors.names_in(braces)
                owners = {exporter_of(n) for n in names} - {None}
                for owner in owners:
                    assert f'job="{owner}"' in braces, (rule.get("record") or rule["alert"],
                                                        name, braces)

