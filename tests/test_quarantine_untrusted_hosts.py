"""Alert content is untrusted, so a forged host label costs no node.

A host label must be exactly one node before any scheduler action; the circuit breaker is shared
by every process that appends to the audit log, and one store has one active bridge (a second one
refuses to start in one line); no record, no action; a damaged audit log is reported and skipped,
never fatal. (Real Slurm: tests/test_quarantine_slurm.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from harness.bridge_payloads import alert, notification
from harness.bridge_process import BRIDGE_CLI, ROOT, bridge_env, start_bridge
from harness.k8s_standin import K8sStandin, make_node
from wandb_infra.bridge.diagnosis.root_cause import Issue, diagnose
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.quarantine.actuator import Quarantine
from wandb_infra.bridge.quarantine.schedulers import KubernetesActions, SlurmActions, one_node
from wandb_infra.common.runkey import RunKey

# Some tests start the bridge as a process (a second bridge on one store): the module is not
# in the in-process unit layer.

START = datetime.now(UTC) - timedelta(minutes=2)
FORGED = ["gpu01,gpu[02-40]", "gpu[02-40]", "gpu*", "gpu0?", "ALL", "all", "gpu01 gpu02",
          "gpu01\tgpu02", "NodeName=gpu01", "../nodes", "gpu01/status", "gpu01,", ",gpu01",
          "-gpu01", "gpu01.", "x" * 300]


def issue_on(tmp_path: Path, host: str, run: str = "r1") -> Issue:
    store = Store(tmp_path / f"{run}.sqlite")
    store.ingest(parse_notification(json.dumps(notification([alert(
        "GpuContainedEccError", category="gpu_hardware", host=host, gpu="3", run=run,
        start=START)])).encode()))
    (issue,) = diagnose(store.facts(RunKey("team", "proj", run)), timedelta(minutes=10)).issues
    return issue


class FakeSlurm:
    """``scontrol`` as a fleet of 40 idle nodes gpu01..gpu40 that expands hostlists and ALL."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.drained: set[str] = set()

    @staticmethod
    def expand(expr: str) -> list[str]:
        names = [f"gpu{i:02d}" for i in range(1, 41)]
        if expr.upper() == "ALL":
            return names
        out = []
        for part in expr.replace("gpu[02-40]", ",".join(names[1:])).split(","):
            out += [n for n in names if n == part]
        return out

    def __call__(self, cmd: list[str], **_kw: Any) -> subprocess.CompletedProcess:
        args = cmd[1:]
        self.calls.append(args)
        if args[:3] == ["show", "node", "-o"]:
            nodes = self.expand(args[3]) if len(args) > 3 else self.expand("ALL")
            text = "".join(f"NodeName={n} State={'IDLE+DRAIN' if n in self.drained else 'IDLE'}"
                           " Reason=\n" for n in nodes)
            return subprocess.CompletedProcess(cmd, 0, text, "")
        if args[0] == "update":
            self.drained.update(self.expand(args[1].removeprefix("NodeName=")))
            return subprocess.CompletedProcess(cmd, 0, "", "")
        return subprocess.CompletedProcess(cmd, 1, "", "unexpected")


@pytest.mark.integration
@pytest.mark.parametrize("host", FORGED)
def test_forged_host_label_reaches_no_scheduler(tmp_path, host):
    """Today ``gpu01,gpu[02-40]`` drained 40 of 40 nodes as one node of the breaker."""
    slurm = FakeSlurm()
    q = Quarantine({"dry_run": False, "max_nodes": 2}, SlurmActions(["scontrol"], runner=slurm),
                   tmp_path / "audit.jsonl")
    (decision,) = q.consider(issue_on(tmp_path, host))
    assert decision.outcome == "refused", decision
    assert "not one node" in decision.detail or "reserved" in decision.detail
    assert slurm.drained == set()
    assert not [c for c in slurm.calls if c[0] == "update"]
    assert not [c for c in slurm.calls if len(c) > 3]  # not even looked up by that name
    assert json.loads((tmp_path / "audit.jsonl").read_text())["outcome"] == "refused"


def test_one_node_accepts_real_names():
    for name in ("gpu01", "gpu-node-017", "node_3", "gpu01.rack-b.example.com", "a"):
        assert one_node(name) is None, name
    for name in [*FORGED, "", "gpu01\n", "gpü01"]:
        assert one_node(name) is not None, name


@pytest.mark.integration
def test_slurm_must_name_exactly_the_node(tmp_path):
    """A name Slurm resolves to another or several nodes (an alias, a NodeHostname) is refused."""
    def runner(cmd: list[str], **_kw: Any) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(cmd, 0, "NodeName=gpu07 State=IDLE Reason=\n"
                                                   "NodeName=gpu08 State=IDLE Reason=\n", "")
    q = Quarantine({"dry_run": False, "max_fraction": 1.0},
                   SlurmActions(["scontrol"], runner=runner), tmp_path / "a.jsonl")
    (decision,) = q.consider(issue_on(tmp_path, "gpu07"))
    assert decision.outcome == "failed" and "not exactly that one node" in decision.detail


@pytest.fixture
def k8s():
    with K8sStandin() as server:
        server.set_nodes([make_node(f"gpu-{i:02d}") for i in range(40)])
        yield server


def test_kubernetes_forged_name_is_no_request(k8s, tmp_path):
    q = Quarantine({"dry_run": False, "max_nodes": 5, "max_fraction": 0.5},
                   KubernetesActions({"api_server": k8s.url, "token": k8s.token}, "q"),
                   tmp_path / "a.jsonl")
    for index, host in enumerate(["gpu-01,gpu-02", "../nodes", "*"]):
        (decision,) = q.consider(issue_on(tmp_path, host, run=f"r{index}"))
        assert decision.outcome == "refused"
    assert k8s.patches == []


@pytest.mark.integration
def test_two_processes_on_one_audit_log_share_the_breaker(tmp_path):
    """Today each Quarantine kept its own breaker: 4 drains against a limit of 2."""
    slurm = FakeSlurm()
    audit = tmp_path / "audit.jsonl"
    cfg = {"dry_run": False, "max_nodes": 2, "max_fraction": 1.0}
    first = Quarantine(cfg, SlurmActions(["scontrol"], runner=slurm), audit)
    second = Quarantine(cfg, SlurmActions(["scontrol"], runner=slurm), audit)  # same moment
    outcomes = []
    for index in range(4):
        q = first if index % 2 == 0 else second
        outcomes += [d.outcome for d in q.consider(issue_on(tmp_path, f"gpu{index + 1:02d}",
                                                            run=f"r{index}"))]
    assert sorted(slurm.drained) == ["gpu01", "gpu02"]
    assert outcomes == ["done", "done", "refused", "refused"]


@pytest.mark.integration
def test_no_record_no_action(tmp_path):
    """Today the drain went ahead with an unwritable audit log, and again after a restart."""
    slurm = FakeSlurm()
    audit = tmp_path / "ro" / "audit.jsonl"
    audit.parent.mkdir()
    audit.write_text("")
    audit.chmod(0o400)
    audit.parent.chmod(0o500)
    try:
        if os.access(audit, os.W_OK):  # root ignores modes: make the log a directory instead
            audit.parent.chmod(0o700)
            audit.unlink()
            audit.mkdir()
        q = Quarantine({"dry_run": False, "max_fraction": 1.0},
                       SlurmActions(["scontrol"], runner=slurm), audit)
        (decision,) = q.consider(issue_on(tmp_path, "gpu05"))
        assert decision.outcome == "failed" and "no record, no action" in decision.detail
        assert slurm.drained == set() and q.audit_writable is False
        assert q.consider(issue_on(tmp_path, "gpu05")) == []  # not retried at once
    finally:
        audit.parent.chmod(0o700)


@pytest.mark.integration
def test_an_intent_without_its_result_counts_and_is_never_repeated(tmp_path):
    """A crash between the 'acting' record and the drain's result: the restarted bridge counts
    the node in the breaker and does not drain it again."""
    slurm = FakeSlurm()
    issue = issue_on(tmp_path, "gpu05")
    audit = tmp_path / "audit.jsonl"
    audit.write_text(json.dumps({"at": 2e9, "issue": issue.key, "host": "gpu05",
                                 "outcome": "acting", "detail": "reason 'x'"}) + "\n")
    q = Quarantine({"dry_run": False, "max_nodes": 1, "max_fraction": 1.0},
                   SlurmActions(["scontrol"], runner=slurm), audit, clock=lambda: 2e9 + 10)
    assert q.consider(issue) == []
    (other,) = q.consider(issue_on(tmp_path, "gpu06", run="r2"))
    assert other.outcome == "refused" and "1 node(s)" in other.detail
    assert slurm.drained == set()
    assert "result was not recorded" in q.decisions(issue.key)[0].text()


@pytest.mark.integration
def test_acting_is_recorded_before_the_drain(tmp_path):
    audit = tmp_path / "audit.jsonl"
    seen: list[list[str]] = []

    class Spy(FakeSlurm):
        def __call__(self, cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
            if cmd[1] == "update":
                seen.append([json.loads(x)["outcome"] for x in audit.read_text().splitlines()])
            return super().__call__(cmd, **kw)

    q = Quarantine({"dry_run": False, "max_fraction": 1.0},
                   SlurmActions(["scontrol"], runner=Spy()), audit)
    (done,) = q.consider(issue_on(tmp_path, "gpu09"))
    assert done.outcome == "done" and seen == [["acting"]]
    assert [json.loads(x)["outcome"] for x in audit.read_text().splitlines()] == ["acting",
                                                                                 "done"]
    assert [d.outcome for d in q.decisions(done.issue)] == ["done"]


@pytest.mark.integration
def test_damaged_audit_log_is_reported_and_skipped(tmp_path):
    """Today one bad byte stopped the bridge from starting (UnicodeDecodeError)."""
    slurm = FakeSlurm()
    issue = issue_on(tmp_path, "gpu03")
    audit = tmp_path / "audit.jsonl"
    good = json.dumps({"at": 2e9, "issue": issue.key, "host": "gpu03", "outcome": "done",
                       "detail": "drained"}).encode()
    audit.write_bytes(b'{"at": 1, "issue": "x\xff", "host": "h"}\n' + good + b"\n[1]\n"
                      + b'{"at": 2e9, "issue": "tr')
    q = Quarantine({"dry_run": False, "max_fraction": 1.0},
                   SlurmActions(["scontrol"], runner=slurm), audit, clock=lambda: 2e9 + 5)
    assert [p.split(":")[0] for p in q.audit_problems] == ["line 1", "line 3", "line 4"]
    assert "truncated" in q.audit_problems[2]
    assert q.consider(issue) == []  # the good line still counts: done, never repeated
    (decision,) = q.consider(issue_on(tmp_path, "gpu04", run="r2"))
    assert decision.outcome == "done"
    lines = audit.read_bytes().split(b"\n")
    assert lines[3] == b'{"at": 2e9, "issue": "tr'  # the next record began on its own line
    assert [json.loads(x)["outcome"] for x in lines[4:] if x] == ["acting", "done"]


@pytest.mark.integration
def test_damaged_audit_log_does_not_stop_the_bridge(tmp_path):
    env = bridge_env(tmp_path, QUARANTINE__ENABLED="true")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "quarantine-audit.jsonl").write_bytes(b'{"at": 1\xff}\n{"at"')
    bridge = start_bridge(tmp_path, env)
    try:
        metrics = bridge.metrics()
        assert metrics["wandb_infra_bridge_quarantine_audit_damaged_lines"] == 2
        assert metrics["wandb_infra_bridge_quarantine_audit_writable"] == 1
    finally:
        bridge.stop()
    assert "quarantine audit log damaged" in bridge.log.read_text()


@pytest.mark.integration
def test_a_second_bridge_on_the_same_store_refuses_to_start(tmp_path):
    env = bridge_env(tmp_path)
    bridge = start_bridge(tmp_path, env)
    try:
        second = subprocess.run([*BRIDGE_CLI, "serve", "--port", "0", "--log-level", "info"],
                                env=env, cwd=ROOT,
                                capture_output=True, text=True, timeout=60, check=False)
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert "another bridge (pid" in lines[0] and "refusing to start" in lines[0]
        assert str(bridge.proc.pid) in lines[0]
        assert bridge.proc.poll() is None
    finally:
        bridge.stop()
    # Once the first one stopped, the store is free again.
    again = start_bridge(tmp_path, env)
    again.stop()
