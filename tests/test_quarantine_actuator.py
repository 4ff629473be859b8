"""The quarantine's breaker caps drains in total until an operator resets it, and the ledger
beside the audit log remembers every node acted on, so rotating the audit log (logrotate, or an
operator moving it away) never drains a node the operator returned to service."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.test_quarantine_untrusted_hosts import FakeSlurm, issue_on
from wandb_infra.bridge.config import DEFAULTS
from wandb_infra.bridge.quarantine.actuator import Quarantine
from wandb_infra.bridge.quarantine.schedulers import SlurmActions

pytestmark = pytest.mark.integration

CFG = {"dry_run": False, "max_nodes": 2, "max_fraction": 1.0, "window_seconds": 60.0,
       "max_total": 3}


class Clock:
    def __init__(self) -> None:
        self.now = time.time() - 86400  # before the reset the real command line records

    def __call__(self) -> float:
        return self.now


def test_a_returned_node_is_not_drained_again_after_the_audit_log_is_rotated(tmp_path):
    """Before: the audit log was the only memory; a restart after its rotation drained gpu05
    again for the same issue the operator had returned it from."""
    slurm, audit = FakeSlurm(), tmp_path / "audit.jsonl"
    issue = issue_on(tmp_path, "gpu05")
    first = Quarantine(CFG, SlurmActions(["scontrol"], runner=slurm), audit)
    assert [d.outcome for d in first.consider(issue)] == ["done"]
    slurm.drained.clear()  # the operator returns gpu05 to service
    audit.rename(tmp_path / "audit.jsonl.1")  # logrotate
    assert first.consider(issue) == []  # the running process
    restarted = Quarantine(CFG, SlurmActions(["scontrol"], runner=slurm), audit)
    assert restarted.consider(issue) == []
    assert slurm.drained == set()
    # a rotation under a running process: its next decision is read and written in the new file
    (other,) = first.consider(issue_on(tmp_path, "gpu06", run="r2"))
    assert other.outcome == "done"
    assert [json.loads(line)["host"] for line in audit.read_text().splitlines()] == \
        ["gpu06", "gpu06"]


def test_the_breaker_caps_drains_in_total_until_an_operator_resets_it(tmp_path):
    """Before: the breaker only counted a window, so one forged alert an hour drained a node an
    hour for ever. Now 3 in all (max_total), whatever the windows, until a reset."""
    slurm, audit, clock = FakeSlurm(), tmp_path / "audit.jsonl", Clock()
    q = Quarantine(CFG, SlurmActions(["scontrol"], runner=slurm), audit, clock=clock)
    outcomes = []
    for index in range(5):
        clock.now += 3600  # each in its own window
        outcomes += [d.outcome for d in q.consider(issue_on(tmp_path, f"gpu{index + 1:02d}",
                                                            run=f"r{index}"))]
    assert outcomes == ["done", "done", "done", "refused", "refused"]
    assert sorted(slurm.drained) == ["gpu01", "gpu02", "gpu03"]
    refused = q.decisions(issue_on(tmp_path, "gpu04", run="r3").key)[-1]
    assert "since the last reset, limit max_total 3" in refused.detail
    assert "--reset-breaker" in refused.detail
    # a restart keeps the count (the ledger), even with the audit log rotated away
    audit.rename(tmp_path / "audit.jsonl.1")
    clock.now += 3600
    again = Quarantine(CFG, SlurmActions(["scontrol"], runner=slurm), audit, clock=clock)
    (decision,) = again.consider(issue_on(tmp_path, "gpu06", run="r5"))
    assert decision.outcome == "refused" and slurm.drained == {"gpu01", "gpu02", "gpu03"}
    # the operator's reset, through the real command line
    raw = json.loads(json.dumps(DEFAULTS))
    raw["store"]["path"] = str(tmp_path / "bridge.sqlite")
    raw["quarantine"].update(enabled=True, dry_run=False, audit_log=str(audit))
    (tmp_path / "bridge.yaml").write_text(yaml.safe_dump(raw))
    done = subprocess.run(
        [sys.executable, "-m", "wandb_infra.bridge.cli", "quarantine", "--reset-breaker",
         "--config", str(tmp_path / "bridge.yaml")], capture_output=True, text=True,
        timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "3 node(s) had been quarantined since the last reset" in done.stdout
    assert json.loads(Path(f"{audit}.ledger").read_text())["reset_at"] > clock.now
    clock.now = time.time() + 3600
    (after,) = again.consider(issue_on(tmp_path, "gpu07", run="r6"))
    assert after.outcome == "done" and "gpu07" in slurm.drained
    # nodes acted on before the reset are still never drained again for their issue
    slurm.drained.clear()
    assert again.consider(issue_on(tmp_path, "gpu01", run="r0")) == []
