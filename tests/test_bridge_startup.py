"""The bridge refuses to start when W&B delivery could never work, in one line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.bridge_payloads import alert, notification
from harness.wandb_standin import WandbStandin
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.markers import startup_checks
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.common.runkey import RunKey


@pytest.fixture
def wb():
    with WandbStandin() as server:
        server.add_run("team", "proj", "r1")
        yield server


def _refused(client, markers: bool) -> str:
    with pytest.raises(SystemExit) as exited:
        startup_checks(client, markers)
    message = str(exited.value.code)
    assert "\n" not in message and message.startswith("wandb-infra-bridge: ")
    return message


def test_markers_on_without_the_sdk_refuses_to_start(wb, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    message = _refused(WandbClient(wb.url, wb.api_key), markers=True)
    assert "pip install '.[markers]'" in message and "wandb.markers: false" in message
    startup_checks(WandbClient(wb.url, wb.api_key), markers=False)
    startup_checks(None, markers=True)  # no W&B key: issues stay in /runs, nothing to check


def test_the_wandb_key_is_checked_at_start(wb):
    startup_checks(WandbClient(wb.url, wb.api_key), markers=False)
    assert [r.operation_name for r in wb.requests] == ["BridgeViewer"]
    message = _refused(WandbClient(wb.url, "not a key"), markers=False)
    assert "malformed" in message and len(wb.requests) == 1, "checked offline, nothing sent"
    message = _refused(WandbClient(wb.url, "z" * 40), markers=False)
    assert "HTTP 401" in message and "rejected the API key" in message
    wb.fail(503, times=None)
    startup_checks(WandbClient(wb.url, wb.api_key), markers=False)  # W&B down: start anyway


def test_a_run_parked_for_auth_says_so(tmp_path, wb):
    store = Store(tmp_path / "bridge.sqlite")
    worker = DeliveryWorker(store, client=WandbClient(wb.url, "z" * 40, timeout=5),
                            markers=None, links=GrafanaLinks(""), metrics=BridgeMetrics(),
                            policy=DeliveryPolicy(flush_interval=0))
    body = json.dumps(notification([alert("NodeDown", category="node", host="h", run="r1")]))
    store.ingest(parse_notification(body.encode()))
    worker.run_once()
    reason = store.parked()[0].parked
    assert "HTTP 401" in reason and "rejected the API key" in reason


def test_a_missing_sdk_at_write_time_parks_with_the_install_hint(tmp_path, wb):
    class NoSdk:
        def write(self, run: RunKey, rows: list) -> None:
            raise ModuleNotFoundError("No module named 'wandb'")

    store = Store(tmp_path / "bridge.sqlite")
    worker = DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                            markers=NoSdk(), links=GrafanaLinks(""), metrics=BridgeMetrics(),
                            policy=DeliveryPolicy(flush_interval=0, marker_settle=0))
    body = json.dumps(notification([alert("NodeDown", category="node", host="h", run="r1")]))
    store.ingest(parse_notification(body.encode()))
    worker.run_once()
    assert "pip install '.[markers]'" in store.parked()[0].parked


@pytest.mark.integration
def test_serve_refuses_a_malformed_key_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB")}
    env.update(WANDB_INFRA_BRIDGE__WANDB__API_KEY="short",
               WANDB_INFRA_BRIDGE__STORE__PATH=str(tmp_path / "state" / "bridge.sqlite"))
    proc = subprocess.run([str(Path(sys.executable).parent / "wandb-infra-bridge"), "serve",
                           "--insecure-local-demo", "--port", "0"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "wandb-infra-bridge: W&B key check failed: the W&B API key is malformed (expected 40+ "
        "letters, digits, '_' or '-', optionally after a 'prefix-'; or a JWT)"]
