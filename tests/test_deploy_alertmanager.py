"""The shipped Alertmanager example pages the operators once per incident and hands every
run-labelled alert to the bridge: alerts are routed with the real ``amtool config routes test``
(Debian's Alertmanager 0.25) for every catalog alert, with and without a W&B run, and a real
Alertmanager on the shipped routing receives an XID cascade (the fault plus 64 stalled hosts) and
sends its notifications to webhook sinks that count them. The routing snippet in
deploy/bridge.example.yaml is checked to be the same routing."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml

from harness import processes
from harness.processes import AMTOOL
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.catalog.vocabulary import SEVERITIES

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
SNIPPET_SOURCE = ROOT / "deploy" / "bridge.example.yaml"
BRIDGE, OWNERS, PAGER, QUEUE = "wandb.bridge", "run.owners", "operators.pager", "operators"
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


def snippet() -> dict:
    """The Alertmanager routing commented out at the end of deploy/bridge.example.yaml."""
    text = SNIPPET_SOURCE.read_text()
    block = text[text.index("# inhibit_rules:"):]
    return yaml.safe_load("\n".join(line.removeprefix("# ") for line in block.splitlines()))


@pytest.fixture(scope="module")
def snippet_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("snippet") / "alertmanager.yml"
    path.write_text(yaml.safe_dump(snippet()))
    return path


def _an_alert(severity: str, category: str | None = None) -> dict[str, str]:
    """Labels of the first catalog alert of that severity (and category) that can be on a run."""
    alert = next(a for a in ALERTS.values() if a.severity == severity and a.scope != "pipeline"
                 and a.category == (category or a.category))
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


def test_the_bridge_example_snippet_is_the_example_routing():
    example = yaml.safe_load(EXAMPLE.read_text())
    copied = snippet()
    assert copied["route"] == example["route"]
    assert copied["receivers"] == example["receivers"]
    assert copied["inhibit_rules"] == example["inhibit_rules"]


@pytest.mark.parametrize("which", ["example", "snippet"])
def test_run_labelled_critical_alert_reaches_the_bridge_and_the_pager(which, snippet_config):
    config = EXAMPLE if which == "example" else snippet_config
    assert routes({**_an_alert("critical"), **RUN}, config) == [BRIDGE, PAGER]


@pytest.mark.parametrize("severity", SEVERITIES)
def test_idle_host_alert_reaches_the_operators_only(severity):
    labels = {"alertname": f"Idle{severity.title()}", "severity": severity,
              "hostname": "gpu-node-042"}
    assert routes(labels) == [OPERATORS[severity]]


def test_an_empty_run_id_is_not_a_run():
    """Prometheus drops empty labels, but a relabelled empty value must not reach the bridge."""
    labels = {"alertname": "GpuXidError", "severity": "critical", "wandb_run_id": ""}
    assert routes(labels) == [PAGER]


def test_every_catalog_alert_reaches_the_operators_or_the_runs_owner():
    """Each alert the rules can raise, as they raise it (with a run unless it is a pipeline
    alert, which is never on a run): infrastructure faults page or queue for the operators by
    severity, with or without a run; a run's symptoms go to the bridge only, and the same
    symptom without a run (a user's own rule) still reaches the operators."""
    assert set(SEVERITIES) == {a.severity for a in ALERTS.values()}
    for alert in ALERTS.values():
        labels = {"alertname": alert.name, "severity": alert.severity,
                  "category": alert.category, "hostname": "gpu-node-017", **alert.extra_labels}
        operators = OPERATORS[alert.severity]
        if alert.scope == "pipeline":
            assert routes(labels) == [operators], alert.name
            continue
        on_run = OWNERS if alert.category == "workload" else operators
        assert routes(labels | RUN) == [BRIDGE, on_run], alert.name
        assert routes(labels) == [operators], alert.name


def test_without_continue_the_operators_would_lose_run_alerts(tmp_path):
    """The property the example depends on, shown with amtool: drop `continue: true` and a
    critical fault under a run reaches the bridge alone."""
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(EXAMPLE.read_text().replace("continue: true", "continue: false"))
    labels = {"alertname": "GpuXidError", "severity": "critical", **RUN}
    assert routes(labels, broken) == [BRIDGE]
    assert routes(labels) == [BRIDGE, PAGER]


# --- a real Alertmanager and an XID cascade ------------------------------------------------------

class _Sink(BaseHTTPRequestHandler):
    """Records each webhook notification under the receiver named by its path."""

    received: dict[str, list[dict]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.received.setdefault(self.path.strip("/"), []).append(body)
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test reads what was received, not the access log."""


@pytest.fixture
def sink() -> Iterator[tuple[str, dict[str, list[dict]]]]:
    received: dict[str, list[dict]] = {}
    handler = type("Sink", (_Sink,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _timed_for_a_test(config: dict, url: str) -> str:
    """The shipped config with every receiver a webhook to the sink and the waits in seconds,
    the routing tree itself unchanged."""
    def shorten(route: dict) -> None:
        route.update(group_wait="1s", group_interval="2s", repeat_interval="1h")
        for child in route.get("routes", []):
            shorten(child)
    shorten(config["route"])
    config["receivers"] = [
        {"name": r["name"], "webhook_configs": [
            {"url": f"{url}/{r['name']}", "send_resolved": False, "max_alerts": 0}]}
        for r in config["receivers"]]
    return yaml.safe_dump(config)


def test_an_xid_cascade_is_one_operator_page_and_whole_at_the_bridge(sink, tmp_path):
    """GPU 3 of gpu-node-017 has a contained ECC error (XID 94, which DCGM also counts as a
    double-bit ECC error), then all 64 hosts of the run stall: the operators get one
    notification, a page titled by the fault and its host; the bridge gets the root cause and
    the 64 stalled hosts in one group."""
    url, received = sink
    config = _timed_for_a_test(yaml.safe_load(EXAMPLE.read_text()), url)
    now = datetime.now(UTC).isoformat()
    def fired(name: str, **labels: str) -> dict:
        alert = ALERTS[name]
        return {"labels": {"alertname": name, "severity": alert.severity,
                           "category": alert.category, **labels, **RUN}, "startsAt": now}
    root = fired("GpuContainedEccError", hostname="gpu-node-017", gpu="3", xid="94")
    same_event = fired("GpuDoubleBitEccErrors", hostname="gpu-node-017", gpu="3")
    stalls = [fired("TrainingStalled", hostname=f"gpu-node-{i:03d}") for i in range(1, 65)]
    with processes.alertmanager(config, tmp_path / "am") as am:
        # the root cause first, as Prometheus fires it (an inhibition needs its source known)
        for batch in ([root], [same_event, *stalls]):
            requests.post(f"{am.url}/api/v2/alerts", json=batch, timeout=10).raise_for_status()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
                received.get(PAGER) and sum(len(n["alerts"]) for n in received.get(BRIDGE, []))
                >= 1 + len(stalls)):
            time.sleep(0.2)
        time.sleep(3)  # one more group_interval: anything else that was coming has come
    operators = [n for name in (PAGER, QUEUE) for n in received.get(name, [])]
    assert len(operators) == 1, [n["groupLabels"] for n in operators]
    page = received[PAGER][0]
    assert page["groupLabels"] == {"alertname": "GpuContainedEccError",
                                   "hostname": "gpu-node-017"}
    assert [a["labels"]["alertname"] for a in page["alerts"]] == ["GpuContainedEccError"]
    at_bridge = [a for n in received[BRIDGE] for a in n["alerts"]]
    assert {a["labels"]["alertname"] for a in at_bridge} == {"GpuContainedEccError",
                                                            "TrainingStalled"}
    assert {a["labels"]["hostname"] for a in at_bridge if a["labels"]["alertname"] ==
            "TrainingStalled"} == {f"gpu-node-{i:03d}" for i in range(1, 65)}
    assert all(n["groupLabels"] == RUN for n in received[BRIDGE])
    assert len(received[OWNERS]) <= 2  # no integration in the shipped file; grouped per run
