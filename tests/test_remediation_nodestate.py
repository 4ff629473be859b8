"""Node state from Slurm output and Kubernetes Nodes (the stand-in), published by the exporter."""

from __future__ import annotations

import json

import pytest

from harness.exporter_process import metric_samples, metric_value, running_exporter
from harness.k8s_standin import K8sStandin, make_node
from harness.processes import wait_for
from wandb_infra.common.commands import SourceError
from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.nodestate import (
    NodeState,
    k8s_node_state,
    parse_scontrol_nodes,
    parse_sinfo_json,
    schedulable,
)
from wandb_infra.exporter.cli import build
from wandb_infra.exporter.config import DEFAULTS
from wandb_infra.exporter.hostnames import HostnameMapper
from wandb_infra.exporter.sources.nodestate import KubernetesNodeSource

# Captured from the tests' Slurm 22.05.8 after `scontrol update ... State=DRAIN Reason=...`.
SCONTROL = (
    "NodeName=vm Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=1.15 "
    "Gres=gpu:2 NodeAddr=127.0.0.1 NodeHostName=vm Version=22.05.8 OS=Linux 6.18 #1 SMP @0  "
    "RealMemory=1 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=debug  "
    "BootTime=2026-11-30T23:35:32 CfgTRES=cpu=2,mem=1M,billing=2 AllocTRES= "
    "Reason=XID 94 on GPU 3 [root@2026-12-01T00:29:13]\n"
    "NodeName=gpu02 Arch=x86_64 State=MIXED ThreadsPerCore=1 Partitions=debug\n"
    "NodeName=gpu03 State=DOWN+NOT_RESPONDING Reason=Not responding [slurm@2026-12-01T00:10:00]\n"
)


def test_scontrol_nodes_state_and_reason_without_stamp():
    assert parse_scontrol_nodes(SCONTROL) == [
        NodeState("vm", "slurm", "IDLE+DRAIN", "XID 94 on GPU 3"),
        NodeState("gpu02", "slurm", "MIXED", ""),
        NodeState("gpu03", "slurm", "DOWN+NOT_RESPONDING", "Not responding"),
    ]


def test_sinfo_json_2205_and_newer_shapes():
    data = {"nodes": [
        {"name": "vm", "state": "idle", "state_flags": ["DRAIN"], "reason": "XID 94"},
        {"name": "vm", "state": "idle", "state_flags": ["DRAIN"], "reason": "XID 94"},
        {"name": "n2", "state": ["MIXED", "DRAIN"], "reason": ""},
        {"name": "n3", "state": "allocated"},
        "garbage",
    ]}
    assert parse_sinfo_json(json.dumps(data)) == [
        NodeState("vm", "slurm", "IDLE+DRAIN", "XID 94"),
        NodeState("n2", "slurm", "MIXED+DRAIN", ""),
        NodeState("n3", "slurm", "ALLOCATED", ""),
    ]
    with pytest.raises(SourceError):
        parse_sinfo_json("{}")


@pytest.mark.parametrize(("scheduler", "state", "expected"), [
    ("slurm", "IDLE", True), ("slurm", "MIXED", True), ("slurm", "ALLOCATED", True),
    ("slurm", "IDLE+DRAIN", False), ("slurm", "ALLOCATED+DRAIN", False),
    ("slurm", "drained", False), ("slurm", "DOWN+NOT_RESPONDING", False),
    ("slurm", "IDLE+NOT_RESPONDING", True), ("slurm", "MAINT+RESERVED", False),
    ("slurm", "down*", False),
    ("kubernetes", "Ready", True), ("kubernetes", "Ready,SchedulingDisabled", False),
    ("kubernetes", "Ready,Tainted", False), ("kubernetes", "NotReady", False),
])
def test_schedulable(scheduler, state, expected):
    assert schedulable(scheduler, state) is expected


def test_k8s_states_cordon_taints_conditions():
    assert k8s_node_state(make_node("a")) == NodeState("a", "kubernetes", "Ready", "")
    cordoned = k8s_node_state(make_node("b", unschedulable=True, taints=[
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]))
    assert cordoned == NodeState("b", "kubernetes", "Ready,SchedulingDisabled", "")
    # The GPU-node taint GPU pods tolerate does not take a node out of the pool.
    gpu = k8s_node_state(make_node("c", taints=[
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]))
    assert gpu is not None and gpu.schedulable
    sentinel = k8s_node_state(make_node("d", taints=[
        {"key": "AggregatedNodeHealth", "value": "False", "effect": "NoSchedule"},
        {"key": "soft", "effect": "PreferNoSchedule"}],
        conditions=[{"type": "GpuXidError", "status": "True",
                     "message": "XID 79 on GPU 2"}]))
    assert sentinel == NodeState("d", "kubernetes", "Ready,Tainted",
                                 "taint AggregatedNodeHealth=False:NoSchedule; "
                                 "GpuXidError=True (XID 79 on GPU 2)")
    down = k8s_node_state(make_node("e", ready=False))
    assert down is not None and down.state == "NotReady" and not down.schedulable
    assert k8s_node_state({"metadata": {}}) is None


@pytest.fixture
def k8s():
    with K8sStandin() as server:
        server.set_nodes([make_node(f"gpu-{i:02d}.cluster.local") for i in range(5)])
        yield server


def test_k8s_node_source_pages_and_maps_hostnames(k8s):
    k8s.nodes["gpu-03.cluster.local"]["spec"]["unschedulable"] = True
    source = KubernetesNodeSource({"api_server": k8s.url, "token": k8s.token, "page_size": 2},
                                  HostnameMapper(), grace=60)
    source.poll()
    states = {s.hostname: s.state for s in source.states()}
    assert states == {"gpu-00": "Ready", "gpu-01": "Ready", "gpu-02": "Ready",
                      "gpu-03": "Ready,SchedulingDisabled", "gpu-04": "Ready"}
    assert sum(1 for q in k8s.requests if "continue" in q) == 2
    k8s.forbidden = True
    with pytest.raises(SourceError, match="'list' on 'nodes'"):
        source.poll()
    assert len(source.states()) == 5  # kept for the grace period


def test_k8s_node_source_drops_states_after_grace(k8s):
    now = [1000.0]
    source = KubernetesNodeSource({"api_server": k8s.url, "token": k8s.token},
                                  HostnameMapper(), grace=30, clock=lambda: now[0])
    source.poll()
    now[0] += 31
    assert source.states() == ()


@pytest.mark.integration
def test_exporter_publishes_k8s_node_state(k8s, tmp_path):
    """The real exporter process; connection settings inherited from sources.kubernetes."""
    token = tmp_path / "token"
    token.write_text(k8s.token)
    config = {"registrations": {"enabled": False},
              "sources": {"kubernetes": {"enabled": True, "api_server": k8s.url,
                                         "token_file": str(token), "interval_seconds": 0.3}},
              "node_state": {"kubernetes": {"enabled": True, "interval_seconds": 0.3}}}
    with running_exporter(config, tmp_path / "exporter") as url:
        wait_for(lambda: len(metric_samples(url, "wandb_infra_node_state")) == 5)
        assert metric_value(url, "wandb_infra_node_schedulable", hostname="gpu-02") == 1.0
        node = k8s.nodes["gpu-02.cluster.local"]
        node["spec"]["taints"] = [{"key": "nvsentinel.nvidia.com/quarantine",
                                   "value": "xid-79", "effect": "NoExecute"}]
        wait_for(lambda: metric_value(url, "wandb_infra_node_schedulable",
                                      hostname="gpu-02") == 0.0)
        sample = [s for s in metric_samples(url, "wandb_infra_node_state")
                  if s["hostname"] == "gpu-02"]
        assert sample == [{"hostname": "gpu-02", "scheduler": "kubernetes",
                           "state": "Ready,Tainted",
                           "reason": "taint nvsentinel.nvidia.com/quarantine=xid-79:NoExecute"}]
        assert metric_value(url, "wandb_infra_exporter_source_up",
                            source="kubernetes_nodes") == 1.0


def test_node_state_config_errors(tmp_path):
    cfg = {**DEFAULTS, "listen": "127.0.0.1:0",
           "node_state": {"slurm": {"enabled": True, "mode": "bogus"}}}
    with pytest.raises(ConfigError, match="scontrol"):
        build(cfg)
    with pytest.raises(ConfigError, match="node_state"):
        build({**DEFAULTS, "listen": "127.0.0.1:0", "node_state": {"lsf": {}}})
