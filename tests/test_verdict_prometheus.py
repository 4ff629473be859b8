"""The restart verdict read from a real Prometheus whose telemetry changes over time: the
simulator's dcgm-exporter and node_exporter through the shipped rules, and the exporter's node
state (served here) for the scheduler. A GPU reset, a reboot, a drain and return, a link that
comes back: each changes the verdict the bridge would write."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from demo.simulator.scrape import prometheus_config
from demo.stack import scale_rules
from harness.processes import prom_query, prometheus, scrape_target, wait_for
from harness.simulator_process import RemoteCluster, simulator
from wandb_infra.bridge.diagnosis.need import Policy
from wandb_infra.bridge.diagnosis.root_cause import AlertFact, diagnose
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.prometheus.remediation import NodeStateHistory, Remediation
from wandb_infra.catalog import series

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
RULE_FILES = sorted((ROOT / "alert_rules").glob("*.rules.yml"))
HOSTS = ("gpu-node-001", "gpu-node-002", "gpu-node-003")
SETTLE = 4.0
POLICY = Policy(settle_seconds=SETTLE)


class NodeStates:
    """``wandb_infra_node_state`` as the exporter publishes it, changed by the test."""

    def __init__(self) -> None:
        self.states = {h: ("IDLE", "") for h in HOSTS}

    def text(self) -> str:
        lines = ["# TYPE wandb_infra_node_state gauge"]
        lines += [f'wandb_infra_node_state{{hostname="{h}",scheduler="slurm",state="{s}",'
                  f'reason="{r}"}} 1' for h, (s, r) in sorted(self.states.items())]
        return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[tuple[RemoteCluster, NodeStates, str]]:
    assert RULE_FILES, "alert_rules/ has no rule files: run make generate"
    states = NodeStates()
    workdir = tmp_path_factory.mktemp("verdict-prom")
    with scrape_target(states.text) as target, \
            simulator(workdir / "sim", len(HOSTS)) as sim:
        cluster, address = sim.cluster, sim.address
        rules = []
        for path in RULE_FILES:
            rules.append(workdir / path.name)
            # every ``for`` and slow tier 60 times faster: minutes become seconds
            rules[-1].write_text(scale_rules(path.read_text(), 1 / 60))
        extra = [{"job_name": "node-state", "scrape_interval": "1s", "static_configs": [
            {"targets": [target]}]}]
        config = prometheus_config(address, cluster.hosts, interval="1s",
                                   rule_files=[str(p) for p in rules],
                                   extra_scrape_configs=extra)
        with prometheus(config, workdir) as prom:
            for expr in (f"count({series.GPU_PRESENT}) == {8 * len(HOSTS)}",
                         f"count({series.NODE_EXPORTER_TARGET}) == {len(HOSTS)}",
                         f"count({series.HOST_GPU_COUNT}) == {len(HOSTS)}",
                         "count(count_over_time(wandb_infra_node_state[1m]) >= 3) == 3"):
                wait_for(lambda e=expr: prom_query(prom.url, e), 120, expr, 0.5)
            yield cluster, states, prom.url


def _fact(name: str, host: str, gpu: str, started: datetime, *, xid: int | None = None,
          ended: datetime | None = None) -> AlertFact:
    labels = {"alertname": name, "hostname": host, "gpu": gpu}
    if xid is not None:
        labels["xid"] = str(xid)
    return AlertFact(fingerprint=f"{name}-{host}-{gpu}", alertname=name, starts_at=started,
                     ends_at=ended, severity="critical", category="gpu_hardware", hostname=host,
                     gpu=gpu, labels=labels)


def verdict(url: str, *facts: AlertFact, at: float | None = None) -> Remediation:
    """The restart verdict now, or as it was at ``at`` (a test reading a moment that a busy
    machine may already have left behind, such as a link back for less than the settle time)."""
    diagnosis = diagnose(list(facts), timedelta(minutes=10))
    history = NodeStateHistory(PrometheusClient(url),
                               clock=time.time if at is None else lambda: at)
    rems = history.for_diagnosis(diagnosis, POLICY, scheduler="slurm")
    assert rems is not None
    (rem,) = rems.values()
    return rem


def until(url: str, facts: list[AlertFact], wanted: str, contains: str) -> Remediation:
    def check() -> Remediation | None:
        rem = verdict(url, *facts)
        return rem if rem.verdict == wanted and contains in rem.detail else None
    return wait_for(check, 90, f"{wanted} with '{contains}'", 0.5)


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def test_gpu_reset_seen_through_the_driver_recovery_action(world):
    cluster, _, url = world
    started = _now()
    cluster.inject("xid", HOSTS[0], gpu=2, code=95)
    facts = [_fact("GpuUncontainedEccError", HOSTS[0], "2", started, xid=95)]
    before = until(url, facts, "unsafe", "the driver still asks for a GPU reset on gpu-node-001")
    assert before.exclusion == "sbatch --exclude=gpu-node-001" and before.drain
    assert before.advice.startswith("Reset GPU 2 of gpu-node-001 (nvidia-smi -r -i 2)")
    cluster.clear(HOSTS[0], gpu=2, kind="xid")
    after = until(url, facts, "safe", "GPU 2 of gpu-node-001 was reset at")
    assert not after.drain and after.exclusion == ""


def test_reboot_seen_through_the_boot_time_with_the_gpus_back(world):
    cluster, _, url = world
    started = _now()
    cluster.inject("xid", HOSTS[1], gpu=7, code=79)  # fallen off the bus: 7 GPUs left
    facts = [_fact("GpuFallenOffBus", HOSTS[1], "7", started)]
    wait_for(lambda: prom_query(url, f'{series.HOST_GPU_COUNT}{{hostname="{HOSTS[1]}"}} == 7'),
             60, "the host's GPU count at 7", 0.5)
    before = until(url, facts, "unsafe", "gpu-node-002 has not rebooted since the fault")
    assert before.needs == "a reboot of the node"
    time.sleep(1.1)  # the boot time is whole seconds: after the onset
    cluster.reboot(HOSTS[1])
    after = until(url, facts, "safe", "gpu-node-002 rebooted at")
    assert "with its GPUs back" in after.detail


def test_drained_then_returned_with_the_reset_still_asked_for(world):
    cluster, states, url = world
    started = _now()
    cluster.inject("xid", HOSTS[2], gpu=0, code=62)
    facts = [_fact("GpuXidError", HOSTS[2], "0", started, xid=62)]
    until(url, facts, "unsafe", "the driver still asks")
    states.states[HOSTS[2]] = ("IDLE+DRAIN", "XID 62")
    drained = until(url, facts, "safe", "gpu-node-003 is out of the pool (IDLE+DRAIN")
    assert "reason 'XID 62'" in drained.detail and not drained.drain
    states.states[HOSTS[2]] = ("IDLE", "")
    # back in service, but the driver still asks for the reset: not repaired
    returned = until(url, facts, "unsafe", "the driver still asks")
    assert any("out of the pool" in line for line in returned.history_lines())
    cluster.clear(HOSTS[2], gpu=0, kind="xid")
    until(url, facts, "safe", "was reset at")


def test_link_back_and_stable_for_the_settle_time(world):
    cluster, _, url = world
    host, device = HOSTS[2], "mlx5_3"
    cluster.inject("ib_down", host, device=device)
    alert = f'ALERTS{{alertname="InfinibandLinkDown",hostname="{host}",device="{device}"}}'

    def link_alert(firing: bool) -> AlertFact | None:
        found = prom_query(url, f"max_over_time(timestamp({alert})[10m:1s])")
        now = prom_query(url, alert)
        if not found or bool(now) != firing:
            return None
        first = prom_query(url, f"min_over_time(timestamp({alert})[10m:1s])")
        return AlertFact(
            fingerprint="ib", alertname="InfinibandLinkDown",
            starts_at=datetime.fromtimestamp(float(first[0]["value"][1]), UTC),
            ends_at=None if firing else datetime.fromtimestamp(float(found[0]["value"][1]),
                                                               UTC),
            severity="critical", category="network", hostname=host,
            labels={"alertname": "InfinibandLinkDown", "hostname": host, "device": device})

    down = wait_for(lambda: link_alert(True), 120, "InfinibandLinkDown in ALERTS", 0.5)
    rem = verdict(url, down)
    assert rem.verdict == "unsafe" and "the fault on gpu-node-003 is still present" in rem.detail
    cluster.clear(host, kind="ib_down", device=device)
    back = wait_for(lambda: link_alert(False), 120, "InfinibandLinkDown resolved", 0.5)
    assert back.ends_at is not None
    early = verdict(url, back, at=back.ends_at.timestamp() + SETTLE / 4)
    assert early.verdict == "unsafe" and "to see it stay clear" in early.detail
    until(url, [back], "safe", "and stayed clear")
