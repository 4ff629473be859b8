"""The exporter's node-state pollers keep host identity exact: a host name several distinct
nodes map to (the first DNS label two racks share) carries no state, never one node's."""

from __future__ import annotations

import pytest

from harness.k8s_standin import K8sStandin, make_node
from wandb_infra.common.nodestate import NodeState
from wandb_infra.exporter.hostnames import HostnameMapper
from wandb_infra.exporter.sources.nodestate import KubernetesNodeSource, SlurmNodeSource

# ``scontrol show node -o`` of two racks whose nodes share the first label of their names: the
# faulty gpu-07 of rack B is schedulable, rack A's gpu-07 is drained for a kernel update.
SCONTROL = (
    "NodeName=gpu-07.rack-a State=IDLE+DRAIN Reason=kernel update [root@2026-12-01T00:29:13]\n"
    "NodeName=gpu-07.rack-b State=IDLE\n"
    "NodeName=gpu-08.rack-a State=MIXED\n"
)


def _slurm(text: str, mapper: HostnameMapper) -> SlurmNodeSource:
    return SlurmNodeSource({"command": ["printf", "%s", text]}, mapper, grace=60)


@pytest.mark.integration
@pytest.mark.parametrize("order", [1, -1], ids=["drained-first", "idle-first"])
def test_slurm_nodes_sharing_a_first_label_publish_no_state(order):
    lines = SCONTROL.splitlines(keepends=True)
    source = _slurm("".join(lines[:2][::order] + lines[2:]), HostnameMapper())
    result = source.poll()
    assert source.states() == (NodeState("gpu-08", "slurm", "MIXED", ""),)
    assert result.problems == [
        "nodes gpu-07.rack-a, gpu-07.rack-b all map to host name 'gpu-07': no state published "
        "for it (set hostnames.strip_domain: false or a rewrite that tells them apart)"]


@pytest.mark.integration
def test_distinct_names_keep_every_state():
    source = _slurm(SCONTROL, HostnameMapper(strip_domain=False))
    assert not source.poll().problems
    assert {s.hostname: s.state for s in source.states()} == {
        "gpu-07.rack-a": "IDLE+DRAIN", "gpu-07.rack-b": "IDLE", "gpu-08.rack-a": "MIXED"}


def test_kubernetes_nodes_sharing_a_first_label_publish_no_state():
    with K8sStandin() as k8s:
        k8s.set_nodes([make_node(n) for n in ("gpu-07.rack-a", "gpu-07.rack-b", "gpu-08")])
        k8s.nodes["gpu-07.rack-a"]["spec"]["unschedulable"] = True
        source = KubernetesNodeSource({"api_server": k8s.url, "token": k8s.token},
                                      HostnameMapper(), grace=60)
        result = source.poll()
    assert [s.hostname for s in source.states()] == ["gpu-08"]
    assert len(result.problems) == 1 and "'gpu-07'" in result.problems[0]
