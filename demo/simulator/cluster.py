"""A simulated GPU cluster: dcgm-exporter and node_exporter for N hosts x 8 GPUs, faults on cue.

Why: rules, dashboards, the bridge and the demo need realistic telemetry from a cluster that is not
here. One aiohttp server on 127.0.0.1 serves one scrape target per host and exporter
(``/dcgm/<host>/metrics``, ``/node/<host>/metrics``); Prometheus reaches them with
``__metrics_path__`` and an ``instance`` label per host set in the scrape config this module writes.
Counters advance with wall time; each host's text is cached and re-rendered only when it is older
than ``render_ttl`` or its state changed, so 2,000 hosts stay cheap to scrape.

dcgm-exporter flavours (per cluster, overridable per host): ``Hostname`` (label spelling up to
4.8.2), ``hostname`` (newer), ``4.9`` (renamed fields and unit changes, label ``hostname``).
``DCGM_FI_DEV_XID_ERRORS`` carries the value of the LAST XID with ``err_code`` equal to it, so a new
code is a new series and the old one goes stale, as in the real exporter.

Faults (``Cluster.inject`` or ``POST /control/fault``): xid, thermal, stall, ib_flap, ib_down,
host_lost, nvlink, pcie, ecc_dbe, row_remap_pending, power_brake, eth_flap, eth_down, straggler
(a GPU that keeps up less: lower utilisation and activity), row_remap_failure, sbe_storm
(single-bit errors at a high rate, 64 pages retired); ``clear`` removes them.
``/runs/metrics`` serves the join metrics for runs assigned with ``assign_run`` (a stand-in for the
exporter in tests that do not start it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import math
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from wandb_infra.common import labels
from wandb_infra.common.logsetup import log_fields, setup_logging

log = logging.getLogger("demo.simulator")

FLAVOURS: tuple[str, ...] = ("Hostname", "hostname", "4.9")
POD_NAMESPACE = "ml"
FAULT_KINDS: tuple[str, ...] = (
    "xid", "thermal", "stall", "ib_flap", "ib_down", "host_lost", "nvlink", "pcie", "ecc_dbe",
    "row_remap_pending", "power_brake", "eth_flap", "eth_down", "straggler", "row_remap_failure",
    "sbe_storm",
)
# Faults that act on one GPU when ``gpu`` is given, on every GPU of the host otherwise.
GPU_FAULTS = frozenset({"xid", "thermal", "stall", "nvlink", "pcie", "ecc_dbe",
                        "row_remap_pending", "power_brake", "straggler", "row_remap_failure",
                        "sbe_storm"})
LINK_FAULTS = frozenset({"ib_flap", "ib_down"})
ETH_FAULTS = frozenset({"eth_flap", "eth_down"})
ETH_DEVICES: tuple[str, ...] = ("eth0",)

HOST_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,50}")
EXPOSITION_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DCGM_PORT = 9400
NODE_PORT = 9100
XID_WINDOW_MS = 300_000
FB_TOTAL_MIB = 81_559
MODEL_NAME = "NVIDIA H100 80GB HBM3"
DRIVER_VERSION = "570.133.20"
IB_FLAP_PERIOD_S = 15.0
IB_FLAP_DOWN_S = 3.0

# Bits of DCGM_FI_DEV_CLOCKS_EVENT_REASONS (gpu-faults.md).
CLOCK_IDLE = 0x1
CLOCK_HW_SLOWDOWN = 0x8
CLOCK_HW_THERMAL = 0x40
CLOCK_HW_POWER_BRAKE = 0x80

# The err_msg text dcgm-exporter attaches to an XID (its own wording, abridged).
XID_MESSAGES: dict[int, str] = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 Exception",
    69: "Graphics Engine class error",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
}
ECC_DBE_XIDS = frozenset({48, 94, 95})
FALLEN_OFF_BUS_XID = 79


class SimulatorError(ValueError):
    """Bad input to the simulator (unknown host, GPU, device or fault kind); nothing changed."""


@dataclass(frozen=True)
class MetricDef:
    """One exposed family: legacy name, its dcgm-exporter 4.9 name and the unit scale in 4.9."""

    key: str
    name: str
    kind: str
    help: str
    name_49: str | None = None
    scale_49: float = 1.0

    def exposed(self, flavour: str) -> tuple[str, float]:
        """(metric name, value multiplier) for a flavour."""
        if flavour == "4.9" and self.name_49:
            return self.name_49, self.scale_49
        return self.name, 1.0


def _m(key: str, name: str, kind: str, help_: str, name_49: str | None = None, *,
       scale_49: float = 1.0) -> MetricDef:
    return MetricDef(key, name, kind, help_, name_49, scale_49)


# Per-GPU families in exposition order. 4.9 renames follow gpu-faults.md; fields it does not list
# keep their legacy name and unit.
GPU_METRICS: tuple[MetricDef, ...] = (
    _m("sm_clock", "DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    _m("gpu_temp", "DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).",
       "DCGM_FI_DEV_GPU_TEMP_CELSIUS"),
    _m("memory_temp", "DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    _m("power", "DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).",
       "DCGM_FI_DEV_BOARD_POWER_WATTS"),
    _m("energy", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
       "Total energy consumption since boot (in mJ)."),
    _m("pcie_replay", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.",
       "DCGM_FI_DEV_PCIE_REPLAY_TOTAL"),
    _m("gpu_util", "DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).",
       "DCGM_FI_DEV_GPU_UTIL_RATIO", scale_49=0.01),
    _m("fb_free", "DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    _m("fb_used", "DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    _m("ecc_sbe_vol", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter",
       "Total number of single-bit volatile ECC errors."),
    _m("ecc_dbe_vol", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter",
       "Total number of double-bit volatile ECC errors."),
    _m("ecc_sbe_agg", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter",
       "Total number of single-bit persistent ECC errors."),
    _m("ecc_dbe_agg", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter",
       "Total number of double-bit persistent ECC errors."),
    _m("retired_sbe", "DCGM_FI_DEV_RETIRED_SBE", "counter",
       "Total number of retired pages due to single-bit errors."),
    _m("retired_dbe", "DCGM_FI_DEV_RETIRED_DBE", "counter",
       "Total number of retired pages due to double-bit errors."),
    _m("retired_pending", "DCGM_FI_DEV_RETIRED_PENDING", "counter",
       "Total number of pages pending retirement."),
    _m("uncorrectable_remapped", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
       "Number of remapped rows for uncorrectable errors",
       "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL"),
    _m("correctable_remapped", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
       "Number of remapped rows for correctable errors"),
    _m("row_remap_failure", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge",
       "Whether remapping of rows has failed", "DCGM_FI_DEV_ROW_REMAP_FAILED"),
    _m("row_remap_pending", "DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge",
       "Whether a row remap is pending (applied at the next GPU reset)"),
    _m("thermal_violation", "DCGM_FI_DEV_THERMAL_VIOLATION", "counter",
       "Throttling duration due to thermal constraints (in ns)."),
    _m("power_violation", "DCGM_FI_DEV_POWER_VIOLATION", "counter",
       "Throttling duration due to power constraints (in ns)."),
    _m("sync_boost_violation", "DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "counter",
       "Throttling duration due to sync-boost constraints (in ns)."),
    _m("board_limit_violation", "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "counter",
       "Throttling duration due to board limit constraints (in ns)."),
    _m("low_util_violation", "DCGM_FI_DEV_LOW_UTIL_VIOLATION", "counter",
       "Throttling duration due to low utilization (in ns)."),
    _m("reliability_violation", "DCGM_FI_DEV_RELIABILITY_VIOLATION", "counter",
       "Throttling duration due to reliability constraints (in ns)."),
    _m("clock_events", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge",
       "Current clock event reasons (bitmask)."),
    _m("nvlink_crc_flit", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter",
       "Total number of NVLink flow-control CRC errors.",
       "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL"),
    _m("nvlink_crc_data", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter",
       "Total number of NVLink data CRC errors.", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL"),
    _m("nvlink_replay", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter",
       "Total number of NVLink retries.", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL"),
    _m("nvlink_recovery", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter",
       "Total number of NVLink recovery errors.", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL"),
    _m("gr_engine_active", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge",
       "Ratio of time the graphics engine is active."),
    _m("tensor_active", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
       "Ratio of cycles the tensor (HMMA) pipe is active.", "DCGM_FI_PROF_TENSOR_UTIL_RATIO"),
    _m("dram_active", "DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
       "Ratio of cycles the device memory interface is active sending or receiving data."),
)
XID_METRIC = _m("xid", "DCGM_FI_DEV_XID_ERRORS", "gauge",
                "Value of the last XID error encountered.", "DCGM_FI_DEV_XID_ERROR")
XID_COUNT_METRIC = "DCGM_EXP_XID_ERRORS_COUNT"

IB_COUNTERS: tuple[str, ...] = (
    "link_downed_total", "link_error_recovery_total", "symbol_error_total",
    "local_link_integrity_errors_total", "port_receive_remote_physical_errors_total",
    "port_errors_received_total", "excessive_buffer_overrun_errors_total",
    "port_discards_transmitted_total", "port_transmit_wait_total",
    "port_data_received_bytes_total", "port_data_transmitted_bytes_total",
)


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


def _stable_int(text: str, modulo: int) -> int:
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
class Host:
    """One node: its GPUs, IB ports, dcgm flavour, and the cached exposition text."""

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


@dataclass(frozen=True)
class RunAssignment:
    """A run placed on hosts (and GPUs): the simulator's stand-in for the exporter's join data."""

    entity: str
    project: str
    run_id: str
    hosts: tuple[str, ...]
    gpus: tuple[int, ...] | None
    run_name: str


class Cluster:
    """Hosts x GPUs with state; renders exposition text and accepts faults. Thread-safe."""

    def __init__(
        self,
        hosts: int = 4,
        *,
        gpus_per_host: int = 8,
        flavour: str = "hostname",
        prefix: str = "gpu-node",
        ib_ports: int = 8,
        host_flavours: dict[str, str] | None = None,
        xid_count: bool = False,
        xid_absent_until_first: bool = False,
        kubernetes_pods: bool = False,
        render_ttl: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if hosts < 1 or gpus_per_host < 1 or ib_ports < 0:
            raise SimulatorError("hosts and gpus_per_host must be >= 1, ib_ports >= 0")
        if not HOST_PREFIX.fullmatch(prefix):
            raise SimulatorError(f"host prefix {prefix!r} must match {HOST_PREFIX.pattern}")
        for fl in [flavour, *(host_flavours or {}).values()]:
            if fl not in FLAVOURS:
                raise SimulatorError(f"unknown dcgm flavour {fl!r}; expected one of {FLAVOURS}")
        self.clock = clock
        self.render_ttl = render_ttl
        self.xid_count = xid_count
        self.xid_absent_until_first = xid_absent_until_first
        # dcgm-exporter in Kubernetes mode: the GPUs a run holds carry its pod's labels, and the
        # join metrics include wandb_run_pod_info (as the exporter's Kubernetes source).
        self.kubernetes_pods = kubernetes_pods
        self._pod_of: dict[tuple[str, int], tuple[str, str]] = {}
        self.gpus_per_host = gpus_per_host
        self._lock = threading.RLock()
        self.runs: dict[tuple[str, str, str], RunAssignment] = {}
        self._runs_version = 0
        self._runs_cache: tuple[int, bytes] | None = None
        now = clock()
        width = max(3, len(str(hosts)))
        names = [f"{prefix}-{i:0{width}d}" for i in range(1, hosts + 1)]
        unknown = set(host_flavours or {}) - set(names)
        if unknown:
            raise SimulatorError(f"host_flavours names unknown hosts: {sorted(unknown)}")
        self.hosts: dict[str, Host] = {}
        for name in names:
            gpus = [self._new_gpu(name, i, now) for i in range(gpus_per_host)]
            ib = {f"mlx5_{d}": self._new_port(f"mlx5_{d}", now) for d in range(ib_ports)}
            eth = {d: EthPort(d, Counter(2.0, now)) for d in ETH_DEVICES}
            self.hosts[name] = Host(name, (host_flavours or {}).get(name, flavour), gpus, ib, eth)
            for gpu in gpus:
                self._apply_rates(gpu, now)
            for port in ib.values():
                self._apply_port_rates(self.hosts[name], port, now)

    # ---- construction -------------------------------------------------------------------------

    @staticmethod
    def _new_gpu(host: str, index: int, now: float) -> Gpu:
        digest = hashlib.sha256(f"{host}/{index}".encode()).hexdigest()
        uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
        bus = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)[index % 8] + 0x100 * (index // 8)
        gpu = Gpu(host, index, uuid, f"00000000:{bus:02X}:00.0")
        seed = _stable_int(uuid, 1000)
        start = {
            "energy": 4.0e11 + seed * 1e8, "ecc_sbe_vol": 0, "ecc_sbe_agg": seed % 3,
            "correctable_remapped": seed % 2,
        }
        for metric in GPU_METRICS:
            if metric.kind == "counter":
                gpu.counters[metric.key] = Counter(float(start.get(metric.key, 0)), now)
        return gpu

    @staticmethod
    def _new_port(device: str, now: float) -> IbPort:
        port = IbPort(device)
        for name in IB_COUNTERS:
            port.counters[name] = Counter(0.0, now)
        return port

    # ---- rates follow state ---------------------------------------------------------------------

    def _gauges(self, gpu: Gpu, now: float) -> dict[str, float]:
        """Gauge values for a GPU's current state."""
        seed = _stable_int(gpu.uuid, 100)
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
            "clock_events": float(reasons), "gr_engine_active": round(engine, 4),
            "tensor_active": round(tensor, 4), "dram_active": round(dram, 4),
        }

    def _apply_rates(self, gpu: Gpu, now: float) -> None:
        """Set every counter's growth rate from the GPU's state (called on each change)."""
        faults = gpu.faults
        gauges = self._gauges(gpu, now)
        rates = {
            "energy": gauges["power"] * 1000.0,
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

    @staticmethod
    def _apply_port_rates(host: Host, port: IbPort, now: float) -> None:
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

    # ---- lookups -------------------------------------------------------------------------------

    def host(self, name: str) -> Host:
        """A host by name, or a SimulatorError naming the problem."""
        try:
            return self.hosts[name]
        except KeyError:
            raise SimulatorError(f"unknown host {name!r}") from None

    def _select_gpus(self, host: Host, gpu: int | None) -> list[Gpu]:
        if gpu is None:
            return list(host.gpus)
        if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < len(host.gpus):
            raise SimulatorError(f"gpu must be an index 0..{len(host.gpus) - 1}, got {gpu!r}")
        return [host.gpus[gpu]]

    def _select_ports(self, host: Host, device: str | None) -> list[IbPort]:
        if device is None:
            if not host.ib:
                raise SimulatorError(f"host {host.name} has no InfiniBand ports")
            return [next(iter(host.ib.values()))]
        if device not in host.ib:
            raise SimulatorError(f"unknown InfiniBand device {device!r} on {host.name}")
        return [host.ib[device]]

    @staticmethod
    def _select_eth(host: Host, device: str | None) -> list[EthPort]:
        name = device or ETH_DEVICES[0]
        if name not in host.eth:
            raise SimulatorError(f"unknown network interface {name!r} on {host.name}")
        return [host.eth[name]]

    # ---- faults --------------------------------------------------------------------------------

    def inject(self, kind: str, host: str, gpu: int | None = None, code: int | None = None,
               device: str | None = None) -> None:
        """Start a fault. Everything is validated before anything changes."""
        if kind not in FAULT_KINDS:
            raise SimulatorError(f"unknown fault kind {kind!r}; expected one of {FAULT_KINDS}")
        with self._lock:
            target = self.host(host)
            if kind == "xid":
                if gpu is None:
                    raise SimulatorError("an xid fault needs a gpu index")
                if isinstance(code, bool) or not isinstance(code, int) or not 1 <= code <= 999:
                    raise SimulatorError(f"xid code must be an integer 1..999, got {code!r}")
            gpus = self._select_gpus(target, gpu) if kind in GPU_FAULTS else []
            ports = self._select_ports(target, device) if kind in LINK_FAULTS else []
            eths = self._select_eth(target, device) if kind in ETH_FAULTS else []
            now = self.clock()
            for eth in eths:
                eth.fault, eth.fault_since = kind, now
                if kind == "eth_down":
                    eth.carrier.base += 1
                eth.carrier.set_rate(2.0 / IB_FLAP_PERIOD_S if kind == "eth_flap" else 0.0, now)
            if kind == "host_lost":
                target.lost = True
            for port in ports:
                port.fault, port.fault_since = kind, now
                if kind == "ib_down":
                    port.counters["link_downed_total"].base += 1
                self._apply_port_rates(target, port, now)
            for g in gpus:
                self._inject_gpu(g, kind, code, now)
            if kind in {"stall", "thermal"}:
                for port in target.ib.values():
                    self._apply_port_rates(target, port, now)
            target.version += 1
        log.info("fault injected", extra=log_fields(kind=kind, host=host, gpu=gpu, code=code,
                                                     device=device))

    def _inject_gpu(self, gpu: Gpu, kind: str, code: int | None, now: float) -> None:
        if kind == "xid":
            assert code is not None
            gpu.last_xid = code
            gpu.xid_events.append((now, code))
            if code in ECC_DBE_XIDS:
                for key in ("ecc_dbe_vol", "ecc_dbe_agg"):
                    gpu.counters[key].base += 1
            if code == FALLEN_OFF_BUS_XID:
                gpu.faults.add("fallen_off_bus")
        elif kind == "ecc_dbe":
            for key in ("ecc_dbe_vol", "ecc_dbe_agg", "retired_dbe"):
                gpu.counters[key].base += 1
            gpu.retired_pending = 1
        elif kind == "row_remap_pending":
            gpu.row_remap_pending = True
            gpu.counters["uncorrectable_remapped"].base += 1
        else:
            gpu.faults.add(kind)
            if kind == "row_remap_failure":
                gpu.counters["uncorrectable_remapped"].base += 1
            if kind == "sbe_storm":
                gpu.counters["retired_sbe"].base += 64
        self._apply_rates(gpu, now)

    def clear(self, host: str | None = None, gpu: int | None = None, kind: str | None = None,
              device: str | None = None) -> None:
        """End faults: all, one host's, one GPU's, of one kind. Clearing ``xid`` models a GPU reset
        with an exporter restart (the last-XID series disappears); counters never go back."""
        if kind is not None and kind not in FAULT_KINDS:
            raise SimulatorError(f"unknown fault kind {kind!r}; expected one of {FAULT_KINDS}")
        with self._lock:
            targets = [self.host(host)] if host is not None else list(self.hosts.values())
            selections = [(t, self._select_gpus(t, gpu)) for t in targets]
            if device is not None:
                for t in targets:
                    if device not in t.eth:
                        self._select_ports(t, device)
            now = self.clock()
            for target, gpus in selections:
                if kind in (None, "host_lost"):
                    target.lost = False
                for g in gpus:
                    self._clear_gpu(g, kind, now)
                for port in target.ib.values():
                    if (device in (None, port.device)) and kind in (None, port.fault):
                        port.fault = None
                    self._apply_port_rates(target, port, now)
                for eth in target.eth.values():
                    if (device in (None, eth.device)) and kind in (None, eth.fault):
                        eth.fault = None
                        eth.carrier.set_rate(0.0, now)
                target.version += 1
        log.info("faults cleared", extra=log_fields(kind=kind, host=host, gpu=gpu, device=device))

    def _clear_gpu(self, gpu: Gpu, kind: str | None, now: float) -> None:
        if kind in (None, "xid"):
            gpu.last_xid = None
            gpu.xid_events.clear()
            gpu.faults.discard("fallen_off_bus")
        if kind in (None, "ecc_dbe"):
            gpu.retired_pending = 0
        if kind in (None, "row_remap_pending"):
            gpu.row_remap_pending = False
        if kind is None:
            gpu.faults.clear()
        else:
            gpu.faults.discard(kind)
        self._apply_rates(gpu, now)

    def set_busy(self, host: str, busy: bool, gpu: int | None = None) -> None:
        """Start or stop the workload on a host's GPUs (idle GPUs draw little and free memory)."""
        with self._lock:
            target = self.host(host)
            gpus = self._select_gpus(target, gpu)
            now = self.clock()
            for g in gpus:
                g.busy = bool(busy)
                self._apply_rates(g, now)
            for port in target.ib.values():
                self._apply_port_rates(target, port, now)
            target.version += 1

    # ---- runs (join-metric stand-in) -------------------------------------------------------------

    def assign_run(self, entity: str, project: str, run_id: str, hosts: Iterable[str], *,
                   gpus: Iterable[int] | None = None, run_name: str | None = None) -> RunAssignment:
        """Place a run on hosts (and GPU indices on each); served at ``/runs/metrics``."""
        host_list = tuple(hosts)
        if not (entity and project and run_id and host_list):
            raise SimulatorError("a run needs entity, project, run_id and at least one host")
        gpu_list = None if gpus is None else tuple(gpus)
        with self._lock:
            for name in host_list:
                target = self.host(name)
                for index in gpu_list or ():
                    self._select_gpus(target, index)
            run = RunAssignment(entity, project, run_id, host_list, gpu_list, run_name or run_id)
            self.runs[(entity, project, run_id)] = run
            self._runs_version += 1
            if self.kubernetes_pods:
                self._set_pods(run, held=True)
        return run

    def _set_pods(self, run: RunAssignment, held: bool) -> None:
        """Label (or unlabel) the GPUs of a run's pods, one pod per host."""
        for i, name in enumerate(run.hosts):
            for index in run.gpus if run.gpus is not None else range(self.gpus_per_host):
                if held:
                    self._pod_of[(name, index)] = (POD_NAMESPACE, f"{run.run_id}-{i}")
                else:
                    self._pod_of.pop((name, index), None)
            self.hosts[name].version += 1

    def end_run(self, entity: str, project: str, run_id: str) -> None:
        """Remove a run's join series (they go stale in Prometheus)."""
        with self._lock:
            run = self.runs.pop((entity, project, run_id), None)
            if run is None:
                raise SimulatorError(f"unknown run {entity}/{project}/{run_id}")
            self._runs_version += 1
            if self.kubernetes_pods:
                self._set_pods(run, held=False)

    # ---- rendering -----------------------------------------------------------------------------

    def render(self, exporter: str, host: str) -> bytes | None:
        """Exposition text of one target (``dcgm`` or ``node``); None while the host is lost."""
        with self._lock:
            target = self.host(host)
            if target.lost:
                return None
            now = self.clock()
            cached = target.cache.get(exporter)
            if cached and cached[1] == target.version and now - cached[0] < self.render_ttl:
                return cached[2]
            if exporter == "dcgm":
                body = self._render_dcgm(target, now)
            elif exporter == "node":
                body = self._render_node(target, now)
            else:
                raise SimulatorError(f"unknown exporter {exporter!r}")
            data = body.encode()
            target.cache[exporter] = (now, target.version, data)
            return data

    def _render_dcgm(self, host: Host, now: float) -> str:
        host_label = "Hostname" if host.flavour == "Hostname" else "hostname"
        gpus = [g for g in host.gpus if "fallen_off_bus" not in g.faults]
        base = {
            g.index: (f'gpu="{g.index}",UUID="{g.uuid}",pci_bus_id="{g.pci_bus_id}",'
                      f'device="nvidia{g.index}",modelName="{MODEL_NAME}",'
                      f'{host_label}="{host.name}",DCGM_FI_DRIVER_VERSION="{DRIVER_VERSION}"'
                      + self._pod_labels(host.name, g.index))
            for g in gpus
        }
        gauges = {g.index: self._gauges(g, now) for g in gpus}
        out: list[str] = []
        for metric in GPU_METRICS:
            name, scale = metric.exposed(host.flavour)
            out.append(f"# HELP {name} {metric.help}\n# TYPE {name} {metric.kind}\n")
            for g in gpus:
                if metric.key == "retired_pending":
                    value = str(g.retired_pending)
                elif metric.kind == "counter":
                    value = _fmt(math.floor(g.counters[metric.key].value(now)) * scale)
                else:
                    value = _fmt(gauges[g.index][metric.key] * scale)
                out.append(f"{name}{{{base[g.index]}}} {value}\n")
        xid_name, _ = XID_METRIC.exposed(host.flavour)
        xid_lines = []
        for g in gpus:
            if g.last_xid is None and self.xid_absent_until_first:
                continue
            code = g.last_xid or 0
            msg = XID_MESSAGES.get(code, "Unknown Error") if code else "No Error"
            xid_lines.append(f'{xid_name}{{{base[g.index]},err_code="{code}",err_msg="{msg}"}} '
                             f"{code}\n")
        if xid_lines:
            out.append(f"# HELP {xid_name} {XID_METRIC.help}\n# TYPE {xid_name} gauge\n")
            out.extend(xid_lines)
        if self.xid_count:
            out.append(f"# HELP {XID_COUNT_METRIC} Count of XID errors within the window.\n"
                       f"# TYPE {XID_COUNT_METRIC} gauge\n")
            for g in gpus:
                for code in sorted({c for _, c in g.xid_events}):
                    count = sum(1 for t, c in g.xid_events
                                if c == code and now - t <= XID_WINDOW_MS / 1000)
                    out.append(f'{XID_COUNT_METRIC}{{{base[g.index]},xid="{code}",'
                               f'window_size_in_ms="{XID_WINDOW_MS}"}} {count}\n')
        return "".join(out)

    def _render_node(self, host: Host, now: float) -> str:
        release = "5.15.0-131-generic"
        out = [
            "# HELP node_uname_info Labeled system information as provided by the uname "
            "system call.\n"
            "# TYPE node_uname_info gauge\n"
            f'node_uname_info{{domainname="(none)",machine="x86_64",nodename="{host.name}",'
            f'release="{release}",sysname="Linux",version="#141-Ubuntu SMP"}} 1\n',
            "# HELP node_network_up Value is 1 if operstate is 'up', 0 otherwise.\n"
            "# TYPE node_network_up gauge\n",
            *(f'node_network_up{{device="{e.device}"}} {self._eth_up(e, now)}\n'
              for e in host.eth.values()),
            'node_network_up{device="lo"} 0\n',
            "# HELP node_network_carrier_changes_total Network device property: "
            "carrier_changes_total\n"
            "# TYPE node_network_carrier_changes_total counter\n",
            *(f'node_network_carrier_changes_total{{device="{e.device}"}} '
              f"{math.floor(e.carrier.value(now))}\n" for e in host.eth.values()),
            'node_network_carrier_changes_total{device="lo"} 0\n',
        ]
        if not host.ib:
            return "".join(out)
        ports = list(host.ib.values())
        out.append("# HELP node_infiniband_info Non-numeric data from "
                   "/sys/class/infiniband/<device>, value is always 1.\n"
                   "# TYPE node_infiniband_info gauge\n")
        for p in ports:
            out.append(f'node_infiniband_info{{board_id="MT_0000000970",device="{p.device}",'
                       f'firmware_version="28.39.1002",hca_type="MT4129"}} 1\n')
        states = {p.device: self._port_state(p, now) for p in ports}
        for metric, idx in (("state_id", 0), ("physical_state_id", 1)):
            out.append(f"# HELP node_infiniband_{metric} State of the InfiniBand port\n"
                       f"# TYPE node_infiniband_{metric} gauge\n")
            for p in ports:
                out.append(f'node_infiniband_{metric}{{device="{p.device}",port="{p.port}"}} '
                           f"{states[p.device][idx]}\n")
        out.append("# HELP node_infiniband_rate_bytes_per_second Maximum signal transfer rate\n"
                   "# TYPE node_infiniband_rate_bytes_per_second gauge\n")
        for p in ports:
            out.append(f'node_infiniband_rate_bytes_per_second{{device="{p.device}",'
                       f'port="{p.port}"}} 5e+10\n')
        for counter in IB_COUNTERS:
            name = f"node_infiniband_{counter}"
            out.append(f"# HELP {name} InfiniBand port counter {counter}\n# TYPE {name} counter\n")
            for p in ports:
                out.append(f'{name}{{device="{p.device}",port="{p.port}"}} '
                           f"{math.floor(p.counters[counter].value(now))}\n")
        return "".join(out)

    @staticmethod
    def _eth_up(eth: EthPort, now: float) -> int:
        """1 up, 0 down; a flapping interface is down for part of every period."""
        if eth.fault == "eth_down":
            return 0
        if eth.fault == "eth_flap" and (now - eth.fault_since) % IB_FLAP_PERIOD_S < IB_FLAP_DOWN_S:
            return 0
        return 1

    @staticmethod
    def _port_state(port: IbPort, now: float) -> tuple[int, int]:
        """(state_id, physical_state_id): 4/5 active, 1/2 down (polling)."""
        if port.fault == "ib_down":
            return 1, 2
        if port.fault == "ib_flap" and (now - port.fault_since) % IB_FLAP_PERIOD_S < IB_FLAP_DOWN_S:
            return 1, 2
        return 4, 5

    def _pod_labels(self, host: str, index: int) -> str:
        """dcgm-exporter's Kubernetes-mode labels of a GPU a pod holds ('' otherwise)."""
        held = self._pod_of.get((host, index))
        if held is None:
            return ""
        namespace, pod = held
        return f',pod="{pod}",namespace="{namespace}",container="trainer"'

    def set_slurm_state(self, host: str, state: str, reason: str = "") -> None:
        """What ``scontrol show node`` says of a host (``IDLE+DRAIN`` after a drain); "" goes
        back to the default (ALLOCATED under a run, else IDLE)."""
        with self._lock:
            target = self.host(host)
            target.slurm_state, target.slurm_reason = state, reason

    def slurm_state(self, host: str) -> str:
        """The state ``scontrol show node`` prints for a host now."""
        with self._lock:
            target = self.host(host)
            busy = any(host in run.hosts for run in self.runs.values())
            return target.slurm_state or ("ALLOCATED" if busy else "IDLE")

    def render_scontrol_nodes(self) -> str:
        """Every host as one ``scontrol show node -o`` line (NodeName, State, Reason last)."""
        with self._lock:
            lines = []
            for name, host in self.hosts.items():
                state = self.slurm_state(name)
                line = (f"NodeName={name} Arch=x86_64 CoresPerSocket=48 CPUAlloc=0 "
                        f"Gres=gpu:{len(host.gpus)} NodeAddr={name} NodeHostName={name} "
                        f"Partitions=gpu State={state}")
                if host.slurm_reason:
                    line += f" Reason={host.slurm_reason} [root@2026-11-30T12:00:00]"
                lines.append(line)
            return "\n".join(lines) + "\n"

    def render_runs(self) -> bytes:
        """The join metrics (contract 1) for assigned runs."""
        with self._lock:
            if self._runs_cache and self._runs_cache[0] == self._runs_version:
                return self._runs_cache[1]
            out = [f"# HELP {labels.NODE_INFO} Run to node (simulator stand-in).\n"
                   f"# TYPE {labels.NODE_INFO} gauge\n"]
            gpu_lines = []
            for run in self.runs.values():
                ident = (f'{labels.ENTITY}="{_escape(run.entity)}",'
                         f'{labels.PROJECT}="{_escape(run.project)}",'
                         f'{labels.RUN_ID}="{_escape(run.run_id)}"')
                for name in run.hosts:
                    out.append(f'{labels.NODE_INFO}{{{ident},'
                               f'{labels.RUN_NAME}="{_escape(run.run_name)}",'
                               f'{labels.HOSTNAME}="{name}",{labels.SOURCE}="simulator"}} 1\n')
                    for index in run.gpus if run.gpus is not None else range(self.gpus_per_host):
                        uuid = self.hosts[name].gpus[index].uuid
                        gpu_lines.append(
                            f'{labels.GPU_INFO}{{{ident},{labels.HOSTNAME}="{name}",'
                            f'{labels.GPU}="{index}",{labels.GPU_UUID}="{uuid}",'
                            f'{labels.SOURCE}="simulator"}} 1\n')
            out.append(f"# HELP {labels.GPU_INFO} Run to GPU (simulator stand-in).\n"
                       f"# TYPE {labels.GPU_INFO} gauge\n")
            out.extend(gpu_lines)
            if self.kubernetes_pods:
                out.append(f"# HELP {labels.POD_INFO} Run to pod (simulator stand-in).\n"
                           f"# TYPE {labels.POD_INFO} gauge\n")
                for run in self.runs.values():
                    for i, name in enumerate(run.hosts):
                        out.append(
                            f'{labels.POD_INFO}{{{labels.ENTITY}="{_escape(run.entity)}",'
                            f'{labels.PROJECT}="{_escape(run.project)}",'
                            f'{labels.RUN_ID}="{_escape(run.run_id)}",'
                            f'{labels.HOSTNAME}="{name}",{labels.NAMESPACE}="{POD_NAMESPACE}",'
                            f'{labels.POD}="{_escape(run.run_id)}-{i}",'
                            f'{labels.SOURCE}="simulator"}} 1\n')
            data = "".join(out).encode()
            self._runs_cache = (self._runs_version, data)
            return data


def _escape(value: str) -> str:
    """A label value as the exposition format needs it (backslash, quote, newline escaped)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _fmt(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(round(value, 6))


# ---- Prometheus scrape configuration ------------------------------------------------------------

def target_groups(address: str, hosts: Iterable[str], exporter: str) -> list[dict[str, Any]]:
    """file_sd / http_sd target groups: one target per host, its own path and ``instance``."""
    port = DCGM_PORT if exporter == "dcgm" else NODE_PORT
    return [
        {"targets": [address],
         "labels": {"__metrics_path__": f"/{exporter}/{name}/metrics",
                    "instance": f"{name}:{port}"}}
        for name in hosts
    ]


def scrape_configs(
    address: str, hosts: Iterable[str], *, interval: str = "15s", file_sd_dir: Path | None = None,
    dcgm_job: str = "dcgm", node_job: str = "node", runs_job: str | None = None,
) -> list[dict[str, Any]]:
    """Scrape configs for the simulator: static, or file_sd when ``file_sd_dir`` is given (the
    files are written there). ``runs_job`` adds the join-metric stand-in."""
    host_list = list(hosts)
    configs: list[dict[str, Any]] = []
    for exporter, job in (("dcgm", dcgm_job), ("node", node_job)):
        groups = target_groups(address, host_list, exporter)
        entry: dict[str, Any] = {"job_name": job, "scrape_interval": interval,
                                 "scrape_timeout": _timeout_for(interval)}
        if file_sd_dir is not None:
            file_sd_dir.mkdir(parents=True, exist_ok=True)
            path = file_sd_dir / f"{exporter}.json"
            path.write_text(json.dumps(groups, indent=1))
            entry["file_sd_configs"] = [{"files": [str(path)], "refresh_interval": "30s"}]
        else:
            entry["static_configs"] = groups
        configs.append(entry)
    if runs_job:
        configs.append({"job_name": runs_job, "scrape_interval": interval,
                        "metrics_path": "/runs/metrics",
                        "static_configs": [{"targets": [address]}]})
    return configs


def _timeout_for(interval: str) -> str:
    seconds = _seconds(interval)
    return f"{max(1, min(10, int(seconds * 0.8)))}s"


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in ("ms", "s", "m", "h"):
        if duration.endswith(unit) and duration[: -len(unit)].isdigit():
            return int(duration[: -len(unit)]) * units[unit]
    raise SimulatorError(f"bad duration {duration!r}; use e.g. 15s, 1m")


def prometheus_config(
    address: str, hosts: Iterable[str], *, interval: str = "15s", rule_files: Iterable[str] = (),
    file_sd_dir: Path | None = None, extra_scrape_configs: Iterable[dict[str, Any]] = (),
    runs_job: str | None = None,
) -> str:
    """A complete prometheus.yml (YAML text) scraping the simulator."""
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": list(rule_files),
        "scrape_configs": [*scrape_configs(address, hosts, interval=interval,
                                           file_sd_dir=file_sd_dir, runs_job=runs_job),
                           *extra_scrape_configs],
    }
    return yaml.safe_dump(config, sort_keys=False)


# ---- HTTP server -------------------------------------------------------------------------------

def build_app(cluster: Cluster) -> web.Application:
    """The aiohttp application: metrics per target, service discovery and the control API."""

    async def metrics(request: web.Request) -> web.StreamResponse:
        exporter, name = request.match_info["exporter"], request.match_info["host"]
        if name not in cluster.hosts:
            raise web.HTTPNotFound(text=f"unknown host {name}\n")
        body = cluster.render(exporter, name)
        if body is None:
            # A lost host does not answer: drop the connection, as an unreachable node would.
            if request.transport is not None:
                request.transport.abort()
            raise web.HTTPServiceUnavailable(text="host lost\n")
        return web.Response(body=body, headers={"Content-Type": EXPOSITION_TYPE})

    async def runs(_request: web.Request) -> web.Response:
        return web.Response(body=cluster.render_runs(), headers={"Content-Type": EXPOSITION_TYPE})

    async def service_discovery(request: web.Request) -> web.Response:
        exporter = request.match_info["exporter"]
        address = f"{request.url.host}:{request.url.port}"
        return web.json_response(target_groups(address, cluster.hosts, exporter))

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "hosts": len(cluster.hosts)})

    async def scontrol_nodes(_request: web.Request) -> web.Response:
        return web.Response(text=cluster.render_scontrol_nodes())

    async def control(request: web.Request) -> web.Response:
        action = request.match_info["action"]
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise web.HTTPBadRequest(text="body must be a JSON object\n") from None
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text="body must be a JSON object\n")
        try:
            _control(cluster, action, body)
        except SimulatorError as exc:
            raise web.HTTPBadRequest(text=f"{exc}\n") from None
        return web.json_response({"ok": True})

    app = web.Application(client_max_size=64 * 1024)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/runs/metrics", runs)
    app.router.add_get("/sd/{exporter:dcgm|node}", service_discovery)
    app.router.add_get("/{exporter:dcgm|node}/{host}/metrics", metrics)
    app.router.add_get("/slurm/nodes", scontrol_nodes)
    app.router.add_post("/control/{action}", control)
    return app


def _control(cluster: Cluster, action: str, body: dict[str, Any]) -> None:
    """Apply one control request; validates every host first so a bad one changes nothing."""
    allowed = {"kind", "host", "hosts", "gpu", "code", "device", "busy", "entity", "project",
               "run_id", "run_name", "gpus", "state", "reason"}
    unknown = set(body) - allowed
    if unknown:
        raise SimulatorError(f"unknown fields {sorted(unknown)}")
    hosts = body.get("hosts", [body["host"]] if "host" in body else [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise SimulatorError("hosts must be a list of host names")
    for name in hosts:
        cluster.host(name)
    if action == "slurm_state":
        state, reason = body.get("state", ""), body.get("reason", "")
        if not isinstance(state, str) or not isinstance(reason, str):
            raise SimulatorError("state and reason must be strings")
        for name in hosts:
            cluster.set_slurm_state(name, state, reason)
        return
    if action == "fault":
        if not hosts:
            raise SimulatorError("a fault needs host or hosts")
        kind = body.get("kind")
        if not isinstance(kind, str):
            raise SimulatorError("kind must be a string")
        with cluster._lock:
            for name in hosts:
                cluster.inject(kind, name, body.get("gpu"), body.get("code"), body.get("device"))
    elif action == "clear":
        for name in hosts or [None]:
            cluster.clear(name, body.get("gpu"), body.get("kind"), body.get("device"))
    elif action == "workload":
        if not isinstance(body.get("busy"), bool) or not hosts:
            raise SimulatorError("workload needs host(s) and busy: true|false")
        for name in hosts:
            cluster.set_busy(name, body["busy"], body.get("gpu"))
    elif action == "run":
        fields = [body.get(k) for k in ("entity", "project", "run_id")]
        if not all(isinstance(f, str) for f in fields):
            raise SimulatorError("run needs entity, project and run_id strings")
        gpus = body.get("gpus")
        if gpus is not None and not (isinstance(gpus, list) and all(
                isinstance(g, int) and not isinstance(g, bool) for g in gpus)):
            raise SimulatorError("gpus must be a list of GPU indices")
        if not isinstance(body.get("run_name", ""), str):
            raise SimulatorError("run_name must be a string")
        entity, project, run_id = (str(f) for f in fields)
        cluster.assign_run(entity, project, run_id, hosts, gpus=gpus,
                           run_name=body.get("run_name"))
    else:
        raise SimulatorError(f"unknown control action {action!r}")


class SimulatorServer:
    """Runs the app on its own event loop in a background thread (for tests and the demo)."""

    def __init__(self, cluster: Cluster, host: str = "127.0.0.1", port: int = 0) -> None:
        self.cluster = cluster
        self._host, self._port = host, port
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="simulator")
        self.port = 0

    @property
    def address(self) -> str:
        """host:port for scrape configs."""
        return f"{self._host}:{self.port}"

    @property
    def url(self) -> str:
        """Base URL."""
        return f"http://{self.address}"

    def start(self) -> SimulatorServer:
        """Bind and serve; returns when the port is known."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    async def _start(self) -> None:
        self._runner = web.AppRunner(build_app(self.cluster), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, backlog=1024)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        """Stop serving and end the thread."""
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
            self._runner = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


@contextlib.contextmanager
def serve(cluster: Cluster, port: int = 0) -> Iterator[SimulatorServer]:
    """``with serve(Cluster(hosts=4)) as sim: ...`` serves on 127.0.0.1 until the block ends."""
    server = SimulatorServer(cluster, port=port).start()
    try:
        yield server
    finally:
        server.stop()


# ---- CLI -----------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options; every one is explained in --help."""
    parser = argparse.ArgumentParser(
        prog="python -m demo.simulator",
        description="Serve simulated dcgm-exporter and node_exporter targets for N hosts x GPUs on "
                    "127.0.0.1, with faults injected through POST /control/fault.")
    parser.add_argument("--hosts", type=int, default=64, help="number of hosts (default 64)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per host (default 8)")
    parser.add_argument("--ib-ports", type=int, default=8,
                        help="InfiniBand HCAs per host, one port each (default 8)")
    parser.add_argument("--prefix", default="gpu-node", help="host name prefix (default gpu-node)")
    parser.add_argument("--flavour", choices=FLAVOURS, default="hostname",
                        help="dcgm-exporter flavour: 'Hostname' label (<= 4.8.2), 'hostname' "
                             "label (newer), or '4.9' metric names and units (default hostname)")
    parser.add_argument("--xid-count", action="store_true",
                        help="also serve DCGM_EXP_XID_ERRORS_COUNT (off by default in "
                             "dcgm-exporter)")
    parser.add_argument("--xid-absent-until-first", action="store_true",
                        help="omit DCGM_FI_DEV_XID_ERRORS until a GPU's first XID (some 4.5-4.8)")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 = any free)")
    parser.add_argument("--interval", default="15s", help="scrape interval written to configs")
    parser.add_argument("--file-sd-dir", type=Path,
                        help="write file_sd target files (dcgm.json, node.json) into this folder")
    parser.add_argument("--prometheus-config", type=Path,
                        help="write a prometheus.yml scraping the simulator to this path")
    parser.add_argument("--log-level", default="info", help="log level (default info)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted; prints one JSON line with the URL once listening."""
    args = parse_args(argv)
    setup_logging(args.log_level)
    try:
        cluster = Cluster(hosts=args.hosts, gpus_per_host=args.gpus, flavour=args.flavour,
                          prefix=args.prefix, ib_ports=args.ib_ports, xid_count=args.xid_count,
                          xid_absent_until_first=args.xid_absent_until_first)
        _seconds(args.interval)
    except SimulatorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    server = SimulatorServer(cluster, port=args.port).start()
    try:
        if args.file_sd_dir is not None:
            scrape_configs(server.address, cluster.hosts, interval=args.interval,
                           file_sd_dir=args.file_sd_dir)
        if args.prometheus_config is not None:
            args.prometheus_config.write_text(prometheus_config(
                server.address, cluster.hosts, interval=args.interval,
                file_sd_dir=args.file_sd_dir, runs_job="wandb-runs-simulated"))
        print(json.dumps({"url": server.url, "hosts": len(cluster.hosts)}), flush=True)
        log.info("simulator listening", extra=log_fields(url=server.url, hosts=len(cluster.hosts),
                                                         flavour=args.flavour))
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
