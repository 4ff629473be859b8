"""The quarantine as its own process: the receiver (``serve``) holds no
scheduler rights and never acts; ``wandb-infra-bridge quarantine`` reads the bridge's store,
drains the node of a fault that needs it out of service on the real Slurm the tests start, and
the receiver shows that decision in the run's notes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from harness.bridge_payloads import alert, notification
from harness.processes import prom_query, prometheus, wait_for
from harness.wandb_standin import WandbStandin
from tests.slurm_cluster import slurm_cluster, unavailable_reason
from tests.views import rules_raising
from wandb_infra.bridge.config import DEFAULTS, build_config
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryWorker
from wandb_infra.bridge.projection.wandb_client import WandbClient

pytestmark = [pytest.mark.slurm, pytest.mark.integration,
              pytest.mark.skipif(unavailable_reason() is not None,
                                 reason=unavailable_reason() or "")]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with slurm_cluster(tmp_path_factory.mktemp("slurm") / "cluster", gpus=2) as cluster:
        yield cluster


def _config(tmp_path: Path) -> dict:
    raw = json.loads(json.dumps(DEFAULTS))
    raw["store"]["path"] = str(tmp_path / "bridge.sqlite")
    raw["quarantine"].update(enabled=True, dry_run=False, scheduler="slurm", max_fraction=1.0)
    raw["auth"]["bearer_token"] = "webhook-token-0123456789"
    return raw


def test_serve_never_acts_and_the_quarantine_process_does(slurm, tmp_path):
    """The fault is raised by a real Prometheus rule, so the quarantine process (which acts
    only on alerts Prometheus confirms it raised) takes the node out."""
    fault = alert("GpuUncontainedEccError", category="gpu_hardware", host=slurm.node, gpu="1",
                  run="r1", start=datetime.now(UTC) - timedelta(seconds=30), extra={"xid": "95"})
    (tmp_path / "prom").mkdir()
    (tmp_path / "prom" / "rules.yml").write_text(rules_raising([fault]))
    with prometheus(f"global:\n  evaluation_interval: 1s\nrule_files: "
                    f"['{tmp_path / 'prom' / 'rules.yml'}']\n", tmp_path / "prom") as prom:
        wait_for(lambda: prom_query(prom.url, 'ALERTS{alertstate="firing"}'), 60, "the rule")
        _serve_never_acts(slurm, tmp_path, fault, prom.url)


def _serve_never_acts(slurm, tmp_path: Path, fault: dict, prom: str) -> None:
    raw = _config(tmp_path)
    raw["prometheus"]["url"] = prom
    (tmp_path / "bridge.yaml").write_text(yaml.safe_dump(raw))
    store = Store(raw["store"]["path"])
    store.ingest(parse_notification(json.dumps(notification([fault])).encode()))
    policy = build_config(raw).policy
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "r1")
        receiver = DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                                  markers=None, links=GrafanaLinks(""), metrics=BridgeMetrics(),
                                  policy=policy)
        assert receiver.quarantine is not None and receiver.quarantine.actions is None
        receiver.run_once()
        assert "DRAIN" not in slurm.run("scontrol", "show", "node", "-o", slurm.node)
        assert not (tmp_path / "quarantine-audit.jsonl").exists()

        env = {**os.environ, **slurm.env()}
        done = subprocess.run(
            [sys.executable, "-m", "wandb_infra.bridge.cli", "quarantine", "--once",
             "--config", str(tmp_path / "bridge.yaml")],
            env=env, capture_output=True, text=True, timeout=120, check=False)
        try:
            assert done.returncode == 0, done.stderr
            assert "DRAIN" in slurm.run("scontrol", "show", "node", "-o", slurm.node)
            audit = [json.loads(line)["outcome"] for line in
                     (tmp_path / "quarantine-audit.jsonl").read_text().splitlines()]
            assert audit == ["acting", "done"]
            receiver._next_refresh = 0.0
            receiver.run_once()
            notes = wb.run("team", "proj", "r1").notes.replace("\\", "")
            assert f"Quarantine: quarantined {slurm.node}" in notes
        finally:
            slurm.run("scontrol", "update", f"NodeName={slurm.node}", "State=RESUME")


def test_the_quarantine_process_refuses_without_prometheus(tmp_path):
    """Nothing could be confirmed, so nothing may be drained: one clear line, exit 2."""
    raw = _config(tmp_path)
    (tmp_path / "bridge.yaml").write_text(yaml.safe_dump(raw))
    done = subprocess.run(
        [sys.executable, "-m", "wandb_infra.bridge.cli", "quarantine", "--once", "--config",
         str(tmp_path / "bridge.yaml")], capture_output=True, text=True, timeout=60,
        check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "wandb-infra-bridge quarantine: prometheus.url is not set: the quarantine acts only on "
        "alerts Prometheus confirms it raised, and without it can confirm none")


def test_the_quarantine_process_refuses_when_disabled(tmp_path):
    raw = _config(tmp_path)
    raw["quarantine"]["enabled"] = False
    (tmp_path / "bridge.yaml").write_text(yaml.safe_dump(raw))
    done = subprocess.run(
        [sys.executable, "-m", "wandb_infra.bridge.cli", "quarantine", "--once", "--config",
         str(tmp_path / "bridge.yaml")], capture_output=True, text=True, timeout=60,
        check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == ("wandb-infra-bridge quarantine: quarantine.enabled is false: "
                                   "this process would have nothing to do")
