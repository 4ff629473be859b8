"""The cluster simulator: series and labels per flavour, fault semantics, control API, and a real
Prometheus scraping it through the scrape config it writes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from demo.simulator.cluster import FAULT_KINDS, Cluster
from demo.simulator.model import SimulatorError
from demo.simulator.scrape import prometheus_config
from demo.simulator.server import serve
from harness.processes import (
    PROMTOOL,
    env_without_proxies,
    prom_query,
    prometheus,
    wait_for,
)
from wandb_infra.catalog.alerts import RETIRED_PAGES_LIMIT, SBE_STORM_PER_WINDOW
from wandb_infra.catalog.series import (
    CLOCK_HW_POWER_BRAKE,
    CLOCK_HW_SLOWDOWN,
    CLOCK_HW_THERMAL,
    IB_STATE_ACTIVE,
)
from wandb_infra.common.nodestate import parse_scontrol_nodes

LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


class FakeClock:
    """Wall time under the test's control."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Parse exposition text strictly enough to catch malformed lines."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = LINE.match(line)
        assert match, f"malformed line: {line}"
        out.append((match["name"], dict(LABEL.findall(match["labels"] or "")),
                    float(match["value"])))
    return out


def series(cluster: Cluster, exporter: str, host: str, name: str, **want: str) -> list[float]:
    body = cluster.render(exporter, host)
    assert body is not None
    return [v for n, lab, v in parse(body.decode())
            if n == name and all(lab.get(k) == w for k, w in want.items())]


def one(cluster: Cluster, exporter: str, host: str, name: str, **want: str) -> float:
    values = series(cluster, exporter, host, name, **want)
    assert len(values) == 1, (name, want, values)
    return values[0]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make(clock: FakeClock, **kw) -> Cluster:
    return Cluster(hosts=kw.pop("hosts", 3), clock=clock, render_ttl=0, **kw)


def test_all_fault_relevant_series_present(clock):
    cluster = make(clock, xid_count=True)
    cluster.inject("xid", "gpu-node-001", gpu=0, code=13)
    text = cluster.render("dcgm", "gpu-node-001").decode()
    names = {n for n, _, _ in parse(text)}
    for name in (
        "DCGM_FI_DEV_XID_ERRORS", "DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_THERMAL_VIOLATION",
        "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    ):
        assert name in names, name
    node = {n for n, _, _ in parse(cluster.render("node", "gpu-node-001").decode())}
    for name in ("node_uname_info", "node_infiniband_state_id", "node_infiniband_physical_state_id",
                 "node_infiniband_link_downed_total", "node_infiniband_symbol_error_total",
                 "node_network_up", "node_network_carrier_changes_total"):
        assert name in node, name
    assert one(cluster, "node", "gpu-node-002", "node_uname_info") == 1
    assert series(cluster, "node", "gpu-node-002", "node_uname_info", nodename="gpu-node-002")
    # every family's HELP/TYPE appears once, before its samples (Prometheus rejects repeats)
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types))


def test_gpu_labels_per_flavour(clock):
    cluster = make(clock, flavour="Hostname", host_flavours={"gpu-node-002": "hostname",
                                                            "gpu-node-003": "4.9"})
    legacy = parse(cluster.render("dcgm", "gpu-node-001").decode())
    newer = parse(cluster.render("dcgm", "gpu-node-002").decode())
    v49 = parse(cluster.render("dcgm", "gpu-node-003").decode())
    for _, lab, _ in legacy:
        assert lab["Hostname"] == "gpu-node-001" and "hostname" not in lab
        assert {"gpu", "UUID", "pci_bus_id", "device", "modelName"} <= set(lab)
        assert lab["device"] == f"nvidia{lab['gpu']}" and lab["UUID"].startswith("GPU-")
    assert all(lab["hostname"] == "gpu-node-002" and "Hostname" not in lab for _, lab, _ in newer)
    assert {lab["gpu"] for _, lab, _ in newer} == {str(i) for i in range(8)}
    names49 = {n for n, _, _ in v49}
    assert {"DCGM_FI_DEV_GPU_TEMP_CELSIUS", "DCGM_FI_DEV_BOARD_POWER_WATTS",
            "DCGM_FI_DEV_XID_ERROR", "DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "DCGM_FI_DEV_GPU_UTIL_RATIO",
            "DCGM_FI_DEV_ROW_REMAP_FAILED", "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL"} <= names49
    assert "DCGM_FI_DEV_GPU_TEMP" not in names49 and "DCGM_FI_DEV_XID_ERRORS" not in names49
    # 4.9 utilisation is a ratio; legacy is percent
    assert one(cluster, "dcgm", "gpu-node-003", "DCGM_FI_DEV_GPU_UTIL_RATIO", gpu="0") == 1.0
    assert one(cluster, "dcgm", "gpu-node-001", "DCGM_FI_DEV_GPU_UTIL", gpu="0") == 100.0


def test_kubernetes_pod_labels_on_held_gpus_only(clock):
    cluster = make(clock, kubernetes_pods=True)
    cluster.assign_run("acme", "llm", "r1", ["gpu-node-001", "gpu-node-002"], gpus=[0, 1])
    rows = parse(cluster.render("dcgm", "gpu-node-002").decode())
    held = {lab["gpu"]: (lab.get("namespace"), lab.get("pod")) for n, lab, _ in rows
            if n == "DCGM_FI_DEV_GPU_TEMP"}
    assert held == {"0": ("ml", "r1-1"), "1": ("ml", "r1-1"),
                    **{str(i): (None, None) for i in range(2, 8)}}
    pods = [lab for n, lab, _ in parse(cluster.render_runs().decode()) if n == "wandb_run_pod_info"]
    assert [(p["hostname"], p["pod"]) for p in pods] == [("gpu-node-001", "r1-0"),
                                                         ("gpu-node-002", "r1-1")]
    cluster.end_run("acme", "llm", "r1")
    assert all("pod" not in lab for _, lab, _ in parse(cluster.render("dcgm", "gpu-node-002")
                                                        .decode()))


def test_slurm_node_states_read_as_scontrol_prints_them(clock):
    cluster = make(clock)
    cluster.assign_run("acme", "llm", "r1", ["gpu-node-001"])
    cluster.set_slurm_state("gpu-node-002", "IDLE+DRAIN", "XID 94 on GPU 3")
    states = {s.hostname: s for s in parse_scontrol_nodes(cluster.render_scontrol_nodes())}
    assert (states["gpu-node-001"].state, states["gpu-node-001"].schedulable) == (
        "ALLOCATED", True)
    assert (states["gpu-node-002"].state, states["gpu-node-002"].reason,
            states["gpu-node-002"].schedulable) == ("IDLE+DRAIN", "XID 94 on GPU 3", False)
    assert states["gpu-node-003"].state == "IDLE"


def test_xid_is_last_value_and_new_series_per_code(clock):
    cluster = make(clock, xid_count=True)
    host = "gpu-node-002"
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_XID_ERRORS", gpu="3") == 0
    cluster.inject("xid", host, gpu=3, code=94)
    xids = [(lab["err_code"], lab["err_msg"], v) for n, lab, v in
            parse(cluster.render("dcgm", host).decode())
            if n == "DCGM_FI_DEV_XID_ERRORS" and lab["gpu"] == "3"]
    assert xids == [("94", "Contained ECC error", 94.0)]
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="3") == 1
    clock.now += 10
    cluster.inject("xid", host, gpu=3, code=31)
    assert series(cluster, "dcgm", host, "DCGM_FI_DEV_XID_ERRORS", gpu="3", err_code="94") == []
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_XID_ERRORS", gpu="3", err_code="31") == 31
    assert one(cluster, "dcgm", host, "DCGM_EXP_XID_ERRORS_COUNT", gpu="3", xid="94") == 1
    clock.now += 400  # beyond the 5-minute window
    assert one(cluster, "dcgm", host, "DCGM_EXP_XID_ERRORS_COUNT", gpu="3", xid="94") == 0
    # other GPUs are untouched
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_XID_ERRORS", gpu="2") == 0


def test_xid_absent_until_first_and_fallen_off_bus(clock):
    cluster = make(clock, xid_absent_until_first=True)
    assert series(cluster, "dcgm", "gpu-node-001", "DCGM_FI_DEV_XID_ERRORS") == []
    cluster.inject("xid", "gpu-node-001", gpu=5, code=79)
    temps = series(cluster, "dcgm", "gpu-node-001", "DCGM_FI_DEV_GPU_TEMP")
    assert len(temps) == 7  # the GPU that fell off the bus stops reporting
    assert series(cluster, "dcgm", "gpu-node-001", "DCGM_FI_DEV_GPU_TEMP", gpu="5") == []


def test_thermal_fault_throttles(clock):
    cluster = make(clock)
    host = "gpu-node-001"
    before_tensor = one(cluster, "dcgm", host, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gpu="2")
    before_clock = one(cluster, "dcgm", host, "DCGM_FI_DEV_SM_CLOCK", gpu="2")
    v0 = one(cluster, "dcgm", host, "DCGM_FI_DEV_THERMAL_VIOLATION", gpu="2")
    cluster.inject("thermal", host, gpu=2)
    clock.now += 60
    v1 = one(cluster, "dcgm", host, "DCGM_FI_DEV_THERMAL_VIOLATION", gpu="2")
    fraction = (v1 - v0) / 60 / 1e9
    assert 0.5 < fraction <= 1.0  # nanoseconds of throttling per second of wall time
    reasons = int(one(cluster, "dcgm", host, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", gpu="2"))
    assert reasons & CLOCK_HW_THERMAL and reasons & CLOCK_HW_SLOWDOWN
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_SM_CLOCK", gpu="2") < before_clock * 0.7
    tensor = one(cluster, "dcgm", host, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gpu="2")
    assert tensor < before_tensor / 2
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_GPU_TEMP", gpu="2") >= 90
    # a neighbour GPU keeps running cool and unthrottled
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", gpu="1") == 0
    cluster.clear(host, gpu=2, kind="thermal")
    v2 = one(cluster, "dcgm", host, "DCGM_FI_DEV_THERMAL_VIOLATION", gpu="2")
    clock.now += 60
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_THERMAL_VIOLATION", gpu="2") == v2 >= v1


def test_stall_keeps_memory_and_drops_activity(clock):
    cluster = make(clock)
    host = "gpu-node-003"
    rx0 = one(cluster, "node", host, "node_infiniband_port_data_received_bytes_total",
              device="mlx5_0")
    cluster.inject("stall", host)
    clock.now += 30
    for gpu in ("0", "7"):
        assert one(cluster, "dcgm", host, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gpu=gpu) < 0.02
        assert one(cluster, "dcgm", host, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu=gpu) < 0.05
        assert one(cluster, "dcgm", host, "DCGM_FI_DEV_FB_USED", gpu=gpu) > 60_000
        assert one(cluster, "dcgm", host, "DCGM_FI_DEV_GPU_UTIL", gpu=gpu) == 100
    # collective traffic stops
    assert one(cluster, "node", host, "node_infiniband_port_data_received_bytes_total",
               device="mlx5_0") == rx0


def test_link_faults(clock):
    cluster = make(clock)
    host = "gpu-node-001"
    assert one(cluster, "node", host, "node_infiniband_state_id",
               device="mlx5_1") == IB_STATE_ACTIVE
    cluster.inject("ib_down", host, device="mlx5_1")
    assert one(cluster, "node", host, "node_infiniband_state_id", device="mlx5_1") == 1
    assert one(cluster, "node", host, "node_infiniband_physical_state_id", device="mlx5_1") != 5
    assert one(cluster, "node", host, "node_infiniband_link_downed_total", device="mlx5_1") == 1
    assert one(cluster, "node", host, "node_infiniband_state_id",
               device="mlx5_0") == IB_STATE_ACTIVE
    cluster.inject("ib_flap", host, device="mlx5_2")
    states = set()
    for _ in range(30):
        clock.now += 1
        states.add(one(cluster, "node", host, "node_infiniband_state_id", device="mlx5_2"))
    assert states == {1, 4}
    assert one(cluster, "node", host, "node_infiniband_link_downed_total", device="mlx5_2") >= 2
    assert one(cluster, "node", host, "node_infiniband_symbol_error_total", device="mlx5_2") > 0
    cluster.clear(host, kind="ib_down")
    assert one(cluster, "node", host, "node_infiniband_state_id",
               device="mlx5_1") == IB_STATE_ACTIVE
    assert one(cluster, "node", host, "node_infiniband_link_downed_total", device="mlx5_1") == 1


def test_counter_faults(clock):
    cluster = make(clock)
    host = "gpu-node-002"
    cluster.inject("nvlink", host, gpu=1)
    cluster.inject("pcie", host, gpu=1)
    cluster.inject("ecc_dbe", host, gpu=4)
    cluster.inject("row_remap_pending", host, gpu=6)
    clock.now += 60
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", gpu="1") > 0
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", gpu="1") > 0
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", gpu="1") > 16
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", gpu="0") == 0
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="4") == 1
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_RETIRED_PENDING", gpu="4") == 1
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_ROW_REMAP_PENDING", gpu="6") == 1
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", gpu="6") == 1
    energy0 = one(cluster, "dcgm", host, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="0")
    clock.now += 10
    energy1 = one(cluster, "dcgm", host, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu="0")
    assert 5e6 < energy1 - energy0 < 8e6  # ~640 W for 10 s, in mJ
    cluster.clear(host)
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_ROW_REMAP_PENDING", gpu="6") == 0
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="4") == 1


def test_power_brake_and_ethernet_faults(clock):
    cluster = make(clock)
    host = "gpu-node-001"
    v0 = one(cluster, "dcgm", host, "DCGM_FI_DEV_POWER_VIOLATION", gpu="5")
    cluster.inject("power_brake", host, gpu=5)
    clock.now += 10
    reasons = int(one(cluster, "dcgm", host, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", gpu="5"))
    assert reasons & CLOCK_HW_POWER_BRAKE and not reasons & CLOCK_HW_THERMAL
    assert (one(cluster, "dcgm", host, "DCGM_FI_DEV_POWER_VIOLATION", gpu="5") - v0) / 10 > 0.25e9
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_SM_CLOCK", gpu="5") < 1500
    assert one(cluster, "node", host, "node_network_up", device="eth0") == 1
    cluster.inject("eth_down", host)
    assert one(cluster, "node", host, "node_network_up", device="eth0") == 0
    assert one(cluster, "node", host, "node_network_carrier_changes_total", device="eth0") == 3
    cluster.inject("eth_flap", "gpu-node-002", device="eth0")
    ups = set()
    for _ in range(30):
        clock.now += 1
        ups.add(one(cluster, "node", "gpu-node-002", "node_network_up", device="eth0"))
    assert ups == {0, 1}
    assert one(cluster, "node", "gpu-node-002", "node_network_carrier_changes_total",
               device="eth0") >= 5
    with pytest.raises(SimulatorError, match="unknown network interface"):
        cluster.inject("eth_down", host, device="eth9")
    cluster.clear(host)
    assert one(cluster, "node", host, "node_network_up", device="eth0") == 1
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", gpu="5") == 0


def test_straggler_lags_its_peers(clock):
    cluster = make(clock)
    cluster.inject("straggler", "gpu-node-003", gpu=6)
    utils = {g: one(cluster, "dcgm", "gpu-node-003", "DCGM_FI_DEV_GPU_UTIL", gpu=str(g))
             for g in range(8)}
    assert max(utils.values()) - utils[6] > 10
    assert [g for g, u in utils.items() if u < 100] == [6]
    tensor = one(cluster, "dcgm", "gpu-node-003", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gpu="6")
    assert tensor < one(cluster, "dcgm", "gpu-node-003", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                        gpu="5")


def test_row_remap_failure_and_sbe_storm(clock):
    cluster = make(clock)
    host = "gpu-node-001"
    cluster.inject("row_remap_failure", host, gpu=2)
    cluster.inject("sbe_storm", host, gpu=3)
    clock.now += 60
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="2") == 1
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="3") == 0
    sbe = one(cluster, "dcgm", host, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", gpu="3")
    assert sbe > SBE_STORM_PER_WINDOW
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_RETIRED_SBE", gpu="3") >= RETIRED_PAGES_LIMIT
    cluster.clear(host, gpu=2)
    assert one(cluster, "dcgm", host, "DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="2") == 0


def test_host_lost_and_back(clock):
    cluster = make(clock)
    cluster.inject("host_lost", "gpu-node-002")
    assert cluster.render("dcgm", "gpu-node-002") is None
    assert cluster.render("node", "gpu-node-002") is None
    assert cluster.render("dcgm", "gpu-node-001") is not None
    cluster.clear("gpu-node-002", kind="host_lost")
    assert cluster.render("node", "gpu-node-002") is not None


def test_host_memory_faults(clock):
    cluster = make(clock)
    host = "gpu-node-001"
    healthy = {name: series(cluster, "node", host, name) for name in (
        "node_vmstat_oom_kill", "node_pressure_memory_stalled_seconds_total",
        "node_edac_correctable_errors_total", "node_edac_uncorrectable_errors_total")}
    assert healthy == {"node_vmstat_oom_kill": [0],
                       "node_pressure_memory_stalled_seconds_total": [0],
                       "node_edac_correctable_errors_total": [0, 0],
                       "node_edac_uncorrectable_errors_total": [0, 0]}
    for kind in ("oom_kill", "memory_pressure", "edac_uncorrectable", "edac_correctable"):
        cluster.inject(kind, host)
    clock.now += 100
    assert one(cluster, "node", host, "node_vmstat_oom_kill") == 1
    assert one(cluster, "node", host, "node_pressure_memory_stalled_seconds_total") == 30
    assert one(cluster, "node", host, "node_edac_uncorrectable_errors_total",
               controller="0") == 1
    assert one(cluster, "node", host, "node_edac_uncorrectable_errors_total",
               controller="1") == 0
    assert one(cluster, "node", host, "node_edac_correctable_errors_total", controller="0") == 100
    assert one(cluster, "node", "gpu-node-002", "node_vmstat_oom_kill") == 0
    cluster.clear(host)
    clock.now += 100
    # the pressure and the error storm end; counts since boot stay
    assert one(cluster, "node", host, "node_pressure_memory_stalled_seconds_total") == 30
    assert one(cluster, "node", host, "node_edac_correctable_errors_total", controller="0") == 100
    assert one(cluster, "node", host, "node_vmstat_oom_kill") == 1


def test_filesystem_faults(clock):
    cluster = make(clock)
    host = "gpu-node-001"
    mounts = {(lab["mountpoint"], lab["fstype"], lab["device"])
              for n, lab, _ in parse(cluster.render("node", host).decode())
              if n == "node_filesystem_readonly"}
    assert mounts == {("/", "ext4", "/dev/nvme0n1p2"), ("/scratch", "xfs", "/dev/md0"),
                      ("/checkpoints", "nfs4", "storage:/ckpt"),
                      ("/boot/efi", "vfat", "/dev/nvme0n1p1")}
    cluster.inject("fs_readonly", host)
    cluster.inject("fs_full", host, device="/checkpoints")
    cluster.inject("fs_not_answering", host, device="/")

    def value(name: str, mountpoint: str) -> list[float]:
        return series(cluster, "node", host, f"node_filesystem_{name}", mountpoint=mountpoint)

    assert value("readonly", "/scratch") == [1] and value("readonly", "/checkpoints") == [0]
    assert value("avail_bytes", "/checkpoints")[0] / value("size_bytes", "/checkpoints")[0] < 0.01
    assert value("avail_bytes", "/scratch")[0] / value("size_bytes", "/scratch")[0] > 0.3
    # statfs does not answer: node_exporter publishes only device_error and readonly
    assert value("device_error", "/") == [1] and value("readonly", "/") == [0]
    assert value("avail_bytes", "/") == [] and value("size_bytes", "/") == []
    with pytest.raises(SimulatorError, match="unknown mount point"):
        cluster.inject("fs_full", host, device="/data")
    cluster.clear(host, device="/scratch")
    assert value("readonly", "/scratch") == [0] and value("device_error", "/") == [1]
    cluster.clear(host, kind="fs_not_answering")
    assert value("device_error", "/") == [0] and value("size_bytes", "/") != []


def test_unplanned_reboot_ends_the_hosts_faults(clock):
    cluster = make(clock)
    host = "gpu-node-002"
    booted = one(cluster, "node", host, "node_boot_time_seconds")
    assert booted < clock.now - 3600
    cluster.inject("xid", host, gpu=1, code=79)
    cluster.inject("oom_kill", host)
    cluster.inject("fs_readonly", host)
    cluster.inject("host_lost", host)
    clock.now += 300
    cluster.inject("reboot", host)
    assert one(cluster, "node", host, "node_boot_time_seconds") == clock.now
    assert one(cluster, "node", host, "node_vmstat_oom_kill") == 0
    assert one(cluster, "node", host, "node_filesystem_readonly", mountpoint="/scratch") == 0
    assert len(series(cluster, "dcgm", host, "DCGM_FI_DEV_GPU_TEMP")) == 8
    assert one(cluster, "node", "gpu-node-001", "node_boot_time_seconds") == booted


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"kind": "meteor", "host": "gpu-node-001"}, "unknown fault kind"),
    ({"kind": "xid", "host": "gpu-node-999", "gpu": 0, "code": 94}, "unknown host"),
    ({"kind": "xid", "host": "gpu-node-001", "gpu": 8, "code": 94}, "gpu must be"),
    ({"kind": "xid", "host": "gpu-node-001", "gpu": 0}, "xid code"),
    ({"kind": "xid", "host": "gpu-node-001", "code": 94}, "needs a gpu"),
    ({"kind": "ib_down", "host": "gpu-node-001", "device": "mlx9_9"}, "unknown InfiniBand"),
    ({"kind": "fs_readonly", "host": "gpu-node-001", "device": "/data"}, "unknown mount point"),
])
def test_bad_input_is_rejected_and_changes_nothing(clock, kwargs, message):
    cluster = make(clock)
    before = {h: (cluster.render("dcgm", h), cluster.render("node", h)) for h in cluster.hosts}
    with pytest.raises(SimulatorError, match=message):
        cluster.inject(**kwargs)
    after = {h: (cluster.render("dcgm", h), cluster.render("node", h)) for h in cluster.hosts}
    assert after == before
    with pytest.raises(SimulatorError):
        Cluster(hosts=2, flavour="5.0")


def test_render_is_cached_until_ttl_or_change(clock):
    cluster = Cluster(hosts=1, clock=clock, render_ttl=5)
    first = cluster.render("dcgm", "gpu-node-001")
    clock.now += 1
    assert cluster.render("dcgm", "gpu-node-001") is first
    cluster.inject("pcie", "gpu-node-001", gpu=0)
    assert cluster.render("dcgm", "gpu-node-001") is not first
    assert set(FAULT_KINDS) >= {"xid", "thermal", "stall", "ib_flap", "ib_down", "host_lost"}


def test_http_control_and_join_metrics():
    cluster = Cluster(hosts=2)
    with serve(cluster) as sim:
        resp = requests.post(sim.url + "/control/fault", timeout=10,
                             json={"kind": "xid", "host": "gpu-node-001", "gpu": 3, "code": 94})
        assert resp.status_code == 200, resp.text
        text = requests.get(sim.url + "/dcgm/gpu-node-001/metrics", timeout=10).text
        assert 'err_code="94"' in text
        bad = [
            {"kind": "xid", "host": "gpu-node-001", "gpu": "three", "code": 94},
            {"kind": "thermal", "hosts": ["gpu-node-001", "nope"]},
            {"kind": "thermal", "host": "gpu-node-001", "colour": "red"},
        ]
        for body in bad:
            resp = requests.post(sim.url + "/control/fault", json=body, timeout=10)
            assert resp.status_code == 400, body
        assert "thermal" not in cluster.hosts["gpu-node-001"].gpus[0].faults
        resp = requests.post(sim.url + "/control/fault", data=b"{not json", timeout=10)
        assert resp.status_code == 400
        assert requests.get(sim.url + "/dcgm/nope/metrics", timeout=10).status_code == 404
        resp = requests.post(sim.url + "/control/run", timeout=10, json={
            "entity": "team", "project": "llm", "run_id": "r1", "hosts": ["gpu-node-002"],
            "gpus": [0, 1]})
        assert resp.status_code == 200, resp.text
        runs = parse(requests.get(sim.url + "/runs/metrics", timeout=10).text)
        assert [lab["gpu"] for n, lab, _ in runs if n == "wandb_run_gpu_info"] == ["0", "1"]
        assert [lab["hostname"] for n, lab, _ in runs if n == "wandb_run_node_info"] == [
            "gpu-node-002"]
        requests.post(sim.url + "/control/fault", json={"kind": "host_lost",
                                                         "host": "gpu-node-002"}, timeout=10)
        with pytest.raises(requests.RequestException):
            requests.get(sim.url + "/node/gpu-node-002/metrics", timeout=10).raise_for_status()
        sd = requests.get(sim.url + "/sd/dcgm", timeout=10).json()
        assert sd[0]["labels"]["__metrics_path__"] == "/dcgm/gpu-node-001/metrics"


@pytest.mark.integration
def test_real_prometheus_scrapes_both_flavours(tmp_path: Path):
    cluster = Cluster(hosts=4, flavour="Hostname", host_flavours={"gpu-node-003": "hostname",
                                                                  "gpu-node-004": "4.9"})
    with serve(cluster) as sim:
        cluster.inject("xid", "gpu-node-001", gpu=3, code=94)
        cluster.inject("host_lost", "gpu-node-002")
        cluster.assign_run("team", "llm", "run-1", ["gpu-node-001", "gpu-node-003"])
        config = prometheus_config(sim.address, cluster.hosts, interval="1s",
                                   file_sd_dir=tmp_path / "sd", runs_job="runs")
        (tmp_path / "prometheus.yml").write_text(config)
        check = subprocess.run([PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")],
                               check=False, capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
        assert yaml.safe_load(config)["scrape_configs"][0]["file_sd_configs"]
        with prometheus(config, tmp_path / "prom") as prom:
            def scraped() -> list[dict] | None:
                up = prom_query(prom.url, "up")
                return up if len(up) == 9 and prom_query(
                    prom.url, "DCGM_FI_DEV_GPU_TEMP_CELSIUS") else None

            up = wait_for(scraped, 60, "all nine targets and the DCGM temperatures scraped", 0.5)
            ups = {(r["metric"]["job"], r["metric"]["instance"]): r["value"][1] for r in up}
            assert ups[("dcgm", "gpu-node-001:9400")] == "1"
            assert ups[("dcgm", "gpu-node-002:9400")] == "0"
            assert ups[("node", "gpu-node-002:9100")] == "0"
            assert ups[("node", "gpu-node-003:9100")] == "1"
            legacy = prom_query(prom.url, 'DCGM_FI_DEV_XID_ERRORS{Hostname="gpu-node-001",gpu="3"}')
            assert [r["metric"]["err_code"] for r in legacy] == ["94"]
            assert len(prom_query(prom.url, 'DCGM_FI_DEV_GPU_TEMP{hostname="gpu-node-003"}')) == 8
            assert len(prom_query(prom.url, 'DCGM_FI_DEV_GPU_TEMP_CELSIUS{hostname="gpu-node-004"}')
                       ) == 8
            joined = prom_query(prom.url, "node_infiniband_state_id * on (instance, job) "
                                          "group_left (nodename) node_uname_info")
            assert {r["metric"]["nodename"] for r in joined} == {
                "gpu-node-001", "gpu-node-003", "gpu-node-004"}
            assert len(prom_query(prom.url, "wandb_run_gpu_info")) == 16


@pytest.mark.integration
def test_cli_serves_and_writes_configs(tmp_path: Path):
    config = tmp_path / "prometheus.yml"
    proc = subprocess.Popen(
        [sys.executable, "-m", "demo.simulator", "--hosts", "3", "--port", "0", "--flavour",
         "4.9", "--interval", "5s", "--file-sd-dir", str(tmp_path / "sd"),
         "--prometheus-config", str(config), "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_without_proxies(),
        cwd=Path(__file__).resolve().parent.parent)
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert info["hosts"] == 3
        text = requests.get(info["url"] + "/dcgm/gpu-node-003/metrics", timeout=10).text
        assert 'DCGM_FI_DEV_GPU_TEMP_CELSIUS{gpu="0"' in text
        groups = json.loads((tmp_path / "sd" / "node.json").read_text())
        assert [g["labels"]["instance"] for g in groups] == [
            "gpu-node-001:9100", "gpu-node-002:9100", "gpu-node-003:9100"]
        check = subprocess.run([PROMTOOL, "check", "config", str(config)], check=False,
                               capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    bad = subprocess.run([sys.executable, "-m", "demo.simulator", "--hosts", "0"], check=False,
                         capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parent.parent)
    assert bad.returncode == 2 and "hosts" in bad.stderr
    helptext = subprocess.run([sys.executable, "-m", "demo.simulator", "--help"], check=False,
                              capture_output=True, text=True, timeout=60,
                              cwd=Path(__file__).resolve().parent.parent)
    for option in ("--hosts", "--flavour", "--xid-count", "--file-sd-dir", "--prometheus-config"):
        assert option in helptext.stdout


def test_run_labels_are_escaped_and_bad_runs_rejected():
    cluster = Cluster(hosts=1)
    cluster.assign_run("team", "llm", "r1", ["gpu-node-001"], gpus=[0],
                       run_name='quote " back \\ new\nline')
    runs = parse(cluster.render_runs().decode())
    (node,) = [lab for n, lab, _ in runs if n == "wandb_run_node_info"]
    assert node["wandb_run_name"] == 'quote \\" back \\\\ new\\nline'
    with serve(cluster) as sim:
        for body in ({"entity": "t", "project": "p", "run_id": "r", "hosts": ["gpu-node-001"],
                      "gpus": 3},
                     {"entity": "t", "project": "p", "run_id": "r", "hosts": ["gpu-node-001"],
                      "run_name": 5},
                     {"entity": "t", "project": "p", "hosts": ["gpu-node-001"]}):
            resp = requests.post(sim.url + "/control/run", json=body, timeout=10)
            assert resp.status_code == 400, body
    assert list(cluster.runs) == [("team", "llm", "r1")]
    with pytest.raises(SimulatorError, match="prefix"):
        Cluster(hosts=1, prefix='bad"name')
