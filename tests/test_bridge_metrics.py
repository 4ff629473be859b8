"""Unauthenticated ``/metrics`` of the real bridge process lists no entity or project names
(what a W&B team works on); a scrape with the webhook's credentials gets the per-project
figures. Before: ``gpu_hours_lost{entity,project}`` named every project to anyone."""

from __future__ import annotations

import json
import time

import pytest
import requests

from harness.bridge_payloads import alert, notification
from harness.bridge_process import AUTH, bridge_env, start_bridge
from harness.wandb_standin import WandbStandin
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.common.runkey import RunKey

pytestmark = pytest.mark.integration


def test_unauthenticated_metrics_name_no_entity_or_project(tmp_path):
    with WandbStandin() as wb:
        _check(tmp_path, bridge_env(tmp_path, wandb_url=wb.url, wandb_key=wb.api_key))


def _check(tmp_path, env):
    store = Store(tmp_path / "state" / "bridge.sqlite")
    store.ingest(parse_notification(json.dumps(notification([
        alert("NodeDown", category="node", host="h1", run=run, entity="acme-secret",
              project=project) for run, project in (("r1", "project-x"), ("r2", "project-y"))
    ])).encode()))
    store.record_gpu_hours(RunKey("acme-secret", "project-x", "r1"), 2.5, time.time())
    store.record_gpu_hours(RunKey("acme-secret", "project-y", "r2"), 1.0, time.time())
    store.close()
    bridge = start_bridge(tmp_path, env)
    try:
        anonymous = requests.get(bridge.url + "/metrics", timeout=10).text
        wrong = requests.get(bridge.url + "/metrics", timeout=10,
                             headers={"Authorization": "Bearer guess"}).text
        named = requests.get(bridge.url + "/metrics", timeout=10, headers=AUTH).text
    finally:
        bridge.stop()
    for text in (anonymous, wrong):
        assert "acme-secret" not in text and "project-" not in text
        assert 'wandb_infra_bridge_gpu_hours_lost{entity="_all",project="_all"} 3.5' in text
    assert 'gpu_hours_lost{entity="acme-secret",project="project-x"} 2.5' in named
    assert "wandb_infra_bridge_notifications_total" in anonymous  # the rest is unchanged
