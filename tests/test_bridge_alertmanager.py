"""A real Alertmanager 0.25 delivers to the real bridge process (CLI) with bearer auth.

Covers a receiver name with a dot (it arrives regex-escaped), a notification truncated by
``max_alerts`` (identity must come from each alert, not commonLabels) and resolve delivery.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests

from harness.processes import (
    alertmanager,
    env_without_proxies,
    free_port,
    stays_true,
    wait_for,
    wait_http,
)

BRIDGE_CLI = (sys.executable, "-m", "wandb_infra.bridge.cli")

pytestmark = pytest.mark.integration

TOKEN = "am-bearer-token-for-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _am_config(bridge_port: int, token_file: Path) -> str:
    return f"""
route:
  receiver: wandb.bridge
  group_by: [alertname]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: wandb.bridge
    webhook_configs:
      - url: http://127.0.0.1:{bridge_port}/alertmanager
        send_resolved: true
        max_alerts: 2
        http_config:
          authorization:
            type: Bearer
            credentials_file: {token_file}
"""


def _post_alerts(am_url: str, alerts: list[dict]) -> None:
    resp = requests.post(am_url + "/api/v2/alerts", json=alerts, timeout=10)
    assert resp.status_code == 200, resp.text


def _am_alert(name: str, host: str, run: str, category: str, *, ends: datetime | None = None,
              start: datetime | None = None) -> dict:
    labels = {"alertname": name, "severity": "critical", "category": category,
              "hostname": host, "wandb_entity": "team", "wandb_project": "proj",
              "wandb_run_id": run}
    out = {"labels": labels, "annotations": {"summary": f"{name}.", "impact": "Run stops.",
                                             "remediation": "Drain the node."}}
    if start:
        out["startsAt"] = start.isoformat().replace("+00:00", "Z")
    if ends:
        out["endsAt"] = ends.isoformat().replace("+00:00", "Z")
    return out


def _runs(url: str) -> dict[str, dict]:
    data = requests.get(url + "/runs?format=json", headers=AUTH, timeout=10).json()
    return {r["run_id"]: r for r in data["runs"]}


def test_alertmanager_delivers_to_bridge(tmp_path: Path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    config = tmp_path / "bridge.yaml"
    config.write_text(f"""
listen: {{host: 127.0.0.1, port: {port}}}
auth: {{bearer_token_file: {token_file}}}
store: {{path: {tmp_path / 'state' / 'bridge.sqlite'}}}
grafana: {{base_url: "http://grafana.invalid"}}
""")
    log = (tmp_path / "bridge.log").open("wb")
    proc = subprocess.Popen([*BRIDGE_CLI, "serve", "--config", str(config)],
                            stdout=log, stderr=subprocess.STDOUT, env=env_without_proxies(),
                            cwd=Path(__file__).resolve().parent.parent)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
        url = f"http://127.0.0.1:{port}"
        with alertmanager(_am_config(port, token_file), tmp_path / "am") as am:
            start = datetime.now(UTC) - timedelta(seconds=5)
            _post_alerts(am.url, [_am_alert("NodeDown", f"host-{r}", r, "node", start=start)
                                  for r in ("ra", "rb", "rc")])
            wait_for(lambda: sum(x["alerts"] for x in _runs(url).values()) >= 2, 40)
            # group_interval is 1 s: a second notification of the group (the third alert)
            # would have arrived within 2 s
            stays_true(lambda: sum(x["alerts"] for x in _runs(url).values()) == 2, 2,
                       "max_alerts keeping 2 of 3")
            runs = _runs(url)
            for run_id, row in runs.items():
                assert row["root_cause"] == {"alertname": "NodeDown",
                                             "where": f"host-{run_id}"}
            xid = _am_alert("GpuXidError", "host-x", "rx", "gpu_hardware", start=start)
            _post_alerts(am.url, [xid])
            wait_for(lambda: _runs(url).get("rx"), 40)
            _post_alerts(am.url, [{**xid, "endsAt": (datetime.now(UTC) - timedelta(seconds=1))
                                   .isoformat().replace("+00:00", "Z")}])
            wait_for(lambda: _runs(url)["rx"]["open_issues"] == 0, 40)
            done = _runs(url)["rx"]
            assert done["issues"] == 1 and done["firing"] == 0
        metrics = requests.get(url + "/metrics", timeout=10).text
        assert 'notifications_total{outcome="unauthorised"}' not in metrics
        logs = (tmp_path / "bridge.log").read_text()
        assert '"receiver": "wandb\\\\.bridge"' in logs
        assert '"truncated": "1"' in logs
        assert TOKEN not in logs
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    assert proc.returncode == 0, (tmp_path / "bridge.log").read_text()[-3000:]
