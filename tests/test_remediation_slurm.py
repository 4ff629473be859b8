"""Node state and the restart verdict on a REAL single-node Slurm 22.05 (tests/slurm_cluster.py).

The exporter publishes the node's state from ``scontrol show node -o`` and ``sinfo --json``; a
drain with a reason shows up with that reason and as not schedulable; a resume returns it. With a
real Prometheus scraping that exporter, the bridge's issue notes in W&B (the stand-in) flip from
unsafe (with the exact ``sbatch --exclude``) to safe when the node is drained, back to unsafe
when it is resumed without the reboot its fault needs, and to safe once it has rebooted.
"""

from __future__ import annotations

import json
import subprocess
import time
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest

from harness.bridge_payloads import alert, notification
from harness.exporter_process import metric_samples, metric_value, running_exporter
from harness.processes import prometheus, scrape_target, stays_true, wait_for
from harness.wandb_standin import WandbStandin
from tests.slurm_cluster import slurm_cluster, unavailable_reason
from tests.views import remediation_data
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.root_cause import diagnose
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.quarantine.actuator import Quarantine
from wandb_infra.bridge.quarantine.schedulers import SlurmActions
from wandb_infra.catalog import series
from wandb_infra.common.runkey import RunKey

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


def _notes(wb: WandbStandin) -> str:
    return wb.run("team", "proj", "r1").notes.replace("\\", "")


class NodeTelemetry:
    """The node's boot time as node_exporter reports it, with the two records the shipped rules
    derive for the bridge (the target's host name, the host's GPU count) served as they are."""

    def __init__(self, node: str, boot_time: float) -> None:
        self.node, self.boot_time = node, boot_time

    def text(self) -> str:
        return (f"node_boot_time_seconds {self.boot_time:.0f}\n"
                f'{series.NODE_EXPORTER_TARGET}{{hostname="{self.node}"}} 1\n'
                f'{series.HOST_GPU_COUNT}{{hostname="{self.node}"}} 2\n')


def test_verdict_flips_when_the_node_is_drained_resumed_and_rebooted(slurm, tmp_path):
    """Exporter -> real Prometheus -> bridge remediation -> W&B notes, on real Slurm state: a
    fault that needs a reboot is safe while the node is drained, unsafe again when it is resumed
    with its boot time from before the fault, safe once the boot time is later."""
    config = {"registrations": {"enabled": False},
              "node_state": {"slurm": {"enabled": True, "interval_seconds": 0.3}}}
    telemetry = NodeTelemetry(slurm.node, time.time() - 86400)
    with running_exporter(config, tmp_path / "exporter", env=slurm.env()) as url, \
            WandbStandin() as wb, scrape_target(telemetry.text) as node_exporter:
        target = url.removeprefix("http://")
        prom_cfg = (f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: exporter\n"
                    f"    static_configs:\n      - targets: ['{target}']\n"
                    f"  - job_name: node\n"
                    f"    static_configs:\n      - targets: ['{node_exporter}']\n")
        with prometheus(prom_cfg, tmp_path / "prom") as prom:
            wb.add_run("team", "proj", "r1", notes="mine")
            store = Store(tmp_path / "bridge.sqlite")
            worker = DeliveryWorker(
                store, client=WandbClient(wb.url, wb.api_key, timeout=5), markers=None,
                links=GrafanaLinks(""), metrics=BridgeMetrics(),
                # no join metrics in this Prometheus (placement: test_bridge_confirm.py)
                policy=DeliveryPolicy(confirm_alerts=False, flush_interval=0,
                                      node_state_refresh=0.3),
                prometheus=PrometheusClient(prom.url))
            start = datetime.now(UTC) - timedelta(seconds=20)
            fault = alert("GpuFallenOffBus", category="gpu_hardware", host=slurm.node,
                          gpu="1", run="r1", start=start)

            def ingest(alerts: list) -> None:
                store.ingest(parse_notification(json.dumps(notification(alerts)).encode()),
                             time.time())

            def upserts() -> int:
                return sum(r.operation_name == "BridgeUpsertBucket" for r in wb.requests)

            ingest([fault])
            # until Prometheus has scraped the node's boot time, the reboot is "not seen"
            wait_for(lambda: worker.run_once() >= 0 and "**unsafe**" in _notes(wb)
                     and "has not rebooted since" in _notes(wb), what="unsafe verdict")
            notes = _notes(wb)
            assert f"sbatch --exclude={slurm.node}" in notes
            assert f"{slurm.node} is schedulable (IDLE" in notes
            assert "GpuFallenOffBus needs a reboot of the node" in notes
            assert f"{slurm.node} has not rebooted since the fault" in notes
            before = upserts()

            slurm.run("scontrol", "update", f"NodeName={slurm.node}", "State=DRAIN",
                      "Reason=XID 94 on GPU 1")
            try:
                wait_for(lambda: worker.run_once() >= 0 and "**safe**" in _notes(wb),
                         what="safe verdict after drain")
                notes = _notes(wb)
                assert "out of the pool (IDLE+DRAIN" in notes
                assert "reason 'XID 94 on GPU 1'" in notes
                assert "sbatch --exclude" not in notes
                data = remediation_data(worker.runs.history, store.facts(
                    RunKey("team", "proj", "r1")))["remediation"]
                assert data["verdict"] == "safe" and data["exclusion"] == ""
                host = data["hosts"][0]
                assert host["hostname"] == slurm.node
                assert host["state"].startswith("IDLE+DRAIN")
                assert host["reason"] == "XID 94 on GPU 1"
                assert datetime.fromisoformat(host["since"]) >= start
                # a state change is one more projection, not one per refresh
                assert upserts() - before <= 2
                settled = upserts()
                # five passes, each due a node-state refresh (every 0.3 s): none re-projects
                stays_true(lambda: worker.run_once() >= 0 and upserts() == settled, 1.5,
                           "no projection while nothing changes", interval=0.3)
            finally:
                slurm.run("scontrol", "update", f"NodeName={slurm.node}", "State=RESUME")
            # Returned by the operator, but the boot time predates the fault: the reboot it
            # needs has not happened, so unsafe again (history kept).
            wait_for(lambda: worker.run_once() >= 0 and "**unsafe**" in _notes(wb)
                     and "back in service" in _notes(wb), what="unsafe after resume")
            notes = _notes(wb)
            assert f"{slurm.node} has not rebooted since the fault" in notes
            assert "treated as repaired" not in notes
            assert f"sbatch --exclude={slurm.node}" in notes
            telemetry.boot_time = time.time()  # the node rebooted, its 2 GPUs back
            wait_for(lambda: worker.run_once() >= 0 and "**safe**" in _notes(wb),
                     what="safe after the reboot")
            assert f"{slurm.node} rebooted at" in _notes(wb)
            assert "with its GPUs back" in _notes(wb)
            assert _notes(wb).startswith("mine")


def test_quarantine_drains_real_node_once_and_never_resumes(slurm, tmp_path):
    """Dry run changes nothing; live drains with the reason; the same issue never drains again,
    even after an operator resumed the node; a one-node fleet at 5 % trips the breaker."""
    store = Store(tmp_path / "q.sqlite")
    store.ingest(parse_notification(json.dumps(notification([alert(
        "GpuUncontainedEccError", category="gpu_hardware", host=slurm.node, gpu="1", run="r1",
        start=datetime.now(UTC) - timedelta(minutes=1), extra={"xid": "95"})])).encode()))
    (issue,) = diagnose(store.facts(RunKey("team", "proj", "r1")), timedelta(minutes=10)).issues
    actions = SlurmActions(["scontrol"], runner=partial(subprocess.run, env=slurm.env()))

    def node_state() -> str:
        return slurm.run("scontrol", "show", "node", "-o", slurm.node).split(" State=")[1] \
            .split()[0]

    breaker = Quarantine({"dry_run": False}, actions, tmp_path / "breaker.jsonl")
    (refused,) = breaker.consider(issue)
    assert refused.outcome == "refused" and "5% of 1 nodes" in refused.detail
    dry = Quarantine({"dry_run": True, "max_fraction": 1.0}, actions, tmp_path / "dry.jsonl")
    assert [d.outcome for d in dry.consider(issue)] == ["dry_run"]
    assert "DRAIN" not in node_state()
    live = Quarantine({"dry_run": False, "max_fraction": 1.0}, actions, tmp_path / "live.jsonl")
    try:
        (done,) = live.consider(issue)
        assert done.outcome == "done", done
        assert "DRAIN" in node_state()
        reason = slurm.run("sinfo", "-h", "-N", "-o", "%E").strip()
        assert reason == f"wandb-infra: GpuUncontainedEccError {slurm.node} GPU 1"
        assert live.consider(issue) == []  # idempotent
    finally:
        slurm.run("scontrol", "update", f"NodeName={slurm.node}", "State=RESUME")
    assert live.consider(issue) == []  # the operator's resume stands
    assert "DRAIN" not in node_state()
