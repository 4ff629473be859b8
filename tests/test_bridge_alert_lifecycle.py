"""The alert life cycle as Alertmanager defines it, with real Prometheus, Alertmanager 0.25 and
the bridge process: Prometheus evaluates a rule on a series the test switches, sends to
Alertmanager, and Alertmanager notifies the bridge.

Alertmanager's alert store merges an alert into the stored one of its fingerprint when their
intervals overlap and otherwise replaces it (github.com/prometheus/alertmanager,
provider/mem/mem.go ``Put``, types/types.go ``Alert.Merge``). So after a resolve anyone can
send through Alertmanager's open API, Prometheus' next re-send makes the alert firing again with
the same ``startsAt``: before, the bridge kept it resolved for good. The HA pair's two
``startsAt`` values of one alert, through two real Alertmanagers, are in
``test_bridge_alertmanager_ha.py``."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests

from harness.bridge_process import BridgeProcess, bridge_env, start_bridge
from harness.processes import Service, alertmanager, prometheus, scrape_target, wait_for

pytestmark = pytest.mark.integration

SERIES = {"fault": 1}
LABELS = 'hostname="gpu05",wandb_entity="team",wandb_project="proj",wandb_run_id="r1"'


def _rules(tmp: Path, hold: str) -> Path:
    path = tmp / f"rules-{hold}.yml"
    path.write_text(f"""groups:
  - name: lifecycle
    interval: 1s
    rules:
      - alert: GpuXidError
        expr: xid_fault == 1
        for: {hold}
        labels: {{severity: critical, category: gpu_hardware}}
        annotations: {{summary: "XID on {{{{ $labels.hostname }}}}", impact: "The run stalls.",
                       remediation: "Drain the node."}}
""")
    return path


def _prom_config(target: str, am: str, rules: Path) -> str:
    return f"""global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: ['{rules}']
alerting:
  alertmanagers: [{{static_configs: [{{targets: ['{am.removeprefix("http://")}']}}]}}]
scrape_configs:
  - job_name: exporter
    honor_labels: true
    static_configs: [{{targets: ['{target}']}}]
"""


def _am_config(bridge: BridgeProcess, token: Path) -> str:
    return f"""route:
  receiver: bridge
  group_by: [alertname, wandb_run_id]
  group_wait: 500ms
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: bridge
    webhook_configs:
      - url: {bridge.url}/alertmanager
        send_resolved: true
        http_config:
          authorization: {{type: Bearer, credentials_file: {token}}}
"""


def _text() -> str:
    return f"# TYPE xid_fault gauge\nxid_fault{{{LABELS}}} {SERIES['fault']}\n"


def _stored(tmp: Path) -> list[tuple[str, str]]:
    """(starts_at, status) of run r1's alerts, read from the bridge's store."""
    with sqlite3.connect(f"file:{tmp / 'state' / 'bridge.sqlite'}?mode=ro", uri=True) as conn:
        return sorted(conn.execute("SELECT starts_at, status FROM alerts WHERE run_id='r1'"
                                   ).fetchall())


def _states(tmp: Path) -> list[str]:
    return [status for _, status in _stored(tmp)]


@pytest.fixture
def world(tmp_path) -> Iterator[tuple[Path, BridgeProcess, Service, str]]:
    SERIES["fault"] = 1
    bridge = start_bridge(tmp_path, bridge_env(tmp_path))
    try:
        with scrape_target(_text) as target, \
                alertmanager(_am_config(bridge, tmp_path / "token"), tmp_path / "am") as am:
            yield tmp_path, bridge, am, target
    finally:
        bridge.stop()


def test_a_forged_resolve_is_undone_by_prometheus_next_send(world):
    tmp, _bridge, am, target = world
    config = _prom_config(target, am.url, _rules(tmp, "0s"))
    with prometheus(config, tmp / "prom", ("--rules.alert.resend-delay=1s",)):
        wait_for(lambda: _states(tmp) == ["firing"], 60, "the alert stored firing")
        (live,) = requests.get(am.url + "/api/v2/alerts", timeout=10).json()
        forged = {"labels": live["labels"], "startsAt": live["startsAt"],
                  "endsAt": datetime.now(UTC).isoformat()}
        assert requests.post(am.url + "/api/v2/alerts", json=[forged], timeout=10).ok
        wait_for(lambda: _states(tmp) == ["resolved"], 30,
                 "the forged resolve stored")
        wait_for(lambda: _states(tmp) == ["firing"], 30,
                 "the alert firing again after Prometheus' next send")
        SERIES["fault"] = 0  # the real end closes it
        wait_for(lambda: _states(tmp) == ["resolved"], 60, "the real resolve")

