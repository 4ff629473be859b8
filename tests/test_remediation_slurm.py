"""Node state and the restart verdict on a REAL single-node Slurm 22.05 (tests/slurm_cluster.py).

The exporter publishes the node's state from ``scontrol show node -o`` and ``sinfo --json``; a
drain with a reason shows up with that reason and as not schedulable; a resume returns it.
"""

from __future__ import annotations

import pytest

from demo.processes import wait_for
from tests.exporter_process import metric_samples, metric_value, running_exporter
from tests.slurm_cluster import slurm_cluster, unavailable_reason

pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(unavailable_reason() is not None,
                                 reason=unavailable_reason() or "")]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with slurm_cluster(tmp_path_factory.mktemp("slurm") / "cluster", gpus=2) as cluster:
        yield cluster


def _state(url: str) -> dict[str, str] | None:
    samples = metric_samples(url, "wandb_infra_node_state")
    return samples[0] if len(samples) == 1 else None


@pytest.mark.parametrize("mode", ["scontrol", "sinfo_json"])
def test_drain_with_reason_and_resume(slurm, mode, tmp_path):
    config = {"registrations": {"enabled": False},
              "node_state": {"slurm": {"enabled": True, "mode": mode, "interval_seconds": 0.3}}}
    with running_exporter(config, tmp_path / "exporter", env=slurm.env()) as url:
        first = wait_for(lambda: _state(url))
        assert first["hostname"] == slurm.node and first["scheduler"] == "slurm"
        assert first["state"].startswith("IDLE")
        assert metric_value(url, "wandb_infra_node_schedulable", hostname=slurm.node) == 1.0
        slurm.run("scontrol", "update", f"NodeName={slurm.node}", "State=DRAIN",
                  f"Reason=XID 94 on GPU 1 ({mode})")
        try:
            drained = wait_for(lambda: (s := _state(url)) and "DRAIN" in s["state"] and s)
            # right after a resume slurmd may still be flagged NOT_RESPONDING until its ping
            assert drained["state"].startswith("IDLE+DRAIN")
            assert drained["reason"] == f"XID 94 on GPU 1 ({mode})"
            assert metric_value(url, "wandb_infra_node_schedulable",
                                hostname=slurm.node) == 0.0
        finally:
            slurm.run("scontrol", "update", f"NodeName={slurm.node}", "State=RESUME")
        wait_for(lambda: metric_value(url, "wandb_infra_node_schedulable",
                                      hostname=slurm.node) == 1.0)
        assert "DRAIN" not in (_state(url) or {}).get("state", "DRAIN")
