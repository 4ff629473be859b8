"""The shipped network rules on node_exporter's own end-to-end fixture (every collector's
exposition on fixture sysfs, tests/data/node_exporter; provenance in tests/data/README.md),
evaluated by promtool: healthy as captured, faults raised on its real ports and interfaces, and
attributed to the run through a FQDN ``node_uname_info{nodename}``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from harness.processes import PROMTOOL
from tests.rules import build
from tests.rules.build import RUN_A, Case, Expect, Series
from wandb_infra.alert_rules import generate
from wandb_infra.catalog.alerts import ALERTS

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "data" / "node_exporter" / "e2e-output.txt"
FAMILIES = ("node_infiniband_", "node_network_up", "node_network_carrier_changes_total")
FQDN, HOST = "gpu-node-7.cluster.example.com", "gpu-node-7"
NETWORK_ALERTS = sorted(n for n, a in ALERTS.items() if a.category == "network")


def _fixture_series(faults: dict[tuple[str, str], str]) -> list[Series]:
    """Every sample of the network families, as scraped from one target for 40 minutes;
    ``faults`` maps (metric, device[/port]) to replacement promtool values."""
    out = []
    for family in text_string_to_metric_families(FIXTURE.read_text()):
        for sample in family.samples:
            if not sample.name.startswith(FAMILIES):
                continue
            where = "/".join(v for k, v in sorted(sample.labels.items()) if k in ("device", "port"))
            values = faults.get((sample.name, where), f"{sample.value:g}x80")
            out.append(Series(sample.name, {"instance": f"{FQDN}:9100", "job": "node",
                                            **sample.labels}, values))
    return out


def _uname() -> Series:
    """node_uname_info as the uname collector writes it (disabled in the fixture run)."""
    return Series("node_uname_info", {"instance": f"{FQDN}:9100", "job": "node",
                                      "domainname": "(none)", "machine": "x86_64",
                                      "nodename": FQDN, "release": "6.1.0-28-amd64",
                                      "sysname": "Linux", "version": "#1 SMP"}, "1x80")


PROMTOOL_TIMEOUT = 600


def same_inputs_once(tests: list[dict]) -> list[dict]:
    """Tests with the same input series as one promtool test checking all their alerts:
    promtool evaluates every loaded rule at every step whatever the alerts a test checks, so a
    fixture of thousands of series costs its steps once instead of once per alert."""
    out: dict[str, dict] = {}
    for test in tests:
        key = json.dumps([test["interval"], test["input_series"]], sort_keys=True)
        if key in out:
            for checks in ("alert_rule_test", "promql_expr_test"):
                if test.get(checks):
                    out[key][checks] = [*out[key].get(checks, []), *test[checks]]
            out[key]["name"] += f"; {test['name']}"
        else:
            out[key] = dict(test)
    return list(out.values())


def _run(tmp_path: Path, cases: list[Case]) -> subprocess.CompletedProcess[str]:
    cfg = build.default_cfg()
    doc = {"rule_files": [str(ROOT / "alert_rules" / generate.RULES_FILE)],
           "evaluation_interval": "30s",
           "tests": same_inputs_once([c.as_dict(cfg) for c in cases])}
    path = tmp_path / "node_exporter_fixture.test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    # CPU-bound: minutes on a loaded 2-core machine; the timeout only stops a hang
    return subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True,
                          text=True, timeout=PROMTOOL_TIMEOUT, check=False)


def test_fixture_has_the_families_the_rules_read():
    """The fixture's sysfs has no symbol/link-integrity counters (node_exporter emits them only
    where the kernel does), so InfinibandPhysicalErrors is exercised by tests/rules only."""
    names = {s.name for s in _fixture_series({})}
    for needed in ("node_infiniband_state_id", "node_infiniband_link_downed_total",
                   "node_infiniband_link_error_recovery_total", "node_network_up",
                   "node_network_carrier_changes_total"):
        assert needed in names


@pytest.mark.integration
def test_healthy_fixture_raises_no_network_alert(tmp_path):
    """Each network alert checked silent on the fixture as captured (one promtool test)."""
    series = [_uname(), build.node_info(RUN_A, HOST), *_fixture_series({})]
    proc = _run(tmp_path, [Case(f"{alert}: node_exporter fixture as captured", alert,
                                series, "30m") for alert in NETWORK_ALERTS])
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.integration
def test_fixture_port_and_interface_down_reach_the_run(tmp_path):
    faults = {("node_infiniband_state_id", "mlx4_0/2"): "4x20 1x60",
              ("node_network_up", "eth0"): "1x20 0x60"}
    series = [_uname(), build.node_info(RUN_A, HOST), *_fixture_series(faults)]
    cases = [
        Case("InfinibandLinkDown on the fixture's mlx4_0 port 2", "InfinibandLinkDown", series,
             "20m", [Expect({**RUN_A, "hostname": HOST, "device": "mlx4_0", "port": "2"},
                            f"InfiniBand mlx4_0 port 2 on {HOST} is in state 1 (4 = active) "
                            "after being active within the last hour.")]),
        Case("NetworkInterfaceDown on the fixture's eth0", "NetworkInterfaceDown", series,
             "20m", [Expect({**RUN_A, "hostname": HOST, "device": "eth0"},
                            f"Interface eth0 on {HOST} is down (was up within the last hour; "
                            "value 0).")]),
    ]
    proc = _run(tmp_path, cases)
    assert proc.returncode == 0, proc.stdout + proc.stderr
