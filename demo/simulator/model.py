"""The simulated hardware: hosts, GPUs, InfiniBand and Ethernet ports, and how their readings
follow their state.

Why a module of its own: the cluster (faults, runs) changes this state and the exposition renders
it; both read the same dataclasses and the same physics (``gauges``, the counter rates), so neither
has to import the other. Counters advance with wall time at a rate set on each state change, so a
scrape costs a multiplication, not a simulation step. Readings are deterministic (a hash of the GPU
UUID and a sine of the time), so tests see the same values on every run.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from wandb_infra.catalog.series import (
    CLOCK_HW_POWER_BRAKE,
    CLOCK_HW_SLOWDOWN,
    CLOCK_HW_THERMAL,
    IB_STATE_ACTIVE,
)

POD_NAMESPACE = "ml"
FB_TOTAL_MIB = 81_559
IB_FLAP_PERIOD_S = 15.0
IB_FLAP_DOWN_S = 3.0

# The GPU-idle bit of DCGM_FI_DEV_CLOCKS_EVENT_REASONS; the hardware bits the rules read come from
# the catalog (gpu-faults.md).
CLOCK_IDLE = 0x1


class SimulatorError(ValueError):
    """Bad input to the simulator (unknown host, GPU, device or fault kind); nothing changed."""


class Counter:
    """A counter that grows at ``rate`` per second of wall time plus discrete steps."""

    __slots__ = ("base", "rate", "since")

    def __init__(self, base: float, now: float) -> None:
        self.base = base
        self.rate = 0.0
        self.since = now

    def value(self, now: float) -> float:
        """The current value; never decreases."""
        return self.base + self.rate * max(0.0, now - self.since)

    def set_rate(self, rate: float, now: float) -> None:
        """Change the growth rate from now on, keeping what accrued so far."""
        self.base = self.value(now)
        self.since = now
        self.rate = rate


def stable_int(text: str, modulo: int) -> int:
    """A small integer derived from text, the same on every run (seeds per GPU)."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % modulo


def _jitter(seed: int, now: float, amplitude: float) -> float:
    """Smooth, deterministic noise so gauges look alive without randomness in tests."""
    return amplitude * math.sin(now / 7.0 + seed)


@dataclass
class Gpu:
    """One GPU's identity, workload and fault state."""

    host: str
    index: int
    uuid: str
    pci_bus_id: str
    busy: bool = True
    faults: set[str] = field(default_factory=set)
    last_xid: int | None = None
    xid_events: list[tuple[float, int]] = field(default_factory=list)
    row_remap_pending: bool = False
    retired_pending: int = 0
    # The driver's recovery action (DCGM field 1523): 1 GPU reset, 2 node reboot; 0 none.
    recovery_action: int = 0
    counters: dict[str, Counter] = field(default_factory=dict)


@dataclass
class IbPort:
    """One InfiniBand HCA port and its fault state."""

    device: str
    port: str = "1"
    fault: str | None = None
    fault_since: float = 0.0
    counters: dict[str, Counter] = field(default_factory=dict)


@dataclass
class EthPort:
    """One Ethernet/RoCE interface: up or not, and its carrier-change counter."""

    device: str
    carrier: Counter
    fault: str | None = None
    fault_since: float = 0.0


@dataclass
class Mount:
    """One filesystem as node_exporter's filesystem collector labels it (device, fstype,
    mountpoint), and its fault: ``fs_readonly``, ``fs_full`` or ``fs_not_answering``."""

    device: str
    fstype: str
    mountpoint: str
    fault: str | None = None


# A GPU node's filesystems: the root disk, local scratch, a shared checkpoint mount and a boot
# partition (which the rules exclude), so local and shared faults and the exclusion all show.
MOUNTS: tuple[tuple[str, str, str], ...] = (
    ("/dev/nvme0n1p2", "ext4", "/"), ("/dev/md0", "xfs", "/scratch"),
    ("storage:/ckpt", "nfs4", "/checkpoints"), ("/dev/nvme0n1p1", "vfat", "/boot/efi"))
# The two memory controllers node_exporter's EDAC collector lists (faults hit the first).
EDAC_CONTROLLERS: tuple[str, ...] = ("0", "1")


def _mounts() -> dict[str, Mount]:
    return {m: Mount(d, f, m) for d, f, m in MOUNTS}


def _idle_counter() -> Counter:
    return Counter(0.0, 0.0)


@dataclass
class Host:
    """One node: its GPUs, IB ports, dcgm flavour, host memory and filesystems, and the cached
    exposition text."""

    name: str
    flavour: str
    gpus: list[Gpu]
    ib: dict[str, IbPort]
    eth: dict[str, EthPort]
    lost: bool = False
    version: int = 0
    cache: dict[str, tuple[float, int, bytes]] = field(default_factory=dict)
    # Slurm's view of the node (``scontrol show node -o``): a drain or resume by an operator.
    slurm_state: str = ""
    slurm_reason: str = ""
    # node_boot_time_seconds: a reboot moves it to the reboot's time.
    boot_time: float = 0.0
    mounts: dict[str, Mount] = field(default_factory=_mounts)
    # Since boot, as the kernel counts them: node_vmstat_oom_kill, EDAC uncorrectable errors.
    oom_kills: int = 0
    edac_uncorrectable: int = 0
    # node_edac_correctable_errors_total and node_pressure_memory_stalled_seconds_total.
    edac_correctable: Counter = field(default_factory=_idle_counter)
    memory_stalled: Counter = field(default_factory=_idle_counter)


@dataclass(frozen=True)
class RunAssignment:
    """A run placed on hosts (and GPUs): the simulator's stand-in for the exporter's join data."""

    entity: str
    project: str
    run_id: str
    hosts: tuple[str, ...]
    gpus: tuple[int, ...] | None
    run_name: str


def gauges(gpu: Gpu, now: float) -> dict[str, float]:
    """Gauge values for a GPU's current state."""
    seed = stable_int(gpu.uuid, 100)
    busy, faults = gpu.busy, gpu.faults
    stalled, hot = "stall" in faults, "thermal" in faults
    braked = "power_brake" in faults and busy
    util = (72.0 if "straggler" in faults else 100.0) if busy else 0.0
    fb_used = 71_800.0 + seed * 3 if busy else 0.0
    if hot:
        temp, mem_temp, power, clock = 92.0, 97.0, 470.0, 1155.0
        tensor, engine, dram = 0.21, 0.9, 0.18
    elif braked:
        temp, mem_temp, power, clock = 58.0, 66.0, 350.0, 1305.0
        tensor, engine, dram = 0.29, 0.91, 0.25
    elif stalled:
        temp, mem_temp, power, clock = 48.0, 52.0, 112.0, 1980.0
        tensor, engine, dram = 0.0, 0.01, 0.0
    elif busy and "straggler" in faults:
        temp, mem_temp, power, clock = 57.0, 63.0, 455.0, 1980.0
        tensor, engine, dram = 0.31, 0.7, 0.26
    elif busy:
        temp, mem_temp, power, clock = 64.0, 71.0, 640.0, 1980.0
        tensor, engine, dram = 0.46, 0.93, 0.38
    else:
        temp, mem_temp, power, clock = 34.0, 38.0, 72.0, 345.0
        tensor, engine, dram = 0.0, 0.0, 0.0
    noise = _jitter(seed, now, 1.0)
    if busy and not (stalled or hot or braked) and "straggler" not in faults:
        tensor += 0.01 * noise
    reasons = 0 if busy else CLOCK_IDLE
    if hot:
        reasons |= CLOCK_HW_THERMAL | CLOCK_HW_SLOWDOWN
    if braked:
        reasons |= CLOCK_HW_POWER_BRAKE | CLOCK_HW_SLOWDOWN
    return {
        "sm_clock": clock, "gpu_temp": round(temp + noise),
        "memory_temp": round(mem_temp + noise),
        "power": round(power + 5 * noise, 3), "gpu_util": util, "fb_used": fb_used,
        "fb_free": FB_TOTAL_MIB - fb_used,
        "row_remap_failure": 1.0 if "row_remap_failure" in faults else 0.0,
        "row_remap_pending": 1.0 if gpu.row_remap_pending else 0.0,
        "recovery_action": float(gpu.recovery_action),
        "clock_events": float(reasons), "gr_engine_active": round(engine, 4),
        "tensor_active": round(tensor, 4), "dram_active": round(dram, 4),
    }


def apply_rates(gpu: Gpu, now: float) -> None:
    """Set every counter's growth rate from the GPU's state (called on each change)."""
    faults = gpu.faults
    readings = gauges(gpu, now)
    rates = {
        "energy": readings["power"] * 1000.0,
        "thermal_violation": 0.7e9 if "thermal" in faults else 0.0,
        "power_violation": 0.6e9 if "power_brake" in faults else (
            0.05e9 if "thermal" in faults else 0.0),
        "pcie_replay": 2.0 if "pcie" in faults else 0.0,
        "nvlink_crc_flit": 5.0 if "nvlink" in faults else 0.0,
        "nvlink_crc_data": 1.0 if "nvlink" in faults else 0.0,
        "nvlink_replay": 0.5 if "nvlink" in faults else 0.0,
        "nvlink_recovery": 0.1 if "nvlink" in faults else 0.0,
        "low_util_violation": 0.0 if gpu.busy else 1e9,
        "ecc_sbe_vol": 5.0 if "sbe_storm" in faults else 0.0,
        "ecc_sbe_agg": 5.0 if "sbe_storm" in faults else 0.0,
    }
    for key, counter in gpu.counters.items():
        counter.set_rate(rates.get(key, 0.0), now)


def apply_port_rates(host: Host, port: IbPort, now: float) -> None:
    """Set a port's counter rates from its fault and whether its host's GPUs send traffic."""
    traffic = any(g.busy and "stall" not in g.faults for g in host.gpus)
    down = port.fault == "ib_down"
    flapping = port.fault == "ib_flap"
    data = 0.0 if down or not traffic else 11.5e9
    rates = {
        "port_data_received_bytes_total": data, "port_data_transmitted_bytes_total": data,
        "link_downed_total": 1.0 / IB_FLAP_PERIOD_S if flapping else 0.0,
        "link_error_recovery_total": 0.2 if flapping else 0.0,
        "symbol_error_total": 3.0 if flapping else 0.0,
        "port_receive_remote_physical_errors_total": 0.5 if flapping else 0.0,
        "port_errors_received_total": 0.5 if flapping else 0.0,
        "port_transmit_wait_total": 2e5 if flapping else (1e3 if traffic else 0.0),
    }
    for key, counter in port.counters.items():
        counter.set_rate(rates.get(key, 0.0), now)


def eth_up(eth: EthPort, now: float) -> int:
    """1 up, 0 down; a flapping interface is down for part of every period."""
    if eth.fault == "eth_down":
        return 0
    if eth.fault == "eth_flap" and (now - eth.fault_since) % IB_FLAP_PERIOD_S < IB_FLAP_DOWN_S:
        return 0
    return 1


def port_state(port: IbPort, now: float) -> tuple[int, int]:
    """(state_id, physical_state_id): active and LinkUp (5), or down (1) and polling (2)."""
    if port.fault == "ib_down":
        return 1, 2
    if port.fault == "ib_flap" and (now - port.fault_since) % IB_FLAP_PERIOD_S < IB_FLAP_DOWN_S:
        return 1, 2
    return IB_STATE_ACTIVE, 5
