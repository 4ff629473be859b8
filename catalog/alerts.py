"""Every alert the project ships: identity, meaning, detection expression and where it links.

This is the catalog the rule generator renders into ``alert_rules/`` and the bridge reads to rank
root causes. Alerts not listed here (a user's own rules) fall back to their ``category`` label.

``expr`` detects the fault per infrastructure entity only (a GPU, a host, a link); it reads the
normalised series of ``series.py`` and returns just the faulty entities, valued with the measured
figure. The generator wraps it with run attribution according to ``scope`` (contract 2), copying
``copy_labels`` (e.g. ``xid``, ``device``/``port``) onto the attributed alert. Alerts of scope
``run`` already carry the run labels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from wandb_infra.catalog import selfmetrics as m
from wandb_infra.catalog import series as s
from wandb_infra.catalog.vocabulary import CATEGORY_DEFAULT_CAUSE, CauseClass
from wandb_infra.catalog.xid import XidClass, known_regex
from wandb_infra.catalog.xid import regex as xid_regex
from wandb_infra.common import labels as L

SCOPES: tuple[str, ...] = ("gpu", "host", "link", "run", "pipeline")

# Thresholds (DCGM health-watch defaults and common policy; see gpu-faults.md).
TEMP_WARNING_C = 85
TEMP_CRITICAL_C = 95
THERMAL_VIOLATION_RATIO = 0.10
POWER_VIOLATION_RATIO = 0.25
PCIE_REPLAYS_PER_MINUTE = 16
NVLINK_CRC_FAIL_PER_SECOND = 100
RETIRED_PAGES_LIMIT = 63
UNCORRECTABLE_ROWS_LIMIT = 512
SBE_STORM_PER_10M = 100
IB_PHYSICAL_ERRORS_PER_SECOND = 0.1
STALL_ACTIVITY_MAX = 0.02
STALL_PRIOR_ACTIVITY_MIN = 0.2
STALL_FB_MIN_BYTES = 1024**3
STRAGGLER_GAP = 0.10
STRAGGLER_RUN_BUSY_MIN = 0.5
SOURCE_STALE_SECONDS = 900
DELIVERY_BACKLOG_SECONDS = 600

_ON_GPU = f"{L.HOSTNAME}, {L.GPU}"
_WHERE_GPU = "GPU {{ $labels.gpu }} on {{ $labels.hostname }}"
_WHERE_LINK = "{{ $labels.device }} port {{ $labels.port }} on {{ $labels.hostname }}"
# A whole-number reading (a count from increase(), a temperature, a state or bitmask), printed
# rounded: increase() extrapolates, and "1.069182704323919 error(s)" helps nobody.
_WHOLE = '{{ $value | printf "%.0f" }}'


@dataclass(frozen=True)
class AlertDef:
    """One alert. ``scope`` names the entity it is raised on: gpu, host, link, run, or pipeline
    (this project's own exporter and bridge; never attributed to a run)."""

    name: str
    severity: str
    category: str
    cause: CauseClass
    scope: str
    summary: str
    description: str
    impact: str
    remediation: str
    panel: str
    expr: str = ""
    for_: str = "0s"
    keep_firing_for: str = ""
    extra_labels: dict[str, str] = field(default_factory=dict)
    copy_labels: tuple[str, ...] = ()
    group: str = ""

    @property
    def for_seconds(self) -> int:
        """The rule's ``for`` in seconds (how long after its onset an alert fires)."""
        return round(duration_seconds(self.for_ or "0s"))


ALERTS: dict[str, AlertDef] = {}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800,
                 "y": 31536000}


def duration_seconds(text: str) -> float:
    """A Prometheus duration such as ``1m30s`` in seconds; ValueError when it is not one."""
    if not text or _DURATION.sub("", text):
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in _DURATION.findall(text))


def register(*defs: AlertDef) -> None:
    """Add alert definitions; a duplicate name is a bug in the catalog."""
    for d in defs:
        if d.name in ALERTS:
            raise ValueError(f"duplicate alert {d.name}")
        ALERTS[d.name] = d


def cause_of(alertname: str, category: str | None) -> CauseClass:
    """The cause class of an alert: from the catalog, else from its category, else a symptom."""
    known = ALERTS.get(alertname)
    if known is not None:
        return known.cause
    return CATEGORY_DEFAULT_CAUSE.get(category or "", CauseClass.SYMPTOM)


def _xid(cls: XidClass) -> str:
    return f'{s.XID_EVENTS}{{xid=~"{xid_regex(cls)}"}}'


_XID_DESC = (f"XID {{{{ $labels.xid }}}} on {_WHERE_GPU} "
             f"({_WHOLE} event(s) in the last 10-15 minutes).")


def _down(selector: str = "") -> str:
    """Hosts whose telemetry target is down now or gone within the hour (value 0, as ``up``)."""
    return f"({s.TARGET_DOWN}{selector} or ({s.TARGET_VANISHED}{selector} * 0))"


_DOWN, _DOWN_NODE = _down(), _down(f'{{{s.TARGET_LABEL}="node_exporter"}}')
_H, _T, _I = "gpu_hardware", "gpu_thermal", "gpu_interconnect"
_HW, _DEG, _LINK = CauseClass.HARDWARE, CauseClass.DEGRADATION, CauseClass.LINK_LOSS
_CHECKPOINT = ("Restart the job from its last checkpoint on healthy nodes; exclude this node "
               "(Slurm --exclude, Kubernetes cordon) until the GPU is reset or replaced.")

register(
    # --- XID errors -------------------------------------------------------------------------
    AlertDef(
        "GpuXidError", "critical", _H, _HW, "gpu",
        "A GPU reported a hardware XID error that ends training jobs.",
        _XID_DESC,
        "The GPU hit a hardware or firmware fault; a synchronous training job using it crashes "
        "or hangs in its next collective.",
        _CHECKPOINT + " Reset the GPU (nvidia-smi -r) or drain the node; repeated XIDs mean RMA.",
        "xid_errors", _xid(XidClass.HARDWARE), copy_labels=("xid",), group="gpu-xid"),
    AlertDef(
        "GpuContainedEccError", "critical", _H, _HW, "gpu",
        "A GPU had a contained ECC error (XID 94).",
        f"Contained uncorrectable ECC error (XID 94) on {_WHERE_GPU} "
        f"({_WHOLE} event(s)).",
        "The process using the affected memory was killed, so the whole synchronous job fails "
        "(other ranks then report NCCL errors). The GPU itself stays usable.",
        "Restart the job from its last checkpoint; the node can stay in service. Reset the GPU "
        "at the next opportunity to remap the row.",
        "xid_errors", f'{s.XID_EVENTS}{{xid="94"}}', copy_labels=("xid",), group="gpu-xid"),
    AlertDef(
        "GpuUncontainedEccError", "critical", _H, _HW, "gpu",
        "A GPU had an uncontained ECC error (XID 95).",
        f"Uncontained uncorrectable ECC error (XID 95) on {_WHERE_GPU} "
        f"({_WHOLE} event(s)).",
        "Memory corruption could not be contained: every process on the GPU is killed and the "
        "job crashes; the GPU is unusable until reset.",
        _CHECKPOINT + " Reset the GPU before reuse.",
        "xid_errors", f'{s.XID_EVENTS}{{xid="95"}}', copy_labels=("xid",), group="gpu-xid"),
    AlertDef(
        "GpuXidApplicationError", "warning", "workload", _DEG, "gpu",
        "A GPU reported an application-caused XID error.",
        _XID_DESC,
        "The training process made an illegal GPU access or its kernel failed; the job usually "
        "crashed. This points at the code or its inputs, not at the machine.",
        "Check the job's logs for the failing kernel (illegal address, out-of-bounds); fix and "
        "restart from the last checkpoint. No hardware action.",
        "xid_errors", _xid(XidClass.APPLICATION), copy_labels=("xid",), group="gpu-xid"),
    AlertDef(
        "GpuXidInformational", "info", _H, CauseClass.SYMPTOM, "gpu",
        "A GPU reported an informational XID.",
        _XID_DESC,
        "None by itself: the driver recorded a handled event (row remap, SBE rate, cleanup "
        "after another XID).",
        "Nothing now. If it follows another XID, act on that one; reset the GPU at the next "
        "maintenance window to apply pending remaps.",
        "xid_errors", _xid(XidClass.INFORMATIONAL), copy_labels=("xid",), group="gpu-xid"),
    AlertDef(
        "GpuXidUnclassified", "warning", _H, _HW, "gpu",
        "A GPU reported an XID error the catalog does not know.",
        _XID_DESC,
        "Unknown: look the code up in NVIDIA's XID catalog; most unlisted XIDs end the job.",
        "Look up the XID in NVIDIA's catalog and add it to catalog/xid.py.",
        "xid_errors", f'{s.XID_EVENTS}{{xid!~"{known_regex()}"}}', copy_labels=("xid",),
        group="gpu-xid"),
    AlertDef(
        "GpuFallenOffBus", "critical", _H, _HW, "gpu",
        "A GPU has fallen off the bus.",
        f"{_WHERE_GPU} stopped responding: XID 79, or its metrics vanished while the host "
        "still reports other GPUs.",
        "The GPU is gone from the PCIe bus: every process on it died and the job crashed or "
        "hangs. Other GPUs of the node may follow.",
        _CHECKPOINT + " Reboot the node; if it recurs, open a hardware ticket.",
        "gpu_count",
        f'max by ({_ON_GPU}, {L.GPU_UUID}) ({s.XID_EVENTS}{{xid="79"}}) or {s.GPU_VANISHED}',
        for_="1m", group="gpu-xid"),
    # --- memory ---------------------------------------------------------------------------
    AlertDef(
        "GpuDoubleBitEccErrors", "critical", _H, _HW, "gpu",
        "A GPU reported double-bit (uncorrectable) ECC errors.",
        f"{_WHOLE} double-bit ECC error(s) on {_WHERE_GPU} in the last 10 minutes.",
        "Uncorrectable memory errors kill the processes that touched the memory; the job "
        "crashes.",
        _CHECKPOINT,
        "ecc_errors", f"{s.ECC_DBE} > 0", group="gpu-memory"),
    AlertDef(
        "GpuSingleBitEccStorm", "warning", _H, _DEG, "gpu",
        "A GPU reports a storm of single-bit ECC errors.",
        f"{_WHOLE} corrected single-bit ECC errors on {_WHERE_GPU} in 10 minutes.",
        "Corrected errors do not stop the job, but a storm often precedes an uncorrectable "
        "error.",
        "Keep the job running, checkpoint more often; schedule a GPU reset and field diagnosis.",
        "ecc_errors", f"{s.ECC_SBE} > {SBE_STORM_PER_10M}", for_="5m", group="gpu-memory"),
    AlertDef(
        "GpuMemoryRetirementLimit", "warning", _H, _HW, "gpu",
        "A GPU has retired or remapped more memory than DCGM allows.",
        f"{_WHERE_GPU} is over DCGM's memory retirement limit (value {_WHOLE}: "
        f"retired pages >= {RETIRED_PAGES_LIMIT} or uncorrectable remapped rows >= "
        f"{UNCORRECTABLE_ROWS_LIMIT}).",
        "No immediate effect, but the GPU is likely to fail with uncorrectable errors.",
        "Drain the node when the job ends and request a GPU replacement (RMA).",
        "row_remap",
        f"{s.RETIRED_PAGES} >= {RETIRED_PAGES_LIMIT} "
        f"or {s.UNCORRECTABLE_ROWS} >= {UNCORRECTABLE_ROWS_LIMIT}", for_="5m",
        group="gpu-memory"),
    AlertDef(
        "GpuRowRemapFailure", "critical", _H, _HW, "gpu",
        "A GPU failed to remap a faulty memory row.",
        f"Row remapping failed on {_WHERE_GPU} (value {_WHOLE}).",
        "Faulty memory stays in use: uncorrectable errors and crashes are likely for any job on "
        "this GPU.",
        _CHECKPOINT + " Drain the node and request a GPU replacement.",
        "row_remap", f"{s.ROW_REMAP_FAILURE} > 0", group="gpu-memory"),
    AlertDef(
        "GpuRowRemapPending", "warning", _H, _DEG, "gpu",
        "A GPU needs a reset to apply pending row remaps or page retirements.",
        f"{_WHOLE} pending row remap(s) or page retirement(s) on {_WHERE_GPU}.",
        "None right now; the faulty memory is only fenced off after a GPU reset.",
        "Let the job finish, then reset the GPU (nvidia-smi -r) or reboot the node.",
        "row_remap", f"{s.ROW_REMAP_PENDING} > 0 or {s.RETIRED_PENDING} > 0", for_="5m",
        group="gpu-memory"),
    # --- thermal and power -------------------------------------------------------------------
    AlertDef(
        "GpuThermalViolation", "warning", _T, _DEG, "gpu",
        "A GPU is being throttled for heat.",
        f"{_WHERE_GPU} was thermally throttled {{{{ $value | humanizePercentage }}}} of the "
        "last 5 minutes (100% when read from the HW thermal/slowdown clock-event bits).",
        "The GPU runs at reduced clocks, and in synchronous training every other GPU waits for "
        "it: throughput (MFU) of the whole job drops.",
        "Check the node's cooling (fans, inlet temperature, airflow); move the job off the node "
        "if it persists.",
        "thermal_violation",
        f"{s.THERMAL_VIOLATION} > {THERMAL_VIOLATION_RATIO} "
        f"or ((floor({s.CLOCK_EVENT_REASONS} / 64) % 2 == 1 "
        f"or floor({s.CLOCK_EVENT_REASONS} / 8) % 2 == 1) "
        f"unless on ({_ON_GPU}) {s.THERMAL_VIOLATION})",
        for_="5m", group="gpu-thermal"),
    AlertDef(
        "GpuPowerBrake", "warning", _T, _DEG, "gpu",
        "A GPU is slowed by the hardware power brake.",
        f"The HW power brake clock-event bit is set on {_WHERE_GPU} (bitmask "
        f"{_WHOLE}).",
        "An external power-brake signal (PSU or rack power problem) cuts the GPU's clocks: the "
        "whole job slows down.",
        "Check the node's power supplies and rack power; move the job if it persists.",
        "clock_events",
        f"{s.CLOCK_EVENT_REASONS} and floor({s.CLOCK_EVENT_REASONS} / 128) % 2 == 1", for_="1m",
        group="gpu-thermal"),
    AlertDef(
        "GpuPowerThrottled", "info", _T, _DEG, "gpu",
        "A GPU spends much of its time at its power limit.",
        f"{_WHERE_GPU} was power-throttled {{{{ $value | humanizePercentage }}}} of the last "
        "5 minutes.",
        "The GPU runs below its maximum clocks; expected for some workloads, a slowdown if new.",
        "Nothing unless throughput dropped; then check power capping (nvidia-smi -q -d POWER).",
        "power_violation", f"{s.POWER_VIOLATION} > {POWER_VIOLATION_RATIO}", for_="10m",
        group="gpu-thermal"),
    AlertDef(
        "GpuTemperatureHigh", "warning", _T, _DEG, "gpu",
        "A GPU is running hot.",
        f"{_WHERE_GPU} is at {_WHOLE} C (warning at {TEMP_WARNING_C} C).",
        "Close to throttling: the job may slow down soon.",
        "Check cooling and inlet temperature; no action on the job yet.",
        "gpu_temperature", f"{s.GPU_TEMP_HOT} >= {TEMP_WARNING_C} < {TEMP_CRITICAL_C}", for_="5m",
        group="gpu-thermal"),
    AlertDef(
        "GpuTemperatureCritical", "critical", _T, _DEG, "gpu",
        "A GPU is critically hot.",
        f"{_WHERE_GPU} is at {_WHOLE} C (critical at {TEMP_CRITICAL_C} C).",
        "The GPU is throttling hard and may shut down to protect itself, crashing the job.",
        "Checkpoint now; move the job off the node and fix cooling before reuse.",
        "gpu_temperature", f"{s.GPU_TEMP_HOT} >= {TEMP_CRITICAL_C}", for_="1m",
        group="gpu-thermal"),
    AlertDef(
        "GpuMemoryTemperatureHigh", "warning", _T, _DEG, "gpu",
        "A GPU's HBM memory is running hot.",
        f"HBM of {_WHERE_GPU} is at {_WHOLE} C (warning at {TEMP_WARNING_C} C).",
        "Hot HBM throttles memory bandwidth and raises the ECC error rate.",
        "Check cooling and inlet temperature.",
        "hbm_temperature", f"{s.MEMORY_TEMP_HOT} >= {TEMP_WARNING_C} < {TEMP_CRITICAL_C}",
        for_="5m", group="gpu-thermal"),
    AlertDef(
        "GpuMemoryTemperatureCritical", "critical", _T, _DEG, "gpu",
        "A GPU's HBM memory is critically hot.",
        f"HBM of {_WHERE_GPU} is at {_WHOLE} C (critical at {TEMP_CRITICAL_C} C).",
        "Memory errors and a protective shutdown are likely; the job may crash.",
        "Checkpoint now; move the job off the node and fix cooling before reuse.",
        "hbm_temperature", f"{s.MEMORY_TEMP_HOT} >= {TEMP_CRITICAL_C}", for_="1m",
        group="gpu-thermal"),
    # --- interconnect ----------------------------------------------------------------------
    AlertDef(
        "GpuNvlinkErrors", "warning", _I, _DEG, "gpu",
        "A GPU's NVLink shows CRC errors.",
        f"NVLink CRC errors on {_WHERE_GPU}: {{{{ $value | humanize }}}}/s.",
        "Packets are retransmitted: collectives over NVLink slow down; a degrading link may "
        "fail.",
        "Watch it; if it persists, drain the node after the job and run the NVLink diagnosis "
        "(dcgmi diag -r 3).",
        "nvlink_errors",
        f"{s.NVLINK_CRC_RATE} > 0 unless on ({_ON_GPU}) "
        f"({s.NVLINK_REPLAY_RECOVERY} > 0 or {s.NVLINK_CRC_RATE} >= {NVLINK_CRC_FAIL_PER_SECOND})",
        for_="2m", group="gpu-interconnect"),
    AlertDef(
        "GpuNvlinkFailure", "critical", _I, _LINK, "gpu",
        "A GPU's NVLink is failing (replay or recovery errors).",
        f"NVLink replay/recovery errors or a CRC storm on {_WHERE_GPU} (value "
        "{{ $value | humanize }}).",
        "NVLink replays and recoveries stall collectives; NCCL jobs hang or crash.",
        _CHECKPOINT + " Run the NVLink diagnosis; reseat or replace the GPU/NVSwitch tray.",
        "nvlink_errors",
        f"{s.NVLINK_REPLAY_RECOVERY} > 0 or {s.NVLINK_CRC_RATE} >= {NVLINK_CRC_FAIL_PER_SECOND}",
        group="gpu-interconnect"),
    AlertDef(
        "GpuPcieReplayRate", "warning", _I, _DEG, "gpu",
        "A GPU's PCIe link replays packets too often.",
        f"{_WHERE_GPU} replays {{{{ $value | humanize }}}} PCIe packets per minute "
        f"(DCGM warns above {PCIE_REPLAYS_PER_MINUTE}).",
        "Host-device transfers (data loading, offload) slow down; the link may fail and the GPU "
        "fall off the bus.",
        "Drain the node after the job; check the riser/slot and link speed (nvidia-smi -q).",
        "pcie_replays", f"{s.PCIE_REPLAY_RATE} * 60 > {PCIE_REPLAYS_PER_MINUTE}", for_="5m",
        group="gpu-interconnect"),
    # --- network ----------------------------------------------------------------------------
    AlertDef(
        "InfinibandLinkDown", "critical", "network", _LINK, "link",
        "An InfiniBand port that was active went down.",
        f"InfiniBand {_WHERE_LINK} is in state {_WHOLE} (4 = active) after being "
        "active within the last hour.",
        "Inter-node collectives over this port fail: multi-node jobs on the node hang until "
        "the NCCL timeout, then crash.",
        _CHECKPOINT + " Check the cable, transceiver and switch port.",
        "ib_link_state",
        f"{s.IB_PORT_DOWN} unless on ({L.HOSTNAME}, device, port) {s.IB_PORT_IDLE_1H}",
        for_="1m", copy_labels=("device", "port"), group="network"),
    AlertDef(
        "InfinibandLinkFlapping", "warning", "network", _LINK, "link",
        "An InfiniBand port is flapping.",
        f"InfiniBand {_WHERE_LINK} went down or recovered {{{{ $value | humanize }}}} times in "
        "15 minutes.",
        "Each flap stalls inter-node collectives; NCCL may time out and crash the job.",
        "Check the cable and transceiver; drain the node if it keeps flapping.",
        "ib_errors", f"{s.IB_FLAPS} >= 2", copy_labels=("device", "port"), group="network"),
    AlertDef(
        "InfinibandPhysicalErrors", "warning", "network", _DEG, "link",
        "An InfiniBand port shows physical-layer errors.",
        f"InfiniBand {_WHERE_LINK}: {{{{ $value | humanize }}}} symbol/link-integrity/remote "
        "physical errors per second.",
        "Retransmissions slow inter-node collectives; the link may go down.",
        "Check or replace the cable and transceiver at the next opportunity.",
        "ib_errors", f"{s.IB_PHYSICAL_ERRORS} > {IB_PHYSICAL_ERRORS_PER_SECOND}", for_="5m",
        copy_labels=("device", "port"), group="network"),
    AlertDef(
        "NetworkInterfaceDown", "critical", "network", _LINK, "link",
        "A network interface that was up went down.",
        "Interface {{ $labels.device }} on {{ $labels.hostname }} is down (was up within the "
        f"last hour; value {_WHOLE}).",
        "Traffic over this interface (RoCE collectives, storage, data loading) stops; the job "
        "may hang or crash.",
        _CHECKPOINT + " Check the cable, NIC and switch port.",
        "net_interfaces",
        f"{s.NET_DOWN} unless on ({L.HOSTNAME}, device) {s.NET_IDLE_1H}",
        for_="1m", copy_labels=("device",), group="network"),
    AlertDef(
        "NetworkInterfaceFlapping", "warning", "network", _LINK, "link",
        "A network interface's carrier is flapping.",
        "Interface {{ $labels.device }} on {{ $labels.hostname }} changed carrier "
        "{{ $value | humanize }} times in 15 minutes.",
        "Each flap interrupts RoCE/Ethernet traffic; collectives may time out.",
        "Check the cable, transceiver and switch port.",
        "net_interfaces", f"{s.NET_CARRIER_CHANGES} >= 4", copy_labels=("device",),
        group="network"),
    # --- node -------------------------------------------------------------------------------
    AlertDef(
        "NodeDown", "critical", "node", CauseClass.NODE_LOSS, "host",
        "A node's telemetry target is down.",
        "The {{ $labels.exporter }} target of {{ $labels.hostname }} is down or gone "
        f"(up = {_WHOLE}).",
        "The node is unreachable or its telemetry died: if the node is down, the job's ranks "
        "on it are gone and the job crashes or hangs; silence here is not health.",
        "Check whether the node is alive (ping, BMC). If it is down, restart the job from its "
        "last checkpoint without it; if only the exporter died, restart the exporter.",
        "targets_up",
        # one series per host: node_exporter's when both are down (the host itself), so the
        # alert's labels do not depend on which of two equal values topk keeps
        f"{_DOWN_NODE} or ({_DOWN} unless on ({L.HOSTNAME}) {_DOWN_NODE})",
        for_="2m", copy_labels=(s.TARGET_LABEL,), group="node"),
    AlertDef(
        "NodeGpuCountDropped", "critical", _H, _HW, "host",
        "A node reports fewer GPUs than it had.",
        f"{{{{ $labels.hostname }}}} reports {_WHOLE} GPU(s) fewer than in the last hour.",
        "A GPU disappeared (fallen off the bus or failed): jobs using it crashed; new jobs "
        "get fewer GPUs.",
        _CHECKPOINT + " Reboot the node; open a hardware ticket if the GPU does not return.",
        "gpu_count",
        s.HOST_GPU_COUNT_DROP, for_="2m",
        group="node"),
    # --- workload ---------------------------------------------------------------------------
    AlertDef(
        "TrainingStalled", "warning", "workload", CauseClass.SYMPTOM, "run",
        "A training run stopped computing on a node while holding GPU memory.",
        "Tensor activity of the run's GPUs on {{ $labels.hostname }} fell to "
        "{{ $value | humanizePercentage }} while their memory stays allocated, after being "
        "active in the last hour.",
        "The job is hung (typically a collective waiting for a dead or slow peer: the NCCL-hang "
        "signature); it burns GPU hours without progress until the NCCL watchdog kills it.",
        "Look for a hardware or network alert on the run's other nodes (the likely cause); if "
        "none, dump stacks (py-spy) and restart from the last checkpoint.",
        "tensor_activity",
        s.RUN_HOST_STALLED,
        for_="5m", group="workload"),
    AlertDef(
        "TrainingStraggler", "warning", "workload", CauseClass.SYMPTOM, "run",
        "A GPU of a training run is much less busy than the run's others.",
        "GPU {{ $labels.gpu }} on {{ $labels.hostname }} averaged "
        "{{ $value | humanizePercentage }} utilisation over 2 minutes, more than "
        f"{int(STRAGGLER_GAP * 100)} points below the run's busiest GPU.",
        "The run's GPUs are out of step: synchronous training runs at the pace of the slowest "
        "rank.",
        "Look for thermal, power, PCIe or NVLink alerts on that GPU; if none, check the data "
        "loader and CPU of that rank.",
        "gpu_util_spread",
        s.RUN_GPU_STRAGGLING,
        for_="3m", group="workload"),
)


# --- pipeline: this project's own path from scheduler to W&B -------------------------------------
# A target that exposed the exporter's (or the bridge's) own metrics within the hour and is down
# now: found by what it served, so no scrape job name has to be configured.
def _down_target(served: str) -> str:
    return f"up == 0 and on (instance, job) max_over_time({served}[1h])"


register(
    AlertDef(
        name="WandbInfraExporterSourceDown", severity="warning", category="pipeline",
        cause=CauseClass.SYMPTOM, scope="pipeline",
        summary="An exporter source (Slurm, Kubernetes, W&B, registrations) fails to poll.",
        description="Source {{ $labels.source }} of the exporter at {{ $labels.instance }} "
                    f"failed its last polls (source_up = {_WHOLE}).",
        impact="Runs that only this source knows keep their last mapping for the grace period, "
               "then lose their run labels: new faults on their hosts reach no W&B run.",
        remediation="Read the exporter's log for the source's error (permissions, command "
                    "missing, API unreachable) and fix it; the source recovers by itself.",
        panel="pipeline_sources",
        expr=f"max by (instance, job, source) ({m.EXPORTER_SOURCE_UP}) == 0",
        for_="5m", group="pipeline"),
    AlertDef(
        name="WandbInfraExporterSourceStale", severity="warning", category="pipeline",
        cause=CauseClass.SYMPTOM, scope="pipeline",
        summary="An exporter source has not polled successfully for a long time.",
        description="Source {{ $labels.source }} of the exporter at {{ $labels.instance }} last "
                    "succeeded {{ $value | humanizeDuration }} ago.",
        impact="The run-to-host map is out of date: finished runs may be blamed for new faults "
               "and new runs get none.",
        remediation="Check that the source's command or API answers within its timeout (a "
                    "source that never succeeded is down, not stale).",
        panel="pipeline_sources",
        # 0 = never polled: a polled source is down until its first success, and the
        # registration API is pushed to, not polled.
        expr=f"time() - max by (instance, job, source) ({m.EXPORTER_SOURCE_LAST_SUCCESS} > 0) "
             f"> {SOURCE_STALE_SECONDS}",
        for_="5m", group="pipeline"),
    AlertDef(
        name="WandbInfraExporterDown", severity="critical", category="pipeline",
        cause=CauseClass.SYMPTOM, scope="pipeline",
        summary="Prometheus cannot scrape the run-to-host exporter.",
        description="The exporter target {{ $labels.instance }} (job {{ $labels.job }}) is down "
                    f"(up = {_WHOLE}).",
        impact="The join metrics go stale within 5 minutes: every fault then alerts without run "
               "labels and no W&B run gets its issues.",
        remediation="Restart the exporter (its registrations survive in its state file); check "
                    "its port, TLS and the scrape config.",
        panel="pipeline_targets",
        expr=_down_target(m.EXPORTER_HOSTS),
        for_="2m", group="pipeline"),
    AlertDef(
        name="WandbInfraJoinMetricsMissing", severity="warning", category="pipeline",
        cause=CauseClass.SYMPTOM, scope="pipeline",
        summary="GPUs are busy but no W&B run is mapped to any host.",
        description=f"{_WHOLE} GPUs hold memory, and no wandb_run_node_info series exists.",
        impact="Faults are detected but attributed to no run: W&B users see nothing.",
        remediation="Check that the exporter runs, is scraped, and that its sources find the "
                    "jobs (the Slurm comment or Kubernetes label convention in the README).",
        panel="pipeline_targets",
        expr=f"count({s.dcgm_raw(s.DCGM_FB_USED, cut=f' > {STALL_FB_MIN_BYTES}')}) > 0 "
             f"and on () absent({L.NODE_INFO})",
        for_="15m", group="pipeline-coverage"),
    AlertDef(
        name="WandbInfraBridgeDown", severity="critical", category="pipeline",
        cause=CauseClass.SYMPTOM, scope="pipeline",
        summary="Prometheus cannot scrape the Alertmanager-to-W&B bridge.",
        description="The bridge target {{ $labels.instance }} (job {{ $labels.job }}) is down "
                    f"(up = {_WHOLE}).",
        impact="Alertmanager retries its notifications, then gives up: issues stop reaching "
               "W&B runs until the bridge is back.",
        remediation="Restart the bridge; its store keeps what it acknowledged. Check its volume "
                    "and the bearer token file.",
        panel="pipeline_targets",
        expr=_down_target(m.BRIDGE_QUEUE_RUNS),
        for_="2m", group="pipeline"),
    AlertDef(
        name="WandbInfraRunsParked", severity="warning", category="pipeline",
        cause=CauseClass.SYMPTOM, scope="pipeline",
        summary="The bridge parked runs it cannot write to W&B.",
        description=f"{_WHOLE} run(s) parked by the bridge at {{{{ $labels.instance }}}}.",
        impact="Those runs' issues are kept and shown on the bridge's /runs page but not in W&B.",
        remediation="Open the bridge's /runs page for each run's reason (key revoked, run "
                    "deleted, permission) and fix it; parked runs are retried after.",
        panel="pipeline_delivery",
        expr=f"max by (instance, job) ({m.BRIDGE_PARKED_RUNS}) > 0",
        for_="10m", group="pipeline"),
    AlertDef(
        name="WandbInfraDeliveryBacklog", severity="warning", category="pipeline",
        cause=CauseClass.SYMPTOM, scope="pipeline",
        summary="The bridge has not delivered an issue to W&B for a long time.",
        description="The oldest undelivered change at the bridge {{ $labels.instance }} is "
                    "{{ $value | humanizeDuration }} old.",
        impact="W&B shows issues late or not at all while the backlog lasts.",
        remediation="Check W&B reachability and rate limits (429s in the bridge's log and "
                    "metrics) and the bridge's CPU.",
        panel="pipeline_delivery",
        expr=f"max by (instance, job) ({m.BRIDGE_OLDEST_UNDELIVERED}) "
             f"> {DELIVERY_BACKLOG_SECONDS}",
        for_="5m", group="pipeline"),
    AlertDef(
        name="WandbInfraBridgeStoreNotWritable", severity="critical", category="pipeline",
        cause=CauseClass.SYMPTOM, scope="pipeline",
        summary="The bridge cannot write its store.",
        description="The bridge at {{ $labels.instance }} cannot write its state store "
                    f"(store_writable = {_WHOLE}).",
        impact="It answers Alertmanager 503, so notifications wait in Alertmanager's retries "
               "and are lost once those end.",
        remediation="Free or remount the bridge's volume (full, read-only or missing); it heals "
                    "by itself once writes succeed.",
        panel="pipeline_delivery",
        expr=f"min by (instance, job) ({m.BRIDGE_STORE_WRITABLE}) == 0",
        for_="1m", group="pipeline"),
)
