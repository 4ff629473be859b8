"""What the simulated exporters print: dcgm-exporter and node_exporter exposition text for one
host, the join metrics of assigned runs, and Slurm's ``scontrol show node -o`` lines.

Why apart from the cluster: this is where the simulator must match the real exporters byte for
byte in names, labels, units and HELP text (the flavours, the 4.9 renames, the XID series), and
where scrape cost lives (2,000 hosts); the cluster decides only what the state is.

dcgm-exporter flavours (per cluster, overridable per host): ``Hostname`` (label spelling up to
4.8.2), ``hostname`` (newer), ``4.9`` (renamed fields and unit changes, label ``hostname``).
``DCGM_FI_DEV_XID_ERRORS`` carries the value of the LAST XID with ``err_code`` equal to it, so a new
code is a new series and the old one goes stale, as in the real exporter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from demo.simulator.model import (
    EDAC_CONTROLLERS,
    POD_NAMESPACE,
    Host,
    Mount,
    RunAssignment,
    eth_up,
    gauges,
    port_state,
)
from wandb_infra.catalog.alerts import duration_seconds
from wandb_infra.catalog.series import XID_COUNT_WINDOW
from wandb_infra.common import labels

FLAVOURS: tuple[str, ...] = ("Hostname", "hostname", "4.9")
EXPOSITION_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# dcgm-exporter's --xid-count-window-size, the window the rules assume.
XID_WINDOW_MS = round(duration_seconds(XID_COUNT_WINDOW) * 1000)
MODEL_NAME = "NVIDIA H100 80GB HBM3"
DRIVER_VERSION = "570.133.20"

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
    _m("recovery_action", "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", "gauge",
       "The driver's recovery action (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain "
       "and reset).", "DCGM_FI_DEV_GPU_RECOVERY_ACTION"),
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


PodOf = Mapping[tuple[str, int], tuple[str, str]]
"""(host, GPU index) -> (namespace, pod) of the pod that holds the GPU (Kubernetes mode)."""


def dcgm_text(host: Host, now: float, *, pods: PodOf, xid_count: bool,
              xid_absent_until_first: bool) -> str:
    """One host's dcgm-exporter page in its flavour; a GPU that fell off the bus is absent."""
    host_label = "Hostname" if host.flavour == "Hostname" else "hostname"
    gpus = [g for g in host.gpus if "fallen_off_bus" not in g.faults]
    base = {
        g.index: (f'gpu="{g.index}",UUID="{g.uuid}",pci_bus_id="{g.pci_bus_id}",'
                  f'device="nvidia{g.index}",modelName="{MODEL_NAME}",'
                  f'{host_label}="{host.name}",DCGM_FI_DRIVER_VERSION="{DRIVER_VERSION}"'
                  + _pod_labels(pods, host.name, g.index))
        for g in gpus
    }
    readings = {g.index: gauges(g, now) for g in gpus}
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
                value = _fmt(readings[g.index][metric.key] * scale)
            out.append(f"{name}{{{base[g.index]}}} {value}\n")
    xid_name, _ = XID_METRIC.exposed(host.flavour)
    xid_lines = []
    for g in gpus:
        if g.last_xid is None and xid_absent_until_first:
            continue
        code = g.last_xid or 0
        msg = XID_MESSAGES.get(code, "Unknown Error") if code else "No Error"
        xid_lines.append(f'{xid_name}{{{base[g.index]},err_code="{code}",err_msg="{msg}"}} '
                         f"{code}\n")
    if xid_lines:
        out.append(f"# HELP {xid_name} {XID_METRIC.help}\n# TYPE {xid_name} gauge\n")
        out.extend(xid_lines)
    if xid_count:
        out.append(f"# HELP {XID_COUNT_METRIC} Count of XID errors within the window.\n"
                   f"# TYPE {XID_COUNT_METRIC} gauge\n")
        for g in gpus:
            for code in sorted({c for _, c in g.xid_events}):
                count = sum(1 for t, c in g.xid_events
                            if c == code and now - t <= XID_WINDOW_MS / 1000)
                out.append(f'{XID_COUNT_METRIC}{{{base[g.index]},xid="{code}",'
                           f'window_size_in_ms="{XID_WINDOW_MS}"}} {count}\n')
    return "".join(out)


def _pod_labels(pods: PodOf, host: str, index: int) -> str:
    """dcgm-exporter's Kubernetes-mode labels of a GPU a pod holds ('' otherwise)."""
    held = pods.get((host, index))
    if held is None:
        return ""
    namespace, pod = held
    return f',pod="{pod}",namespace="{namespace}",container="trainer"'


# Filesystem sizes: a full one has 0.5% free, well below the rules' threshold
# (catalog/host_alerts.py FS_FREE_MIN_RATIO).
FS_SIZE_BYTES = 1e12
# /proc/meminfo's total, and what is available on a healthy host and on one whose tasks stall on
# memory (memory_pressure: the kernel is about to OOM-kill).
MEM_TOTAL_BYTES = 2e12
MEM_AVAILABLE_RATIO = 0.4
MEM_EXHAUSTED_RATIO = 0.002
FS_AVAIL_BYTES = 4e11
FS_FULL_AVAIL_BYTES = 5e9


def host_text(host: Host, now: float) -> str:
    """The host series the host rules read: vmstat's OOM kills, PSI memory, meminfo's total and
    available memory, EDAC per memory controller (faults on the first), and the filesystem
    collector per mount; a mount that does not answer statfs has only device_error and readonly,
    as the collector publishes it."""
    available = MEM_EXHAUSTED_RATIO if host.memory_stalled.rate else MEM_AVAILABLE_RATIO
    edac = {"correctable": math.floor(host.edac_correctable.value(now)),
            "uncorrectable": host.edac_uncorrectable}
    out = [
        "# HELP node_vmstat_oom_kill /proc/vmstat information field oom_kill.\n"
        f"# TYPE node_vmstat_oom_kill untyped\nnode_vmstat_oom_kill {host.oom_kills}\n",
        "# TYPE node_pressure_memory_stalled_seconds_total counter\n"
        "node_pressure_memory_stalled_seconds_total "
        f"{_fmt(round(host.memory_stalled.value(now), 3))}\n",
        "# TYPE node_memory_MemTotal_bytes gauge\n"
        f"node_memory_MemTotal_bytes {_fmt(MEM_TOTAL_BYTES)}\n",
        "# TYPE node_memory_MemAvailable_bytes gauge\n"
        "node_memory_MemAvailable_bytes "
        f"{_fmt(MEM_TOTAL_BYTES * available)}\n",
    ]
    for kind, count in edac.items():
        out.append(f"# TYPE node_edac_{kind}_errors_total counter\n")
        out.extend(f'node_edac_{kind}_errors_total{{controller="{c}"}} {count if i == 0 else 0}\n'
                   for i, c in enumerate(EDAC_CONTROLLERS))
    mounts = list(host.mounts.values())
    answering = [m for m in mounts if m.fault != "fs_not_answering"]
    families: tuple[tuple[str, list[Mount], Callable[[Mount], float]], ...] = (
        ("readonly", mounts, lambda m: int(m.fault == "fs_readonly")),
        ("device_error", mounts, lambda m: int(m.fault == "fs_not_answering")),
        ("avail_bytes", answering,
         lambda m: FS_FULL_AVAIL_BYTES if m.fault == "fs_full" else FS_AVAIL_BYTES),
        ("size_bytes", answering, lambda m: FS_SIZE_BYTES),
    )
    for metric, shown, value in families:
        out.append(f"# TYPE node_filesystem_{metric} gauge\n")
        out.extend(f'node_filesystem_{metric}{{device="{m.device}",fstype="{m.fstype}",'
                   f'mountpoint="{m.mountpoint}"}} {_fmt(value(m))}\n' for m in shown)
    return "".join(out)


def node_text(host: Host, now: float) -> str:
    """One host's node_exporter page: uname, boot time, Ethernet up/carrier, host memory and
    filesystems, InfiniBand ports."""
    release = "5.15.0-131-generic"
    out = [
        "# HELP node_boot_time_seconds Node boot time, in unixtime.\n"
        "# TYPE node_boot_time_seconds gauge\n"
        f"node_boot_time_seconds {_fmt(math.floor(host.boot_time))}\n",
        "# HELP node_uname_info Labeled system information as provided by the uname "
        "system call.\n"
        "# TYPE node_uname_info gauge\n"
        f'node_uname_info{{domainname="(none)",machine="x86_64",nodename="{host.name}",'
        f'release="{release}",sysname="Linux",version="#141-Ubuntu SMP"}} 1\n',
        "# HELP node_network_up Value is 1 if operstate is 'up', 0 otherwise.\n"
        "# TYPE node_network_up gauge\n",
        *(f'node_network_up{{device="{e.device}"}} {eth_up(e, now)}\n'
          for e in host.eth.values()),
        'node_network_up{device="lo"} 0\n',
        "# HELP node_network_carrier_changes_total Network device property: "
        "carrier_changes_total\n"
        "# TYPE node_network_carrier_changes_total counter\n",
        *(f'node_network_carrier_changes_total{{device="{e.device}"}} '
          f"{math.floor(e.carrier.value(now))}\n" for e in host.eth.values()),
        'node_network_carrier_changes_total{device="lo"} 0\n',
    ]
    out.append(host_text(host, now))
    if not host.ib:
        return "".join(out)
    ports = list(host.ib.values())
    out.append("# HELP node_infiniband_info Non-numeric data from "
               "/sys/class/infiniband/<device>, value is always 1.\n"
               "# TYPE node_infiniband_info gauge\n")
    for p in ports:
        out.append(f'node_infiniband_info{{board_id="MT_0000000970",device="{p.device}",'
                   f'firmware_version="28.39.1002",hca_type="MT4129"}} 1\n')
    states = {p.device: port_state(p, now) for p in ports}
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


def scontrol_line(host: Host, state: str) -> str:
    """One host as ``scontrol show node -o`` prints it (NodeName, State, Reason last)."""
    line = (f"NodeName={host.name} Arch=x86_64 CoresPerSocket=48 CPUAlloc=0 "
            f"Gres=gpu:{len(host.gpus)} NodeAddr={host.name} NodeHostName={host.name} "
            f"Partitions=gpu State={state}")
    if host.slurm_reason:
        line += f" Reason={host.slurm_reason} [root@2026-11-30T12:00:00]"
    return line


def runs_text(runs: Collection[RunAssignment], hosts: Mapping[str, Host], gpus_per_host: int,
              kubernetes_pods: bool) -> str:
    """The join metrics (contract 1) for assigned runs, as the exporter would publish them."""
    out = [f"# HELP {labels.NODE_INFO} Run to node (simulator stand-in).\n"
           f"# TYPE {labels.NODE_INFO} gauge\n"]
    gpu_lines = []
    for run in runs:
        ident = (f'{labels.ENTITY}="{_escape(run.entity)}",'
                 f'{labels.PROJECT}="{_escape(run.project)}",'
                 f'{labels.RUN_ID}="{_escape(run.run_id)}"')
        for name in run.hosts:
            out.append(f'{labels.NODE_INFO}{{{ident},'
                       f'{labels.RUN_NAME}="{_escape(run.run_name)}",'
                       f'{labels.HOSTNAME}="{name}",{labels.SOURCE}="simulator"}} 1\n')
            for index in run.gpus if run.gpus is not None else range(gpus_per_host):
                uuid = hosts[name].gpus[index].uuid
                gpu_lines.append(
                    f'{labels.GPU_INFO}{{{ident},{labels.HOSTNAME}="{name}",'
                    f'{labels.GPU}="{index}",{labels.GPU_UUID}="{uuid}",'
                    f'{labels.SOURCE}="simulator"}} 1\n')
    out.append(f"# HELP {labels.GPU_INFO} Run to GPU (simulator stand-in).\n"
               f"# TYPE {labels.GPU_INFO} gauge\n")
    out.extend(gpu_lines)
    if kubernetes_pods:
        out.append(f"# HELP {labels.POD_INFO} Run to pod (simulator stand-in).\n"
                   f"# TYPE {labels.POD_INFO} gauge\n")
        for run in runs:
            for i, name in enumerate(run.hosts):
                out.append(
                    f'{labels.POD_INFO}{{{labels.ENTITY}="{_escape(run.entity)}",'
                    f'{labels.PROJECT}="{_escape(run.project)}",'
                    f'{labels.RUN_ID}="{_escape(run.run_id)}",'
                    f'{labels.HOSTNAME}="{name}",{labels.NAMESPACE}="{POD_NAMESPACE}",'
                    f'{labels.POD}="{_escape(run.run_id)}-{i}",'
                    f'{labels.SOURCE}="simulator"}} 1\n')
    return "".join(out)


def _escape(value: str) -> str:
    """A label value as the exposition format needs it (backslash, quote, newline escaped)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _fmt(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(round(value, 6))
