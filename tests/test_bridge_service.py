"""The whole bridge process (CLI) delivering to the W&B stand-in; secrets never reach the log."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from harness.bridge_payloads import TOKEN, alert, notification
from harness.processes import env_without_proxies, free_port, wait_for, wait_http
from harness.wandb_standin import WandbStandin

BRIDGE_CLI = (sys.executable, "-m", "wandb_infra.bridge.cli")

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def test_service_projects_onto_wandb_and_keeps_secrets_out_of_logs(tmp_path: Path):
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "live1", tags=["user"], notes="keep me")
        (tmp_path / "wandb-key").write_text(wb.api_key + "\n")
        (tmp_path / "token").write_text(TOKEN)
        port = free_port()
        env = env_without_proxies()
        env.update({
            "WANDB_INFRA_BRIDGE__AUTH__BEARER_TOKEN_FILE": str(tmp_path / "token"),
            "WANDB_INFRA_BRIDGE__WANDB__API_KEY_FILE": str(tmp_path / "wandb-key"),
            "WANDB_INFRA_BRIDGE__WANDB__BASE_URL": wb.url,
            "WANDB_INFRA_BRIDGE__WANDB__MARKERS": "false",
            "WANDB_INFRA_BRIDGE__WANDB__FLUSH_INTERVAL_SECONDS": "0.2",
            "WANDB_INFRA_BRIDGE__WANDB__BACKOFF_BASE_SECONDS": "0.1",
            "WANDB_INFRA_BRIDGE__STORE__PATH": str(tmp_path / "state" / "b.sqlite"),
            "WANDB_INFRA_BRIDGE__LOG_LEVEL": "debug",
        })
        log = (tmp_path / "bridge.log").open("wb")
        proc = subprocess.Popen([*BRIDGE_CLI, "serve", "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(url + "/healthz", proc=proc)
            wb.fail(503, times=2, retry_after="0.3")
            body = notification([alert("GpuXidError", category="gpu_hardware", host="h1",
                                       gpu="4", run="live1"),
                                 alert("NodeDown", category="node", host="h9", run="ghost")])
            resp = requests.post(url + "/alertmanager", data=json.dumps(body), headers=AUTH,
                                 timeout=10)
            assert resp.status_code == 200
            wait_for(lambda: "infra:GpuXidError" in wb.run("team", "proj", "live1").tags)
            run = wb.run("team", "proj", "live1")
            assert run.tags == ["user", "infra:GpuXidError"]
            assert run.notes.startswith("keep me\n\n")
            wait_for(lambda: all(r["wandb"]["state"] in ("parked", "delivered") for r in
                              requests.get(url + "/runs?format=json", headers=AUTH,
                                           timeout=10).json()["runs"]))
            by_id = {r["run_id"]: r for r in requests.get(
                url + "/runs?format=json", headers=AUTH, timeout=10).json()["runs"]}
            assert by_id["ghost"]["wandb"]["state"] == "parked"
            assert by_id["live1"]["wandb"]["state"] == "delivered"
            metrics = requests.get(url + "/metrics", timeout=10).text
            assert 'wandb_infra_bridge_deliveries_total{outcome="transient"} 2.0' in metrics
            assert "wandb_infra_bridge_parked_runs 1.0" in metrics
            assert wb.api_key not in metrics and TOKEN not in metrics
        finally:
            proc.terminate()
            proc.wait(timeout=15)
            log.close()
        text = (tmp_path / "bridge.log").read_text()
        assert proc.returncode == 0, text[-3000:]
        assert wb.api_key not in text and TOKEN not in text
        assert "parked" in text and "will retry" in text
