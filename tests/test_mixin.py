"""The monitoring mixin (mixin/) rendered with Debian's jsonnet: the same rules and dashboards as
the generated files, its config applied, and its output accepted by promtool."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.processes import PROMTOOL
from wandb_infra.alert_rules import generate
from wandb_infra.catalog import runbook

ROOT = Path(__file__).resolve().parent.parent
JSONNET = shutil.which("jsonnet") or "/usr/bin/jsonnet"


def render(expr: str) -> object:
    proc = subprocess.run([JSONNET, "-J", str(ROOT), "-e", expr], capture_output=True,
                          text=True, timeout=60, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _unfolded(groups: list[dict]) -> dict[str, dict]:
    """Groups by name, each rule's expression without whitespace: the shipped file folds a short
    bracketed block onto one line by its final length, which the mixin's template cannot know
    before _config fills its placeholders in, so the two agree on the PromQL, not the layout."""
    return {g["name"]: {**g, "rules": [{**r, "expr": "".join(r["expr"].split())}
                                       for r in g["rules"]]} for g in groups}


def _mixin(overrides: str = "") -> str:
    return f'((import "mixin/mixin.libsonnet") + {{ _config+:: {{ {overrides} }} }})'


@pytest.mark.integration
def test_rules_are_the_generated_groups():
    shipped = yaml.safe_load((ROOT / "alert_rules" / generate.RULES_FILE).read_text())["groups"]
    rules = render(f"{_mixin()}.prometheusRules")["groups"]
    alerts = render(f"{_mixin()}.prometheusAlerts")["groups"]
    assert all("alert" not in r for g in rules for r in g["rules"])
    assert all(any("alert" in r for r in g["rules"]) for g in alerts)
    by_name = _unfolded([*rules, *alerts])
    assert [g["name"] for g in shipped] == [g["name"] for g in shipped if g["name"] in by_name]
    assert _unfolded(shipped) == by_name


@pytest.mark.integration
def test_dashboards_are_the_generated_json():
    boards = render(f"{_mixin()}.grafanaDashboards")
    files = {p.name: json.loads(p.read_text()) for p in (ROOT / "dashboards").glob("*.json")}
    assert boards == files


@pytest.mark.integration
def test_the_readme_example_renders_runbook_links_the_bridge_serves():
    """mixin/README.md's example, rendered as written: every alert's runbook_url is the given
    base + the bridge's runbook path and the alert's anchor."""
    text = (ROOT / "mixin" / "README.md").read_text()
    example = text[text.index("```jsonnet\n") + 11:]
    example = example[:example.index("```")]
    local = example[:example.index("};") + 2]
    base = re.search(r"runbookURLBase: '([^']+)'", local).group(1)
    alerts = render(local + "\nwandbInfra.prometheusAlerts")
    urls = {r["alert"]: r["annotations"]["runbook_url"] for g in alerts["groups"]
            for r in g["rules"] if "alert" in r}
    assert urls and all(u == f"{base}{runbook.PATH}#{runbook.anchor(a)}"
                        for a, u in urls.items())


@pytest.mark.integration
def test_config_overrides_runbooks_and_labels():
    overrides = ('runbookURLBase: "https://runbooks.example/wi", '
                 'alertLabels: { team: "ml-infra" }')
    alerts = render(_mixin(overrides) + ".prometheusAlerts")
    rules = [r for g in alerts["groups"] for r in g["rules"] if "alert" in r]
    assert rules
    for rule in rules:
        assert rule["labels"]["team"] == "ml-infra"
        assert rule["annotations"]["runbook_url"].startswith(
            "https://runbooks.example/wi/runbook#"), rule["alert"]


@pytest.mark.integration
@pytest.mark.parametrize("field", ["prometheusRules", "prometheusAlerts"])
def test_promtool_accepts_the_rendered_rules(tmp_path, field):
    path = tmp_path / f"{field}.yml"
    path.write_text(yaml.safe_dump(render(f"{_mixin()}.{field}")))
    proc = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


CHANGED = {"thresholds": {"tempCriticalC": 92, "ibFlapsMin": 5, "thermalViolationRatio": 0.2},
           "hostKeyRegex": "(.+)",
           "selectors": {"dcgmExporter": 'job="dcgm-exporter"',
                         "nodeExporter": 'job="node", cluster=~"gpu-.*"'}}


@pytest.mark.integration
def test_changed_config_renders_what_the_generator_writes_with_the_same_options(tmp_path):
    """kubernetes-mixin style _config: thresholds, the host key and exporter selectors set in the
    mixin give the groups the generator writes when given the same options in its config file,
    and promtool accepts them."""
    overrides = ('thresholds+: { tempCriticalC: 92, ibFlapsMin: 5, thermalViolationRatio: 0.2 }, '
                 "hostKeyRegex: '(.+)', selectors+: { dcgmExporter: 'job=\"dcgm-exporter\"', "
                 "nodeExporter: 'job=\"node\", cluster=~\"gpu-.*\"' }")
    rendered = {g["name"]: g for f in ("prometheusRules", "prometheusAlerts")
                for g in render(f"{_mixin(overrides)}.{f}")["groups"]}
    config = tmp_path / "rules.yml"
    config.write_text(yaml.safe_dump({"thresholds": CHANGED["thresholds"],
                                      "host_key_regex": CHANGED["hostKeyRegex"],
                                      "selectors": CHANGED["selectors"]}))
    cfg = generate.options(generate.parse_args(["--config", str(config)]))
    assert _unfolded(list(rendered.values())) == _unfolded(generate.groups(cfg))
    text = "\n".join(r["expr"] for g in rendered.values() for r in g["rules"])
    assert "<<" not in text
    assert "gpu:dcgm_gpu_temp:max_from_warning >= 92" in text
    assert '"hostname", "$1", "hostname", "(.+)"' in text
    assert "([^.]*[^0-9.][^.]*)" not in text
    assert 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{job="dcgm-exporter"}[' in text
    assert '{job="dcgm-exporter",__name__=~"DCGM_FI_DEV_XID_ERRORS|' in text
    assert 'node_filesystem_size_bytes{job="node", cluster=~"gpu-.*",fstype=~' in text
    assert "smartctl_device_smart_status{" not in text  # no selector for it: unchanged
    path = tmp_path / "selected.yml"
    path.write_text(yaml.safe_dump({"groups": list(rendered.values())}))
    proc = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    default = "\n".join(r["expr"] for g in render(f"{_mixin()}.prometheusRules")["groups"]
                        for r in g["rules"])
    assert "([^.]*[^0-9.][^.]*)" in default


def test_generator_refuses_unknown_or_unsafe_thresholds(tmp_path):
    config = tmp_path / "rules.yml"
    for bad in ({"thresholds": {"tempCritical": 92}}, {"thresholds": {"tempCriticalC": "hot"}},
                {"thresholds": {"tempCriticalC": 80}}, {"host_key_regex": "no-group"},
                {"selectors": {"dcgm": 'job="x"'}}, {"selectors": {"dcgmExporter": "job=x"}},
                {"selectors": {"dcgmExporter": 'job="x"} or up{'}}):
        config.write_text(yaml.safe_dump(bad))
        assert generate.main(["--config", str(config), "--out-dir", str(tmp_path)]) == 2, bad


@pytest.mark.integration
@pytest.mark.parametrize(("override", "named"), [
    ("thresholds+: { tempCritical: 92 }", "unknown _config.thresholds keys: tempCritical"),
    ("selectors+: { dcgm: 'job=\"x\"' }", "unknown _config.selectors keys: dcgm"),
])
def test_a_misspelt_config_key_is_refused_by_name(override, named):
    proc = subprocess.run([JSONNET, "-J", str(ROOT), "-e", f"{_mixin(override)}.prometheusRules"],
                          capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)
    assert proc.returncode != 0
    assert named in proc.stderr
