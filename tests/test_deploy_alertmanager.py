"""The shipped Alertmanager example keeps paging the operators: alerts are routed with the real
``amtool config routes test`` (Debian's Alertmanager 0.25), for alerts that carry a W&B run and
for alerts on idle hosts, of every severity the catalog uses."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.processes import AMTOOL
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.catalog.vocabulary import SEVERITIES

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
BRIDGE, PAGER, QUEUE = "wandb.bridge", "operators.pager", "operators"
RUN = {"wandb_entity": "acme", "wandb_project": "llm", "wandb_run_id": "r8x2k"}
OPERATORS = {"critical": PAGER, "warning": QUEUE, "info": QUEUE}


def routes(labels: dict[str, str], config: Path = EXAMPLE) -> list[str]:
    """The receivers, in routing-tree order, that amtool resolves ``labels`` to."""
    out = subprocess.run(
        [AMTOOL, "config", "routes", "test", f"--config.file={config}",
         *(f"{k}={v}" for k, v in labels.items())],
        capture_output=True, text=True, check=False, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip().split(",")


def _an_alert(severity: str) -> dict[str, str]:
    """Labels of the first catalog alert of that severity that can be on a run."""
    alert = next(a for a in ALERTS.values() if a.severity == severity and a.scope != "pipeline")
    labels = {"alertname": alert.name, "severity": severity, "category": alert.category,
              "hostname": "gpu-node-017"}
    if alert.scope == "gpu":
        labels["gpu"] = "3"
    return labels


def test_example_passes_amtool_check_config():
    out = subprocess.run([AMTOOL, "check-config", str(EXAMPLE)], capture_output=True, text=True,
                         check=False, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


@pytest.mark.parametrize("severity", SEVERITIES)
def test_run_labelled_alert_reaches_the_bridge_and_the_operators(severity):
    assert routes({**_an_alert(severity), **RUN}) == [BRIDGE, OPERATORS[severity]]


@pytest.mark.parametrize("severity", SEVERITIES)
def test_idle_host_alert_reaches_the_operators_only(severity):
    labels = {"alertname": f"Idle{severity.title()}", "severity": severity,
              "hostname": "gpu-node-042"}
    assert routes(labels) == [OPERATORS[severity]]


def test_an_empty_run_id_is_not_a_run():
    """Prometheus drops empty labels, but a relabelled empty value must not reach the bridge."""
    labels = {"alertname": "GpuXidError", "severity": "critical", "wandb_run_id": ""}
    assert routes(labels) == [PAGER]


def test_every_catalog_alert_pages_or_queues_for_the_operators():
    """Each alert the rules can raise, as they raise it (with a run unless it is a pipeline
    alert, which is never on a run), reaches the operators' receiver for its severity."""
    assert set(SEVERITIES) == {a.severity for a in ALERTS.values()}
    for alert in ALERTS.values():
        labels = {"alertname": alert.name, "severity": alert.severity,
                  "category": alert.category, "hostname": "gpu-node-017", **alert.extra_labels}
        expected = [OPERATORS[alert.severity]]
        if alert.scope != "pipeline":
            labels |= RUN
            expected.insert(0, BRIDGE)
        assert routes(labels) == expected, alert.name
        if alert.scope != "pipeline":
            idle = {k: v for k, v in labels.items() if k not in RUN}
            assert routes(idle) == [OPERATORS[alert.severity]], alert.name


def test_without_continue_the_operators_would_lose_run_alerts(tmp_path):
    """The property the example depends on, shown with amtool: drop `continue: true` and a
    critical fault under a run reaches the bridge alone (the bug of issue 29)."""
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(EXAMPLE.read_text().replace("continue: true", "continue: false"))
    labels = {"alertname": "GpuXidError", "severity": "critical", **RUN}
    assert routes(labels, broken) == [BRIDGE]
    assert routes(labels) == [BRIDGE, PAGER]
