"""The shipped alert rules: promtool-valid, unit-tested, conventional (that the files are current
is ``tests/test_generated.py``)."""

from __future__ import annotations

import copy
import functools
import json
import random
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from harness.processes import PROMTOOL
from tests.rules import build, merge
from wandb_infra.alert_rules import generate, tiers
from wandb_infra.catalog import panels
from wandb_infra.catalog import series as s
from wandb_infra.catalog.alerts import ALERTS, SCOPES, duration_seconds
from wandb_infra.catalog.template import fill, placeholders
from wandb_infra.catalog.vocabulary import CATEGORIES, REQUIRED_ANNOTATIONS, SEVERITIES
from wandb_infra.catalog.xid import XidClass, codes, regex

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "alert_rules" / generate.RULES_FILE
TESTS = sorted((ROOT / "tests" / "rules").glob("*.test.yml"))
NAME = re.compile(r"^([A-Z]+[a-z0-9]+)+$")
RECORD = re.compile(r"^[a-z][a-z0-9_]*:[a-z][a-z0-9_]*:[a-z][a-z0-9_]*$")


def _groups() -> list[dict]:
    """The shipped rule groups, a fresh copy for each caller to change."""
    return copy.deepcopy(_parsed_groups())


@functools.cache
def _parsed_groups() -> list[dict]:
    # Parsed once per process, with libyaml: pure-Python YAML took about 0.9 s for this file,
    # and the promtool tests ask for the groups once per case.
    return yaml.load(RULES.read_text(), Loader=yaml.CSafeLoader)["groups"]


def _alert_rules() -> list[dict]:
    return [r for g in _groups() for r in g["rules"] if "alert" in r]


def _promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    # CPU-bound: the largest suite takes minutes on a loaded 2-core machine; the timeouts only
    # stop a hang
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, check=False)


@pytest.mark.integration
def test_promtool_check_rules_on_every_file(tmp_path):
    manifest = yaml.safe_load((ROOT / "alert_rules" / generate.MANIFEST_FILE).read_text())
    assert manifest["kind"] == "PrometheusRule"
    assert manifest["spec"]["groups"] == _groups()
    spec = tmp_path / "manifest-spec.yml"
    spec.write_text(yaml.safe_dump({"groups": manifest["spec"]["groups"]}))
    for path in (RULES, spec):
        res = _promtool("check", "rules", str(path))
        assert res.returncode == 0, res.stdout + res.stderr


# A series name in PromQL (metric or record); ALERTS read by the alerts they name.
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_ALERTS_READ = re.compile(r'ALERTS\{[^}]*alertname=~?"([^"]+)"')


def needed_groups(alertnames: set[str]) -> list[dict]:
    """The groups that decide ``alertnames``: the groups holding them and, transitively, the
    groups recording what their expressions read (records by name, ``ALERTS`` by the alert
    names it selects), in file order. A suite loads only these: promtool evaluates every loaded
    rule at every step, so unrelated families only cost time, and they cannot change the
    result since nothing the suite checks reads them."""
    groups = _groups()
    producer = {r.get("record") or r["alert"]: i for i, g in enumerate(groups)
                for r in g["rules"]}
    records = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    alerts = {r["alert"] for g in groups for r in g["rules"] if "alert" in r}
    todo, seen = [producer[name] for name in alertnames], set()
    while todo:
        index = todo.pop()
        if index in seen:
            continue
        seen.add(index)
        for rule in groups[index]["rules"]:
            reads = set(_NAME.findall(rule["expr"])) & records
            for selected in _ALERTS_READ.findall(rule["expr"]):
                reads |= {a for a in alerts if re.fullmatch(selected, a)}
            todo += [producer[name] for name in reads]
    return [g for i, g in enumerate(groups) if i in seen]


def group_orders(names: list[str]) -> dict[str, list[str]]:
    """Rule group evaluation orders the suites must pass under: promtool runs groups in map
    order when a test sets no ``group_eval_order``, and a real Prometheus runs each group on its
    own timer, so a rule right only when its inputs' group ran first is wrong some of the time.
    In promtool every group runs at every step, so a record read across groups is either this
    step's or the previous one's; each order below makes a different set of reads lag."""
    shuffled = names[:]
    random.Random(23).shuffle(shuffled)
    return {"file-order": names, "reverse": names[::-1], "shuffled": shuffled}


ORDERS = ("file-order", "reverse", "shuffled")


def run_in_order(doc: dict, groups: list[dict], order: str, suite: Path
                 ) -> subprocess.CompletedProcess:
    """``promtool test rules`` on ``doc`` with only ``groups`` loaded, evaluated in
    ``group_orders(...)[order]``; the suite is written to ``suite``, its rules beside it."""
    rules = suite.with_name(f"{suite.stem}.rules.yml")
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    ordered = {**doc, "rule_files": [str(rules)],
               "group_eval_order": group_orders([g["name"] for g in groups])[order]}
    suite.write_text(yaml.safe_dump(ordered, sort_keys=False))
    return _promtool("test", "rules", str(suite))


def _tested_alerts(doc: dict) -> set[str]:
    return {check["alertname"] for test in doc["tests"] for check in test["alert_rule_test"]}


def orders_for(path: Path) -> tuple[str, ...]:
    """The group orders a suite's cases are spread over: every order, case by case in turn, so
    each case is evaluated once and each suite still meets every order. The legacy ``Hostname``
    copies repeat their ``hostname`` twins case for case with only the raw label's spelling
    changed; the spelling is read by one record of the first group, so the groups after it see
    the same series either way: they run in file order (the rename itself, across orders, is in
    real_telemetry.test.yml)."""
    return ORDERS[:1] if path.name.endswith("_Hostname.test.yml") else ORDERS


@pytest.mark.integration
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", TESTS, ids=[p.name for p in TESTS])
def test_promtool_unit_tests(path, tmp_path):
    """Every suite, its cases spread over the group orders (``group_eval_order`` naming every
    group loaded). Each case loads only the groups its alerts need (``needed_groups``); cases
    that need the same groups and run in the same order go in one promtool call. Cases that
    check the same alerts at the same times run side by side on their own hosts
    (``tests/rules/merge.py``): each member still fails alone."""
    doc = yaml.safe_load(path.read_text())
    orders = orders_for(path)
    batches: dict[tuple[str, tuple[str, ...]], list[dict]] = {}
    for number, case in enumerate(merge.merged(doc["tests"])):
        groups = needed_groups(_tested_alerts({"tests": [case]}))
        key = (orders[number % len(orders)], tuple(g["name"] for g in groups))
        batches.setdefault(key, []).append(case)
    failures = []
    for number, ((order, _), cases) in enumerate(sorted(batches.items())):
        res = run_in_order({**doc, "tests": cases},
                           needed_groups(_tested_alerts({"tests": cases})), order,
                           tmp_path / f"{number}-{path.name}")
        if res.returncode != 0:
            failures.append(f"under {order}:\n{res.stdout}{res.stderr}")
    assert failures == []


@pytest.mark.integration
@pytest.mark.parametrize(("selector", "passes"), [('job="dcgm"', True),
                                                   ('job="another-dcgm"', False)])
def test_a_selector_keeps_or_drops_its_exporters_series_under_promtool(tmp_path, selector,
                                                                       passes):
    """The attribution suite's dcgm-exporter series carry job="dcgm": selecting that job changes
    no outcome; selecting another job drops them, so the suite's alerts no longer fire."""
    suite = ROOT / "tests" / "rules" / "attribution_hostname.test.yml"
    doc = yaml.safe_load(suite.read_text())
    wanted = {g["name"] for g in needed_groups(_tested_alerts(doc))}
    cfg = {**generate.DEFAULTS, "selectors": {"dcgmExporter": selector}}
    groups = [g for g in generate.groups(cfg) if g["name"] in wanted]
    assert any('{job="' in r["expr"] for g in groups for r in g["rules"])
    result = run_in_order(doc, groups, ORDERS[0], tmp_path / suite.name)
    assert (result.returncode == 0) is passes, result.stdout[-2000:] + result.stderr[-2000:]


def test_group_orders_differ_and_name_every_group():
    names = [g["name"] for g in _groups()]
    orders = group_orders(names)
    assert set(orders) == set(ORDERS)
    assert all(sorted(o) == sorted(names) for o in orders.values())
    assert len({tuple(o) for o in orders.values()}) == len(orders)


def test_a_suite_loads_every_group_its_alerts_read():
    """The closure follows records across groups and ALERTS to the alerts it selects: a host
    alert pulls in the host normalisation, the repeat offenders pull in the hardware alerts."""
    names = {g["name"] for g in needed_groups({"HostOomKill"})}
    assert {"wandb-infra-host", "wandb-infra-normalise-host"} <= names
    assert "wandb-infra-gpu-thermal" not in names
    offenders = {g["name"] for g in needed_groups({"GpuRepeatOffender"})}
    assert {"wandb-infra-gpu-xid", "wandb-infra-gpu-memory"} <= offenders
    every = {g["name"] for path in TESTS
             for g in needed_groups(_tested_alerts(yaml.safe_load(path.read_text())))}
    assert every == {g["name"] for g in _groups()}


@pytest.mark.integration
def test_promtool_unit_tests_can_fail(tmp_path):
    """A wrong expectation must fail, so the unit tests above are not vacuous."""
    doc = yaml.safe_load((ROOT / "tests" / "rules" / "node_alerts.test.yml").read_text())
    doc["rule_files"] = [str(RULES)]
    case = next(t for t in doc["tests"] if t["alert_rule_test"][0].get("exp_alerts"))
    case["alert_rule_test"][0]["exp_alerts"][0]["exp_labels"]["hostname"] = "elsewhere"
    doc["tests"] = [case]
    bad = tmp_path / "bad.test.yml"
    bad.write_text(yaml.safe_dump(doc))
    assert _promtool("test", "rules", str(bad)).returncode != 0


def _pair_of(alert: str) -> list[dict]:
    """The fault case of ``alert`` in gpu_alerts_hostname.test.yml and its healthy twin."""
    tests = yaml.safe_load((ROOT / "tests" / "rules" / "gpu_alerts_hostname.test.yml"
                            ).read_text())["tests"]
    return [t for t in tests if t["alert_rule_test"][0]["alertname"] == alert][:2]


def test_merged_cases_keep_each_members_hosts_runs_and_expectations():
    fault, twin = _pair_of("GpuXidError")
    assert "healthy twin" in twin["name"] and fault["alert_rule_test"][0]["exp_alerts"]
    [both] = merge.merged([fault, twin])
    assert both["name"] == f"{fault['name']} + {twin['name']}"
    assert both["alert_rule_test"] == fault["alert_rule_test"]
    series = [s["series"] for s in both["input_series"]]
    assert len(series) == len(fault["input_series"]) + len(twin["input_series"])
    assert all('hostname="m1n1"' in s for s in series[len(fault["input_series"]):])
    # a pod (joined by name), a pipeline alert or a colliding series keeps a case alone
    pod = copy.deepcopy(twin)
    pod["input_series"][0]["series"] = pod["input_series"][0]["series"].replace(
        "{", '{pod="train-0",', 1)
    assert len(merge.merged([fault, pod])) == 2
    exporter = 'up{instance="exporter:9842",job="wandb-infra-exporter"}'
    up, down = copy.deepcopy(fault), copy.deepcopy(twin)
    up["input_series"].append({"series": exporter, "values": "1x80"})
    down["input_series"].append({"series": exporter, "values": "0x80"})
    assert len(merge.merged([up, down])) == 2
    assert len(merge.merged([up, copy.deepcopy(up)])) == 1  # the same series, once


@pytest.mark.integration
def test_a_merged_member_that_fires_unexpectedly_fails(tmp_path):
    """Merging cannot hide a leak: a twin made faulty (the fault case's series on the twin's
    hosts, no alert expected of it) fails the merged test, as it fails alone."""
    fault, twin = _pair_of("GpuXidError")
    faulty_twin = {**copy.deepcopy(fault), "name": twin["name"],
                   "alert_rule_test": copy.deepcopy(twin["alert_rule_test"])}
    [both] = merge.merged([fault, faulty_twin])
    doc = {"evaluation_interval": "30s", "tests": [both]}
    groups = needed_groups(_tested_alerts(doc))
    assert run_in_order(doc, groups, ORDERS[0], tmp_path / "leak.test.yml").returncode != 0
    [alone] = merge.merged([fault])
    assert run_in_order({**doc, "tests": [alone]}, groups, ORDERS[0],
                        tmp_path / "fault.test.yml").returncode == 0


@pytest.mark.integration
def test_group_orders_catch_an_order_dependent_rule(tmp_path):
    """The order harness can fail: an alert in one group reads a record of another with no
    room for a one-step lag (``for: 0s`` on a condition true at exactly one evaluation), so it
    fires at that evaluation only when the record's group ran first. The case passes in file
    order and must fail in at least one other order the suites run under."""
    groups = [{"name": "lag-record", "rules": [{"record": "lag:blip:up", "expr": "blip == 1"}]},
              {"name": "lag-alert",
               "rules": [{"alert": "LagBlip", "expr": "lag:blip:up", "for": "0s"}]}]
    doc = {"evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": [{"series": 'blip{host="a"}', "values": "0 1 0 0"}],
        "alert_rule_test": [{"eval_time": "1m", "alertname": "LagBlip",
                             "exp_alerts": [{"exp_labels": {"host": "a"}}]}]}]}
    passed = {order: run_in_order(doc, groups, order, tmp_path / f"{order}.test.yml"
                                  ).returncode == 0 for order in ORDERS}
    assert passed["file-order"]
    assert not all(passed.values()), passed


def test_every_alert_fires_and_has_a_healthy_twin():
    firing: set[str] = set()
    silent: set[str] = set()
    for path in TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for check in test["alert_rule_test"]:
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    assert set(ALERTS) <= firing
    assert set(ALERTS) <= silent


def test_attribution_shapes_for_both_spellings():
    for sp in build.SPELLINGS:
        names = [t["name"] for t in yaml.safe_load(
            (ROOT / "tests" / "rules" / f"attribution_{sp}.test.yml").read_text())["tests"]]
        for shape in ("two runs on a host", "duplicated by two exporter replicas",
                      "several faulty GPUs", "idle host", "unknown GPUs never"):
            assert any(shape in n for n in names), (sp, shape)


def test_required_alert_names_exist():
    for name in ("GpuXidError", "GpuContainedEccError", "GpuUncontainedEccError",
                 "GpuXidApplicationError", "GpuFallenOffBus", "GpuThermalViolation",
                 "GpuTemperatureCritical", "GpuNvlinkErrors", "GpuPcieReplayRate",
                 "InfinibandLinkDown", "InfinibandLinkFlapping", "NodeDown", "TrainingStalled",
                 "TrainingStraggler"):
        assert name in ALERTS


def _dashboard_panel_ids() -> dict[str, set[int]]:
    """Panel ids per dashboard uid in generated dashboards/, when they exist."""
    found: dict[str, set[int]] = {}
    for path in (ROOT / "dashboards").rglob("*.json"):
        data = json.loads(path.read_text())
        data = data.get("dashboard", data)
        if "uid" not in data:
            continue
        ids: set[int] = set()
        stack = list(data.get("panels", []))
        while stack:
            p = stack.pop()
            if "id" in p:
                ids.add(p["id"])
            stack.extend(p.get("panels", []))
        found[data["uid"]] = ids
    return found


def test_conventions_lint():
    runbook = (ROOT / "docs" / "runbook.md").read_text()
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', runbook))
    dash_ids = _dashboard_panel_ids()
    rules = _alert_rules()
    assert {r["alert"] for r in rules} == set(ALERTS)
    for rule in rules:
        name, labels, ann = rule["alert"], rule["labels"], rule["annotations"]
        assert NAME.match(name) and len(name) <= 40, name
        assert labels["severity"] in SEVERITIES, name
        assert labels["category"] in CATEGORIES, name
        assert set(REQUIRED_ANNOTATIONS) <= set(ann), name
        assert "{{" not in ann["summary"] and ann["summary"].endswith("."), name
        assert ann["summary"][0].isupper(), name
        assert "{{ $" in ann["description"], name
        assert ann["runbook_url"].split("#", 1)[1] in anchors, name
        panel_ids = {p.id for p in panels.PANELS.values()}
        assert int(ann["panel_id"]) in panel_ids, name
        dash = next(d for d in panels.DASHBOARDS.values() if d.uid == ann["dashboard_uid"])
        key = next(p for p in panels.PANELS.values() if p.id == int(ann["panel_id"]))
        assert dash.key in key.dashboards, name
        if ann["dashboard_uid"] in dash_ids:
            assert int(ann["panel_id"]) in dash_ids[ann["dashboard_uid"]], name
        for text in ann.values():
            assert text.strip() == text and text, name
    for d in ALERTS.values():
        assert d.scope in SCOPES
        assert "{{ $value" in d.description or d.name in ("GpuFallenOffBus",), d.name


def test_groups_and_recording_names():
    groups = _groups()
    assert len({g["name"] for g in groups}) == len(groups)
    for group in groups:
        assert 0 < len(group["rules"]) <= 20, group["name"]
        for rule in group["rules"]:
            if "record" in rule:
                assert RECORD.match(rule["record"]), rule["record"]


def test_tiers_keep_records_visible_and_counter_windows_overlapping():
    """A record slower than the lookback must be read through ``last_over_time`` over its
    interval plus the margin by every other group, or it vanishes between evaluations and
    resets the readers' ``for``; alert groups stay at ``SLOW`` at most (continuous ``ALERTS``);
    a rate window shorter than the interval would skip increases."""
    defaults = {"interval": "30s"}
    margin = duration_seconds(tiers.READ_MARGIN)
    groups = _groups()
    recorded = {r["record"]: (g["name"], duration_seconds({**defaults, **g}["interval"]))
                for g in groups for r in g["rules"] if "record" in r}
    intervals, windows, wrapped = set(), 0, 0
    for group in groups:
        interval = duration_seconds({**defaults, **group}["interval"])
        intervals.add(interval)
        if any("alert" in r for r in group["rules"]):
            assert interval <= duration_seconds(tiers.SLOW), group["name"]
        for rule in group["rules"]:
            for window in re.findall(r"\b(?:rate|increase)\([^\[]*\[(\w+)\]", rule["expr"]):
                assert duration_seconds(window) > interval, (group["name"], rule["expr"])
                windows += 1
            for record, (home, every) in recorded.items():
                if home == group["name"] or every + margin <= tiers.LOOKBACK_SECONDS:
                    continue
                name = re.escape(record)
                reads = re.findall(rf"(?<![\w:])({name})(?![\w:])", rule["expr"])
                covered = re.findall(rf"last_over_time\({name}(?:{{[^}}]*}})?\[(\w+)\]\)",
                                     rule["expr"])
                assert len(covered) == len(reads), (group["name"], record, rule["expr"])
                assert all(duration_seconds(w) >= every + margin for w in covered), record
                wrapped += len(covered)
    assert len(intervals) == 4, intervals
    assert windows >= 20, windows
    assert wrapped >= 10, wrapped


def _reads(name: str, expr: str) -> int:
    """How many selectors of ``name`` (whole name, not a prefix of a longer one) ``expr`` has."""
    return len(re.findall(rf"(?<![\w:]){re.escape(name)}(?![\w:])", expr))


def test_target_maps_read_each_input_once():
    """Selecting a series is the unit of cost: the remembered target map reads the maps seen
    within the hour once (``or on (instance, job)`` keeps a remembered map only where no seen
    one is), and the vanished hosts read the map and up once each."""
    records = {r["record"]: r["expr"] for g in _groups() for r in g["rules"] if "record" in r}
    remembered = records[s.TARGET_HOSTS]
    assert _reads(s.NODE_EXPORTER_TARGET, remembered) == 1
    assert _reads(s.DCGM_EXPORTER_TARGET, remembered) == 1
    vanished = records[s.TARGET_VANISHED]
    assert _reads("up", vanished) == 1
    assert _reads(s.TARGET_HOSTS, vanished) == 2


def test_attribution_is_recorded_once_and_read_by_every_attributed_alert():
    """The join metrics are read for attribution in one group only, each once for all three
    families; every GPU, host and link alert reads its family's rows and never the join metrics
    themselves (a pipeline alert may check that they exist)."""
    groups = _groups()
    join_metrics = ("wandb_run_node_info", "wandb_run_gpu_info")
    attribution = next(g for g in groups if g["name"] == "wandb-infra-attribution")
    assert "interval" not in attribution
    reads = sum(_reads(m, r["expr"]) for r in attribution["rules"] for m in join_metrics)
    assert reads == 2, reads  # runs on any signalled host, GPU rows on signalled GPUs' hosts
    for group in groups:
        for rule in (r for r in group["rules"] if "alert" in r):
            scope = ALERTS[rule["alert"]].scope
            if scope in ("gpu", "host", "link"):
                assert not any(_reads(m, rule["expr"]) for m in join_metrics), rule["alert"]
                assert f":{scope}_faults:" in rule["expr"], rule["alert"]


def test_every_alert_expression_is_short():
    """An alert states its condition and its attribution in a few lines."""
    for rule in _alert_rules():
        assert len(rule["expr"].splitlines()) <= 12, rule["alert"]


def test_no_join_puts_run_info_on_the_one_side():
    """group_left must never take run labels from the info metric (many-to-many on 2 runs)."""
    for rule in _alert_rules():
        for m in re.finditer(r"group_left \(([^)]*)\)", rule["expr"]):
            assert "wandb_run_id" not in m.group(1), rule["alert"]


def _condition_text(alert: str) -> str:
    """An alert's expression with its fault record's, where it reads one."""
    rules = {r.get("record") or r["alert"]: r["expr"] for g in _groups() for r in g["rules"]}
    record = generate.fault_record(ALERTS[alert])
    return rules[alert] + ("\n" + rules[record] if record else "")


def test_xid_catalog_classes():
    """The rules select each class's codes (the classes themselves: tests/test_verdict.py)."""
    assert f'"{regex(XidClass.HARDWARE)}"' in _condition_text("GpuXidError")
    assert f'"{regex(XidClass.APPLICATION)}"' in _condition_text("GpuXidApplicationError")
    assert f'"{regex(XidClass.DECODE)}"' in _condition_text("GpuXidDecodeRequired")
    assert {46, 110, 48, 154} <= set(codes(XidClass.HARDWARE))


def test_violation_unit_option(tmp_path):
    args = generate.parse_args(["--violation-unit", "us", "--out-dir", str(tmp_path)])
    text = generate.rules_text(generate.options(args))
    assert "/ 1e6" in text and "/ 1e9" not in text


def test_bad_config_is_rejected_and_writes_nothing(tmp_path, monkeypatch, capsys):
    cfg = tmp_path / "rules.yml"
    cfg.write_text("violation_unit: ms\n")
    assert generate.main(["--config", str(cfg), "--out-dir", str(tmp_path)]) == 2
    assert "violation_unit" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rules.yml"]
    monkeypatch.setenv("WANDB_INFRA_RULES__RUNBOOK_BASE", "")
    assert generate.main(["--out-dir", str(tmp_path)]) == 2
    with pytest.raises(SystemExit):
        generate.main(["--violation-unit", "seconds"])


def test_env_override_and_check_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_INFRA_RULES__RUNBOOK_BASE", "https://example.test/repo/")
    assert generate.main(["--out-dir", str(tmp_path)]) == 0
    text = (tmp_path / "alert_rules" / generate.RULES_FILE).read_text()
    assert "https://example.test/repo/runbook#gpuxiderror" in text
    assert generate.main(["--out-dir", str(tmp_path), "--check"]) == 0
    monkeypatch.delenv("WANDB_INFRA_RULES__RUNBOOK_BASE")
    assert generate.main(["--out-dir", str(tmp_path), "--check"]) == 1


def test_alerts_ship_the_catalog_condition():
    """Each attributed alert reads the catalog's condition as stated, but for slow-tier records
    read through ``last_over_time`` (a substitution, no rewriting of the PromQL around them) and
    operators moved to their operand's line (``tidy``): in its own expression when short, else in
    its fault record in the same group."""
    by_record = generate.record_tiers()
    recorded = inline = 0
    for group in _groups():
        rules = {r.get("record") or r["alert"]: r["expr"] for r in group["rules"]}
        for alert in ALERTS.values():
            if alert.name not in rules or alert.scope in ("run", "pipeline"):
                continue
            shipped = alert.expr
            for read in generate.records_read(alert.expr, by_record):
                if generate.outlives_lookback(by_record[read]):
                    shipped = shipped.replace(read, generate.reading(read, by_record[read]))
            shipped = generate.tidy(shipped)
            record = generate.fault_record(alert)
            if record:
                assert rules[record] == shipped, alert.name
                assert record in rules[alert.name], alert.name
                recorded += 1
            else:
                assert shipped in rules[alert.name], alert.name
                inline += 1
    assert recorded >= 5 and inline >= 30, (recorded, inline)


def test_templates_substitute_names_and_indent_nested_values():
    inner = "max by (hostname) (\n  up\n)"
    assert fill("""
        sum(
          ${INNER}
        ) > ${LIMIT}
    """, {"INNER": inner, "LIMIT": 0.5}) == "sum(\n  max by (hostname) (\n    up\n  )\n) > 0.5"
    assert fill('label_replace(x, "a", "$1", "b", "(.+)")', {}) == \
        'label_replace(x, "a", "$1", "b", "(.+)")'
    assert placeholders("${A} or ${B} or ${A}") == ["A", "B"]
    with pytest.raises(KeyError):
        fill("${UNKNOWN} > 0", {})


def test_a_cut_is_compared_in_the_exporters_unit_before_the_factor():
    """Thresholding first keeps the factor's arithmetic off every GPU but the few left; the
    threshold is converted exactly (0.9 x 100 is 90, not 90.00000000000001)."""
    util = s.dcgm_raw(s.DCGM_GPU_UTIL, fn="avg_over_time", window="2m", cut=" < 0.9")
    assert util == ('((avg_over_time({__name__=~"DCGM_FI_DEV_GPU_UTIL"}[2m]) < 90) / 100) or '
                    '(avg_over_time({__name__=~"DCGM_FI_DEV_GPU_UTIL_RATIO"}[2m]) < 0.9)')
    assert s.dcgm_raw(s.DCGM_FB_USED, cut=" > 1073741824") == \
        '({__name__=~"DCGM_FI_DEV_FB_USED"} > 1024) * 1048576'
    assert s.dcgm_raw(s.DCGM_FB_USED) == '{__name__=~"DCGM_FI_DEV_FB_USED"} * 1048576'
    with pytest.raises(ValueError, match="positive"):
        s.dcgm_raw((("X", " - 1"),), cut=" > 0")
    with pytest.raises(ValueError, match="'op number'"):
        s.dcgm_raw(s.DCGM_FB_USED, cut=" > 0 unless x")
    # an and-operand keeps the exporter's unit: the cut converted, no factor on every GPU
    assert (s.dcgm_raw(s.DCGM_FB_USED, cut=" > 1073741824", unit=False)
            == '{__name__=~"DCGM_FI_DEV_FB_USED"} > 1024')


def _group_comment_blocks(text: str) -> dict[str, str]:
    """The comment lines right above each ``- name:`` line, joined, by group name."""
    out, pending = {}, []
    for line in text.splitlines():
        if line.startswith("# "):
            pending.append(line[2:])
        elif line.startswith("- name: "):
            out[line.removeprefix("- name: ")] = " ".join(pending)
            pending = []
        elif line.strip():
            pending = []
    return out


def test_group_comments_name_exactly_their_own_alerts():
    """Comments are built from the group they stand above: every alert of the group is named
    there, and no alert of another group is."""
    text = RULES.read_text()
    blocks = _group_comment_blocks(text)
    groups = _groups()
    assert set(blocks) == {g["name"] for g in groups}
    for group in groups:
        comment = blocks[group["name"]]
        listed = re.search(r"Alerts ((?:[A-Z]\w+(?:, )?)+)", comment)
        alerts = {r["alert"] for r in group["rules"] if "alert" in r}
        assert set(listed.group(1).rstrip(", ").split(", ") if listed else ()) == alerts, \
            group["name"]


def test_no_folding_inside_promql_or_templates():
    """Every annotation and single-line expression is on one line of the file, as read back; a
    template such as ``{{ $value`` never breaks across lines."""
    for path in (RULES, ROOT / "alert_rules" / generate.MANIFEST_FILE):
        text = path.read_text()
        assert not re.search(r"\{\{[^}]*\n", text), path.name
        lines = set(text.splitlines())
        for rule in (r for g in _groups() for r in g["rules"]):
            singles = [*rule.get("annotations", {}).values(), rule["expr"]]
            for value in (v for v in singles if "\n" not in v):
                assert any(value in line or value.replace("'", "''") in line
                           or json.dumps(value) in line for line in lines), (path.name, value)


def test_tidy_moves_operators_and_changes_nothing_else():
    expr = "max by (a) (\n  x\n  and on (a)\n  y\n)\nor\n(\n  z\n  unless on (a, b)\n  w\n)"
    tidied = generate.tidy(expr)
    assert tidied == "max by (a) (x and on (a) y)\nor (z unless on (a, b) w)"
    long = "max by (a) (\n  " + "x" * generate.FOLD_MAX + "\n  and on (a) y\n)"
    assert generate.tidy(long) == long  # too wide to fold
    def spaced(text: str) -> str:
        return re.sub(r"\s+", " ", text).replace("( ", "(").replace(" )", ")")

    assert spaced(tidied) == spaced(expr)
