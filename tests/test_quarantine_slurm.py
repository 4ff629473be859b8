"""On a REAL Slurm 22.05 (tests/slurm_cluster.py): a forged host label drains
nothing, however Slurm would expand it (host lists, hostlist ranges, ``ALL``); the real node
named exactly is still drained, once."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest

from harness.bridge_payloads import alert, notification
from tests.slurm_cluster import slurm_cluster, unavailable_reason
from wandb_infra.bridge.diagnosis.root_cause import diagnose
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.quarantine.actuator import Quarantine
from wandb_infra.bridge.quarantine.schedulers import SlurmActions
from wandb_infra.common.runkey import RunKey

pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(unavailable_reason() is not None,
                                 reason=unavailable_reason() or "")]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with slurm_cluster(tmp_path_factory.mktemp("slurm") / "cluster", gpus=1) as cluster:
        yield cluster


def test_forged_host_labels_drain_nothing_on_real_slurm(slurm, tmp_path):
    """Today ``NodeName=<node>,<node>`` and ``NodeName=ALL`` reached scontrol and drained the
    node as one breaker entry; now nothing reaches scontrol beyond the exact node's name."""
    node = slurm.node
    forged = ["gpu01,gpu[02-40]", f"{node},{node}", f"{node},gpu[02-40]", "ALL",
              f"{node}[0-9]", f"{node} ALL"]
    store = Store(tmp_path / "q.sqlite")
    store.ingest(parse_notification(json.dumps(notification([alert(
        "GpuContainedEccError", category="gpu_hardware", host=host, gpu="0", run=f"r{i}",
        start=datetime.now(UTC) - timedelta(minutes=1)) for i, host in enumerate(forged)]
        )).encode()))
    calls: list[list[str]] = []

    def runner(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
        calls.append(cmd)
        return subprocess.run(cmd, env=slurm.env(), **kw)  # noqa: PLW1510 - check is in kw

    q = Quarantine({"dry_run": False, "max_nodes": 5, "max_fraction": 1.0},
                   SlurmActions(["scontrol"], runner=runner), tmp_path / "audit.jsonl")
    try:
        for i in range(len(forged)):
            (issue,) = diagnose(store.facts(RunKey("team", "proj", f"r{i}")),
                                timedelta(minutes=10)).issues
            (decision,) = q.consider(issue)
            assert decision.outcome == "refused", decision
        state = slurm.run("scontrol", "show", "node", "-o", node)
        assert "DRAIN" not in state.split(" State=")[1].split()[0]
        assert calls == []
        # The exact node is still drained, once, as one node.
        store.ingest(parse_notification(json.dumps(notification([alert(
            "GpuContainedEccError", category="gpu_hardware", host=node, gpu="0", run="real",
            start=datetime.now(UTC) - timedelta(minutes=1))])).encode()))
        (issue,) = diagnose(store.facts(RunKey("team", "proj", "real")),
                            timedelta(minutes=10)).issues
        live = Quarantine({"dry_run": False, "max_fraction": 1.0},
                          SlurmActions(["scontrol"], runner=partial(subprocess.run,
                                                                     env=slurm.env())),
                          tmp_path / "audit.jsonl")
        (done,) = live.consider(issue)
        assert done.outcome == "done", done
        assert "DRAIN" in slurm.run("scontrol", "show", "node", "-o", node)
    finally:
        slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
