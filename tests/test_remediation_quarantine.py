"""Active quarantine against the Kubernetes stand-in: cordon + taint, conflicts, dry run, the
circuit breaker under a storm of critical alerts, idempotency across restarts, and the decision
shown in the run's W&B notes. (Real Slurm: tests/test_remediation_slurm.py.)"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from harness.bridge_payloads import alert, notification
from harness.k8s_standin import K8sStandin, make_node
from harness.wandb_standin import WandbStandin
from tests.views import prometheus_raising, quarantine_pass
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.root_cause import Issue, diagnose
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.quarantine.actuator import Quarantine, check
from wandb_infra.bridge.quarantine.schedulers import KubernetesActions
from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.runkey import RunKey

START = datetime.now(UTC) - timedelta(minutes=2)


def xid(host: str, run: str = "r1", **kw: Any) -> dict[str, Any]:
    """XID 95 on GPU 3: it needs a GPU reset, so the node must leave the pool."""
    return alert("GpuUncontainedEccError", category="gpu_hardware", host=host, gpu="3", run=run,
                 start=START, extra={"xid": "95"}, **kw)


def ingest(store: Store, alerts: list[dict[str, Any]]) -> None:
    store.ingest(parse_notification(json.dumps(notification(alerts)).encode()))


def issues(tmp_path: Path, alerts: list[dict[str, Any]]) -> list[Issue]:
    store = Store(tmp_path / "issues.sqlite")
    ingest(store, alerts)
    out = []
    for run, *_ in store.runs():
        out += diagnose(store.facts(run), timedelta(minutes=10)).issues
    return out


@pytest.fixture
def k8s():
    with K8sStandin() as server:
        server.set_nodes([make_node(f"gpu-{i:02d}", taints=[
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
            for i in range(40)])
        yield server


def quarantine(k8s: K8sStandin, tmp_path: Path, **cfg: Any) -> Quarantine:
    actions = KubernetesActions({"api_server": k8s.url, "token": k8s.token},
                                "wandb.ai/infra-quarantine")
    return Quarantine({"dry_run": False, "max_nodes": 5, "max_fraction": 0.5, **cfg}, actions,
                      tmp_path / "audit.jsonl")


def test_cordon_and_taint_with_conflict_retry(k8s, tmp_path):
    (issue,) = issues(tmp_path, [xid("gpu-07")])
    k8s.conflict_next_patches = 2  # another writer changed the Node twice meanwhile
    (decision,) = quarantine(k8s, tmp_path).consider(issue)
    assert decision.outcome == "done", decision
    node = k8s.nodes["gpu-07"]
    assert node["spec"]["unschedulable"] is True
    assert {(t["key"], t["effect"]) for t in node["spec"]["taints"]} == {
        ("nvidia.com/gpu", "NoSchedule"), ("wandb.ai/infra-quarantine", "NoSchedule")}
    assert node["metadata"]["annotations"]["wandb.ai/infra-quarantine"].startswith(
        "wandb-infra: GpuUncontainedEccError gpu-07")
    assert len(k8s.patches) == 1  # the two conflicting attempts were refused by the server
    # Idempotent: nothing more for the same issue, even after an operator uncordons the node.
    k8s.nodes["gpu-07"]["spec"]["unschedulable"] = False
    k8s.nodes["gpu-07"]["spec"]["taints"] = []
    assert quarantine(k8s, tmp_path).consider(issue) == []
    assert len(k8s.patches) == 1
    assert [json.loads(line)["outcome"] for line in
            (tmp_path / "audit.jsonl").read_text().splitlines()] == ["acting", "done"]


def test_dry_run_changes_nothing_and_forbidden_is_reported(k8s, tmp_path):
    (issue,) = issues(tmp_path, [xid("gpu-03")])
    (decision,) = quarantine(k8s, tmp_path, dry_run=True).consider(issue)
    assert decision.outcome == "dry_run" and "would have quarantined gpu-03" in decision.text()
    assert k8s.patches == [] and not k8s.nodes["gpu-03"]["spec"].get("unschedulable")
    k8s.patch_forbidden = True
    (failed,) = quarantine(k8s, tmp_path / "live").consider(issue)
    assert failed.outcome == "failed" and "HTTP 403" in failed.detail


def test_only_open_critical_hardware_root_causes(k8s, tmp_path):
    stall = alert("TrainingStalled", category="workload", host="gpu-01", run="r1",
                  start=START, severity="warning")
    resolved = xid("gpu-02", run="r2", end=datetime.now(UTC))
    q = quarantine(k8s, tmp_path)
    for issue in issues(tmp_path, [stall, resolved]):
        assert q.consider(issue) == []
    assert k8s.patches == []


def test_circuit_breaker_under_a_storm(k8s, tmp_path):
    """30 runs each hit by a critical XID on a different host: at most min(max_nodes,
    max_fraction x fleet) nodes are cordoned per window, the rest refused and audit-logged."""
    storm = issues(tmp_path, [xid(f"gpu-{i:02d}", run=f"r{i}") for i in range(30)])
    assert len(storm) == 30
    now = [2_000_000_000.0]
    q = Quarantine({"dry_run": False, "max_nodes": 3, "max_fraction": 0.05},
                   KubernetesActions({"api_server": k8s.url, "token": k8s.token}, "q"),
                   tmp_path / "audit.jsonl", clock=lambda: now[0])
    decisions = [d for issue in storm for d in q.consider(issue)]
    done = [d for d in decisions if d.outcome == "done"]
    assert len(done) == 2  # 5 % of 40 nodes = 2 < max_nodes 3
    assert sum(1 for n in k8s.nodes.values() if n["spec"].get("unschedulable")) == 2
    refused = [d for d in decisions if d.outcome == "refused"]
    assert len(refused) == 28 and "circuit breaker open" in refused[0].detail
    # The storm goes on: refused hosts are not retried (nor re-logged) within RETRY_SECONDS.
    assert [d for issue in storm for d in q.consider(issue)] == []
    # A restarted bridge remembers (audit log): no new action within the window.
    now[0] += 400
    again = Quarantine({"dry_run": False, "max_nodes": 3, "max_fraction": 0.05},
                       KubernetesActions({"api_server": k8s.url, "token": k8s.token}, "q"),
                       tmp_path / "audit.jsonl", clock=lambda: now[0])
    assert {d.outcome for issue in storm for d in again.consider(issue)} == {"refused"}
    # After the window two more may go.
    now[0] += 3600
    later = [d for issue in storm for d in again.consider(issue)]
    assert sum(d.outcome == "done" for d in later) == 2
    assert sum(1 for n in k8s.nodes.values() if n["spec"].get("unschedulable")) == 4


def test_config_checked():
    assert check(None)["enabled"] is False and check(None)["dry_run"] is True
    with pytest.raises(ConfigError):
        check({"scheduler": "lsf"})
    with pytest.raises(ConfigError):
        check({"max_fraction": 2})
    with pytest.raises(ConfigError):
        check({"drain_everything": True})


def test_decision_shown_in_the_notes(k8s, tmp_path):
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "r1")
        store = Store(tmp_path / "bridge.sqlite")
        policy = DeliveryPolicy(flush_interval=0, node_state_refresh=0.01, quarantine={
            **check(None), "enabled": True, "scheduler": "kubernetes",
            "kubernetes": {"api_server": k8s.url, "token": k8s.token}})
        with prometheus_raising([xid("gpu-05")]) as prom:
            worker = DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                                    markers=None, links=GrafanaLinks(""),
                                    metrics=BridgeMetrics(), policy=policy,
                                    prometheus=PrometheusClient(prom))
            ingest(store, [xid("gpu-05")])
            worker.run_once()
            quarantine_pass(worker)
            worker._next_refresh = 0
            worker.run_once()
            view = worker.runs.view(RunKey("team", "proj", "r1"))
        notes = wb.run("team", "proj", "r1").notes.replace("\\", "")
    assert "Quarantine: dry run: would have quarantined gpu-05" in notes
    assert k8s.patches == []
    audit = (tmp_path / "quarantine-audit.jsonl").read_text().splitlines()
    assert [json.loads(a)["outcome"] for a in audit] == ["dry_run"]
    # the run page shows the same decision
    assert view is not None
    page = view.as_dict(lambda *_: "")["remediations"]
    assert next(iter(page.values()))["quarantine"]["state"] == "dry run"


def test_faults_that_need_only_a_restart_are_never_offered(k8s, tmp_path):
    """XID 94 (NVIDIA: restart the application) and an application XID are critical or not,
    but need no node action: the quarantine is not asked, so nothing is cordoned; XID 95 on
    the same pass is."""
    store = Store(tmp_path / "bridge.sqlite")
    policy = DeliveryPolicy(flush_interval=0, node_state_refresh=0.01, quarantine={
        **check(None), "enabled": True, "scheduler": "kubernetes", "max_fraction": 1.0,
        "kubernetes": {"api_server": k8s.url, "token": k8s.token}})
    raised = [
        alert("GpuContainedEccError", category="gpu_hardware", host="gpu-01", gpu="3",
              run="r1", start=START, extra={"xid": "94"}),
        alert("GpuXidApplicationError", category="workload", host="gpu-02", gpu="1",
              run="r2", start=START, severity="warning", extra={"xid": "13"}),
        xid("gpu-03", run="r3")]
    with prometheus_raising(raised) as prom:
        worker = DeliveryWorker(store, client=None, markers=None, links=GrafanaLinks(""),
                                metrics=BridgeMetrics(), policy=policy,
                                prometheus=PrometheusClient(prom))
        ingest(store, raised)
        worker.run_once()
        quarantine_pass(worker)
    audit = [json.loads(a) for a in
             (tmp_path / "quarantine-audit.jsonl").read_text().splitlines()]
    assert {a["host"] for a in audit} == {"gpu-03"}
