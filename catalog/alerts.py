"""Every alert the project ships: identity, meaning, detection expression and where it links.

This is the catalog the rule generator renders into ``alert_rules/`` and the bridge reads to rank
root causes. Alerts not listed here (a user's own rules) fall back to their ``category`` label.

``condition`` is a PromQL template that detects the fault per infrastructure entity only (a GPU,
a host, a link); it reads the normalised series of ``series.py`` and returns just the faulty
entities, valued with the measured figure. Its placeholders (``${ECC_DBE}``,
``${TEMP_WARNING_C}``) name a record of ``series.RECORDS`` or an entry of ``TEMPLATE_VALUES``
(thresholds, clock bits, XID sets, this project's own metrics); the generator substitutes them and
nothing else (``expr`` is that plain substitution, which the runbook shows). The generator wraps it
with run attribution according to ``scope`` (contract 2), copying ``copy_labels`` (e.g. ``xid``,
``device``/``port``) onto the attributed alert. Alerts of scope ``run`` already carry the run
labels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from wandb_infra.catalog import host_alerts
from wandb_infra.catalog import selfmetrics as m
from wandb_infra.catalog import series as s
from wandb_infra.catalog.recovery import DRIVER_ACTIONS, Action
from wandb_infra.catalog.series import span
from wandb_infra.catalog.template import fill
from wandb_infra.catalog.vocabulary import CATEGORY_DEFAULT_CAUSE, CauseClass
from wandb_infra.catalog.xid import XidClass, known_regex
from wandb_infra.catalog.xid import regex as xid_regex
from wandb_infra.common import labels as L
from wandb_infra.common import nodestate

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
SBE_STORM_PER_WINDOW = 100  # corrected single-bit errors per WEAR_WINDOW
IB_PHYSICAL_ERRORS_PER_SECOND = 0.1
IB_FLAPS_MIN = 2  # link downs or error recoveries per FLAP_WINDOW
CARRIER_CHANGES_MIN = 4  # carrier changes per FLAP_WINDOW (one flap is a down and an up)
STALL_ACTIVITY_MAX = 0.02
STALL_PRIOR_ACTIVITY_MIN = 0.2
STALL_FB_MIN_BYTES = 1024**3
STRAGGLER_GAP = 0.10
STRAGGLER_RUN_BUSY_MIN = 0.5
SOURCE_STALE_SECONDS = 900
DELIVERY_BACKLOG_SECONDS = 600

# Everything but the records that a template may name (records: ``series.RECORDS``).
TEMPLATE_VALUES: dict[str, str | int | float] = {
    "TEMP_WARNING_C": TEMP_WARNING_C,
    "TEMP_CRITICAL_C": TEMP_CRITICAL_C,
    "THERMAL_VIOLATION_RATIO": THERMAL_VIOLATION_RATIO,
    "POWER_VIOLATION_RATIO": POWER_VIOLATION_RATIO,
    "PCIE_REPLAYS_PER_MINUTE": PCIE_REPLAYS_PER_MINUTE,
    "NVLINK_CRC_FAIL_PER_SECOND": NVLINK_CRC_FAIL_PER_SECOND,
    "RETIRED_PAGES_LIMIT": RETIRED_PAGES_LIMIT,
    "UNCORRECTABLE_ROWS_LIMIT": UNCORRECTABLE_ROWS_LIMIT,
    "SBE_STORM_PER_WINDOW": SBE_STORM_PER_WINDOW,
    "IB_PHYSICAL_ERRORS_PER_SECOND": IB_PHYSICAL_ERRORS_PER_SECOND,
    "IB_FLAPS_MIN": IB_FLAPS_MIN,
    "CARRIER_CHANGES_MIN": CARRIER_CHANGES_MIN,
    "STALL_FB_MIN_MIB": STALL_FB_MIN_BYTES // 2**20,
    "SOURCE_STALE_SECONDS": SOURCE_STALE_SECONDS,
    "DELIVERY_BACKLOG_SECONDS": DELIVERY_BACKLOG_SECONDS,
    "CLOCK_HW_SLOWDOWN": s.CLOCK_HW_SLOWDOWN,
    "CLOCK_HW_THERMAL": s.CLOCK_HW_THERMAL,
    "CLOCK_HW_POWER_BRAKE": s.CLOCK_HW_POWER_BRAKE,
    "HISTORY_WINDOW": s.HISTORY_WINDOW,
    "TARGET_LABEL": s.TARGET_LABEL,
    "XID_HARDWARE": xid_regex(XidClass.HARDWARE),
    "XID_APPLICATION": xid_regex(XidClass.APPLICATION),
    "XID_INFORMATIONAL": xid_regex(XidClass.INFORMATIONAL),
    "XID_DECODE": xid_regex(XidClass.DECODE),
    "XID_KNOWN": known_regex(),
    "NODE_INFO": L.NODE_INFO,
    "NODE_STATE": nodestate.STATE,
    "EXPORTER_SOURCE_UP": m.EXPORTER_SOURCE_UP,
    "EXPORTER_SOURCE_LAST_SUCCESS": m.EXPORTER_SOURCE_LAST_SUCCESS,
    "EXPORTER_HOSTS": m.EXPORTER_HOSTS,
    "BRIDGE_QUEUE_RUNS": m.BRIDGE_QUEUE_RUNS,
    "BRIDGE_PARKED_RUNS": m.BRIDGE_PARKED_RUNS,
    "BRIDGE_OLDEST_UNDELIVERED": m.BRIDGE_OLDEST_UNDELIVERED,
    "BRIDGE_STORE_WRITABLE": m.BRIDGE_STORE_WRITABLE,
}

# What a condition's placeholders stand for when read as stated (the generator reads records of a
# slow tier through ``last_over_time`` instead; ``alert_rules/tiers.py``).
PLAIN_VALUES: dict[str, str | int | float] = {**s.RECORDS, **TEMPLATE_VALUES}

_WHERE_GPU = "GPU {{ $labels.gpu }} on {{ $labels.hostname }}"
_WHERE_LINK = "{{ $labels.device }} port {{ $labels.port }} on {{ $labels.hostname }}"
# A whole-number reading (a count from increase(), a temperature, a state or bitmask), printed
# rounded: increase() extrapolates, and "1.069182704323919 error(s)" helps nobody.
_WHOLE = '{{ $value | printf "%.0f" }}'


@dataclass(frozen=True, kw_only=True)
class AlertDef:
    """One alert, stated with keywords. ``scope`` names the entity it is raised on: gpu, host,
    link, run, or pipeline (this project's own exporter and bridge; never attributed to a run).
    ``condition`` is the PromQL template described above, ``expr`` its plain text."""

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
    condition: str
    for_: str = "0s"
    keep_firing_for: str = ""
    extra_labels: dict[str, str] = field(default_factory=dict)
    copy_labels: tuple[str, ...] = ()
    group: str = ""
    # What the fault needs before its hardware takes a job again (catalog/recovery.py); None for
    # the XID alerts, whose need is the code's (catalog/xid.py, read from the ``xid`` label).
    needs: Action | None = None
    # True when the alert ending shows the fault itself cleared (a link up again, a temperature
    # back to normal, a pending remap applied); False where it only means time passed (an XID
    # event ages out, an error count leaves its window).
    clears_when_fixed: bool = False

    @property
    def expr(self) -> str:
        """The condition as the catalog states it: records named, thresholds filled in."""
        return fill(self.condition, PLAIN_VALUES)

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


_XID_SPAN = (f"{span(s.XID_RECENT).split()[0]}-"
             f"{round(duration_seconds(s.XID_RECENT) + duration_seconds(s.XID_COUNT_WINDOW)) // 60}"
             " minutes")
_XID_DESC = (f"XID {{{{ $labels.xid }}}} on {_WHERE_GPU} "
             f"({_WHOLE} event(s) in the last {_XID_SPAN}).")
# The host's telemetry down now or gone within the hour (value 0, as ``up``), node_exporter's
# first: one series per host, node_exporter's when both are down (the host itself), so the alert's
# labels do not depend on which of two equal values topk keeps.
_CHECKPOINT = ("Restart the job from its last checkpoint on healthy nodes; exclude this node "
               "(Slurm --exclude, Kubernetes cordon) until the GPU is reset or replaced.")
# A lost link, not a GPU: the node comes back once the link is repaired and stays up.
_CHECKPOINT_LINK = ("Restart the job from its last checkpoint on healthy nodes; exclude this node "
                    "(Slurm --exclude, Kubernetes cordon) until its link is repaired and stays "
                    "up.")
_CHECKPOINT_NOW = "Checkpoint now; move the job off the node and fix cooling before reuse."
# The driver's recovery action, one alert per GPU labelled with the action's name (the rule
# cannot turn a value into a label any other way).
_RECOVERY_ACTION = "\nor\n".join(
    [f'label_replace(${{GPU_RECOVERY_ACTION}} == {value}, "recovery_action", "{name}", "", "")'
     for value, (name, _) in DRIVER_ACTIONS.items() if value]
    + [f'label_replace(${{GPU_RECOVERY_ACTION}} > {max(DRIVER_ACTIONS)}, "recovery_action", '
       '"other", "", "")'])

register(
    # --- XID errors -------------------------------------------------------------------------
    AlertDef(
        name="GpuXidError", severity="critical", category="gpu_hardware",
        cause=CauseClass.HARDWARE, scope="gpu",
        summary="A GPU reported a hardware XID error that ends training jobs.",
        description=_XID_DESC,
        impact="The GPU hit a hardware or firmware fault; a synchronous training job using it "
               "crashes or hangs in its next collective.",
        remediation="Do what NVIDIA's XID catalog says for this code (the runbook's XID table: "
                    "reset the GPU, reboot the node or call support); until it is done, restart "
                    "the job from its last checkpoint without this node. The same code "
                    "repeating on one GPU means a replacement.",
        panel="xid_errors",
        condition='${XID_EVENTS}{xid=~"${XID_HARDWARE}"}',
        copy_labels=("xid",), group="gpu-xid"),
    AlertDef(
        name="GpuXidDecodeRequired", severity="warning", category="gpu_interconnect",
        cause=CauseClass.HARDWARE, scope="gpu",
        summary="A GPU reported an NVLink XID whose fields say what it needs.",
        description=_XID_DESC,
        impact="An NVLink fault: depending on its sub-code it needs nothing, a GPU reset or "
               "more; a job using the link may crash or hang.",
        remediation="Decode the XID's fields (NVIDIA's catalog, 'Xid 144-150 Decode'; "
                    "nvidia-smi nvlink -e for XID 74). Where dcgm-exporter exports the "
                    "driver's recovery action, the bridge follows it.",
        panel="xid_errors",
        condition='${XID_EVENTS}{xid=~"${XID_DECODE}"}',
        copy_labels=("xid",), group="gpu-xid"),
    AlertDef(
        name="GpuRecoveryActionRequired", severity="critical", category="gpu_hardware",
        cause=CauseClass.HARDWARE, scope="gpu",
        summary="The GPU driver says a GPU needs a recovery action.",
        description=f"The driver's recovery action for {_WHERE_GPU} is "
                    "{{ $labels.recovery_action }} (DCGM field 1523 = {{ $value }}).",
        impact="The GPU cannot run work correctly until the action is done; jobs on it fail.",
        remediation="Do the action the driver names (GPU reset: nvidia-smi -r with no process "
                    "on the GPU; node reboot; drain P2P: stop every job on the GPU); restart "
                    "the job without this node until the action clears.",
        panel="xid_errors",
        condition=_RECOVERY_ACTION,
        copy_labels=("recovery_action",), group="gpu-xid",
        needs=Action.FOLLOW_DRIVER, clears_when_fixed=True),
    AlertDef(
        name="GpuContainedEccError", severity="critical", category="gpu_hardware",
        cause=CauseClass.HARDWARE, scope="gpu",
        summary="A GPU had a contained ECC error (XID 94).",
        description=f"Contained uncorrectable ECC error (XID 94) on {_WHERE_GPU} "
                    f"({_WHOLE} event(s)).",
        impact="The process using the affected memory was killed, so the whole synchronous job "
               "fails (other ranks then report NCCL errors). The GPU itself stays usable.",
        remediation="Restart the job from its last checkpoint; the node can stay in service. "
                    "Reset the GPU at the next opportunity to remap the row.",
        panel="xid_errors",
        condition='${XID_EVENTS}{xid="94"}',
        copy_labels=("xid",), group="gpu-xid"),
    AlertDef(
        name="GpuUncontainedEccError", severity="critical", category="gpu_hardware",
        cause=CauseClass.HARDWARE, scope="gpu",
        summary="A GPU had an uncontained ECC error (XID 95).",
        description=f"Uncontained uncorrectable ECC error (XID 95) on {_WHERE_GPU} "
                    f"({_WHOLE} event(s)).",
        impact="Memory corruption could not be contained: every process on the GPU is killed "
               "and the job crashes; the GPU is unusable until reset.",
        remediation=_CHECKPOINT + " Reset the GPU before reuse.",
        panel="xid_errors",
        condition='${XID_EVENTS}{xid="95"}',
        copy_labels=("xid",), group="gpu-xid"),
    AlertDef(
        name="GpuXidApplicationError", severity="warning", category="workload",
        cause=CauseClass.DEGRADATION, scope="gpu",
        summary="A GPU reported an application-caused XID error.",
        description=_XID_DESC,
        impact="The training process made an illegal GPU access or its kernel failed; the job "
               "usually crashed. This points at the code or its inputs, not at the machine.",
        remediation="Check the job's logs for the failing kernel (illegal address, "
                    "out-of-bounds); fix and restart from the last checkpoint. No hardware "
                    "action.",
        panel="xid_errors",
        condition='${XID_EVENTS}{xid=~"${XID_APPLICATION}"}',
        copy_labels=("xid",), group="gpu-xid"),
    AlertDef(
        name="GpuXidInformational", severity="info", category="gpu_hardware",
        cause=CauseClass.SYMPTOM, scope="gpu",
        summary="A GPU reported an informational XID.",
        description=_XID_DESC,
        impact="None by itself: the driver recorded a handled event (row remap, SBE rate, "
               "cleanup after another XID).",
        remediation="Nothing now. If it follows another XID, act on that one; reset the GPU at "
                    "the next maintenance window to apply pending remaps.",
        panel="xid_errors",
        condition='${XID_EVENTS}{xid=~"${XID_INFORMATIONAL}"}',
        copy_labels=("xid",), group="gpu-xid"),
    AlertDef(
        name="GpuXidUnclassified", severity="warning", category="gpu_hardware",
        cause=CauseClass.HARDWARE, scope="gpu",
        summary="A GPU reported an XID error the catalog does not know.",
        description=_XID_DESC,
        impact="Unknown: look the code up in NVIDIA's XID catalog; most unlisted XIDs end the "
               "job.",
        remediation="Look the code up in NVIDIA's XID catalog "
                    "(https://docs.nvidia.com/deploy/xid-errors/) and do its immediate action; "
                    "restart the job without this node until you know.",
        panel="xid_errors",
        condition='${XID_EVENTS}{xid!~"${XID_KNOWN}"}',
        copy_labels=("xid",), group="gpu-xid"),
    AlertDef(
        name="GpuFallenOffBus", severity="critical", category="gpu_hardware",
        cause=CauseClass.HARDWARE, scope="gpu",
        summary="A GPU has fallen off the bus.",
        description=f"{_WHERE_GPU} stopped responding: XID 79, or its metrics vanished while "
                    "the host still reports other GPUs.",
        impact="The GPU is gone from the PCIe bus: every process on it died and the job crashed "
               "or hangs. Other GPUs of the node may follow.",
        remediation=_CHECKPOINT + " Reboot the node; if it recurs, open a hardware ticket.",
        panel="gpu_count",
        condition="""
max by (hostname, gpu, gpu_uuid) (${XID_EVENTS}{xid="79"})
or
${GPU_VANISHED}
""",
        for_="1m", group="gpu-xid",
        needs=Action.REBOOT_NODE),
    # --- memory ---------------------------------------------------------------------------
    AlertDef(
        name="GpuDoubleBitEccErrors", severity="critical", category="gpu_hardware",
        cause=CauseClass.HARDWARE, scope="gpu",
        summary="A GPU reported double-bit (uncorrectable) ECC errors.",
        description=f"{_WHOLE} double-bit ECC error(s) on {_WHERE_GPU} in the last "
                    f"{span(s.WEAR_WINDOW)}.",
        impact="Uncorrectable memory errors kill the processes that touched the memory; the "
               "job crashes.",
        remediation=_CHECKPOINT,
        panel="ecc_errors",
        condition="${ECC_DBE} > 0",
        group="gpu-memory",
        needs=Action.RESET_GPU),
    AlertDef(
        name="GpuSingleBitEccStorm", severity="warning", category="gpu_hardware",
        cause=CauseClass.DEGRADATION, scope="gpu",
        summary="A GPU reports a storm of single-bit ECC errors.",
        description=f"{_WHOLE} corrected single-bit ECC errors on {_WHERE_GPU} in "
                    f"{span(s.WEAR_WINDOW)}.",
        impact="Corrected errors do not stop the job, but a storm often precedes an "
               "uncorrectable error.",
        remediation="Keep the job running, checkpoint more often; schedule a GPU reset and "
                    "field diagnosis.",
        panel="ecc_errors",
        condition="${ECC_SBE} > ${SBE_STORM_PER_WINDOW}",
        for_="5m", group="gpu-memory",
        needs=Action.NONE),
    AlertDef(
        name="GpuMemoryRetirementLimit", severity="warning", category="gpu_hardware",
        cause=CauseClass.HARDWARE, scope="gpu",
        summary="A GPU has retired or remapped more memory than DCGM allows.",
        description=f"{_WHERE_GPU} is over DCGM's memory retirement limit (value {_WHOLE}: "
                    f"retired pages >= {RETIRED_PAGES_LIMIT} or uncorrectable remapped rows >= "
                    f"{UNCORRECTABLE_ROWS_LIMIT}).",
        impact="No immediate effect, but the GPU is likely to fail with uncorrectable errors.",
        remediation="Drain the node when the job ends and request a GPU replacement (RMA).",
        panel="row_remap",
        condition="""
${RETIRED_PAGES} >= ${RETIRED_PAGES_LIMIT}
or
${UNCORRECTABLE_ROWS} >= ${UNCORRECTABLE_ROWS_LIMIT}
""",
        for_="5m", group="gpu-memory",
        needs=Action.REPLACE),
    AlertDef(
        name="GpuRowRemapFailure", severity="critical", category="gpu_hardware",
        cause=CauseClass.HARDWARE, scope="gpu",
        summary="A GPU failed to remap a faulty memory row.",
        description=f"Row remapping failed on {_WHERE_GPU} (value {_WHOLE}).",
        impact="Faulty memory stays in use: uncorrectable errors and crashes are likely for any "
               "job on this GPU.",
        remediation=_CHECKPOINT + " Drain the node and request a GPU replacement.",
        panel="row_remap",
        condition="${ROW_REMAP_FAILURE} > 0",
        group="gpu-memory",
        needs=Action.REPLACE),
    AlertDef(
        name="GpuRowRemapPending", severity="warning", category="gpu_hardware",
        cause=CauseClass.DEGRADATION, scope="gpu",
        summary="A GPU needs a reset to apply pending row remaps or page retirements.",
        description=f"{_WHOLE} pending row remap(s) or page retirement(s) on {_WHERE_GPU}.",
        impact="None right now; the faulty memory is only fenced off after a GPU reset.",
        remediation="Let the job finish, then reset the GPU (nvidia-smi -r) or reboot the node.",
        panel="row_remap",
        condition="${ROW_REMAP_PENDING} > 0 or ${RETIRED_PENDING} > 0",
        for_="5m", group="gpu-memory",
        needs=Action.RESET_GPU, clears_when_fixed=True),
    # --- thermal and power -------------------------------------------------------------------
    AlertDef(
        name="GpuThermalViolation", severity="warning", category="gpu_thermal",
        cause=CauseClass.DEGRADATION, scope="gpu",
        summary="A GPU is being throttled for heat.",
        description=f"{_WHERE_GPU} was thermally throttled {{{{ $value | humanizePercentage }}}}"
                    f" of the last {span(s.VIOLATION_WINDOW)} (100% when read from the HW "
                    "thermal/slowdown clock-event bits).",
        impact="The GPU runs at reduced clocks, and in synchronous training every other GPU "
               "waits for it: throughput (MFU) of the whole job drops.",
        remediation="Check the node's cooling (fans, inlet temperature, airflow); move the job "
                    "off the node if it persists.",
        panel="thermal_violation",
        # The violation counter when dcgm-exporter exports it, else the HW thermal or HW
        # slowdown bit of the clock-event reasons.
        condition="""
${THERMAL_VIOLATION} > ${THERMAL_VIOLATION_RATIO}
or
(
  (
    floor(${CLOCK_EVENT_REASONS} / ${CLOCK_HW_THERMAL}) % 2 == 1
    or
    floor(${CLOCK_EVENT_REASONS} / ${CLOCK_HW_SLOWDOWN}) % 2 == 1
  )
  unless on (hostname, gpu)
  ${THERMAL_VIOLATION}
)
""",
        for_="5m", group="gpu-thermal",
        needs=Action.SERVICE, clears_when_fixed=True),
    AlertDef(
        name="GpuPowerBrake", severity="warning", category="gpu_thermal",
        cause=CauseClass.DEGRADATION, scope="gpu",
        summary="A GPU is slowed by the hardware power brake.",
        description=f"The HW power brake clock-event bit is set on {_WHERE_GPU} (bitmask "
                    f"{_WHOLE}).",
        impact="An external power-brake signal (PSU or rack power problem) cuts the GPU's "
               "clocks: the whole job slows down.",
        remediation="Check the node's power supplies and rack power; move the job if it "
                    "persists.",
        panel="clock_events",
        condition="""
${CLOCK_EVENT_REASONS}
and
floor(${CLOCK_EVENT_REASONS} / ${CLOCK_HW_POWER_BRAKE}) % 2 == 1
""",
        for_="1m", group="gpu-thermal",
        needs=Action.SERVICE, clears_when_fixed=True),
    AlertDef(
        name="GpuPowerThrottled", severity="info", category="gpu_thermal",
        cause=CauseClass.DEGRADATION, scope="gpu",
        summary="A GPU spends much of its time at its power limit.",
        description=f"{_WHERE_GPU} was power-throttled {{{{ $value | humanizePercentage }}}} of "
                    f"the last {span(s.VIOLATION_WINDOW)}.",
        impact="The GPU runs below its maximum clocks; expected for some workloads, a slowdown "
               "if new.",
        remediation="Nothing unless throughput dropped; then check power capping (nvidia-smi -q "
                    "-d POWER).",
        panel="power_violation",
        condition="${POWER_VIOLATION} > ${POWER_VIOLATION_RATIO}",
        for_="10m", group="gpu-thermal",
        needs=Action.NONE, clears_when_fixed=True),
    AlertDef(
        name="GpuTemperatureHigh", severity="warning", category="gpu_thermal",
        cause=CauseClass.DEGRADATION, scope="gpu",
        summary="A GPU is running hot.",
        description=f"{_WHERE_GPU} is at {_WHOLE} C (warning at {TEMP_WARNING_C} C).",
        impact="Close to throttling: the job may slow down soon.",
        remediation="Check cooling and inlet temperature; no action on the job yet.",
        panel="gpu_temperature",
        condition="${GPU_TEMP_HOT} >= ${TEMP_WARNING_C} < ${TEMP_CRITICAL_C}",
        for_="5m", group="gpu-thermal",
        needs=Action.SERVICE, clears_when_fixed=True),
    AlertDef(
        name="GpuTemperatureCritical", severity="critical", category="gpu_thermal",
        cause=CauseClass.DEGRADATION, scope="gpu",
        summary="A GPU is critically hot.",
        description=f"{_WHERE_GPU} is at {_WHOLE} C (critical at {TEMP_CRITICAL_C} C).",
        impact="The GPU is throttling hard and may shut down to protect itself, crashing the "
               "job.",
        remediation=_CHECKPOINT_NOW,
        panel="gpu_temperature",
        condition="${GPU_TEMP_HOT} >= ${TEMP_CRITICAL_C}",
        for_="1m", group="gpu-thermal",
        needs=Action.SERVICE, clears_when_fixed=True),
    AlertDef(
        name="GpuMemoryTemperatureHigh", severity="warning", category="gpu_thermal",
        cause=CauseClass.DEGRADATION, scope="gpu",
        summary="A GPU's HBM memory is running hot.",
        description=f"HBM of {_WHERE_GPU} is at {_WHOLE} C (warning at {TEMP_WARNING_C} C).",
        impact="Hot HBM throttles memory bandwidth and raises the ECC error rate.",
        remediation="Check cooling and inlet temperature.",
        panel="hbm_temperature",
        condition="${MEMORY_TEMP_HOT} >= ${TEMP_WARNING_C} < ${TEMP_CRITICAL_C}",
        for_="5m", group="gpu-thermal",
        needs=Action.SERVICE, clears_when_fixed=True),
    AlertDef(
        name="GpuMemoryTemperatureCritical", severity="critical", category="gpu_thermal",
        cause=CauseClass.DEGRADATION, scope="gpu",
        summary="A GPU's HBM memory is critically hot.",
        description=f"HBM of {_WHERE_GPU} is at {_WHOLE} C (critical at {TEMP_CRITICAL_C} C).",
        impact="Memory errors and a protective shutdown are likely; the job may crash.",
        remediation=_CHECKPOINT_NOW,
        panel="hbm_temperature",
        condition="${MEMORY_TEMP_HOT} >= ${TEMP_CRITICAL_C}",
        for_="1m", group="gpu-thermal",
        needs=Action.SERVICE, clears_when_fixed=True),
    # --- interconnect ----------------------------------------------------------------------
    AlertDef(
        name="GpuNvlinkErrors", severity="warning", category="gpu_interconnect",
        cause=CauseClass.DEGRADATION, scope="gpu",
        summary="A GPU's NVLink shows CRC errors.",
        description=f"NVLink CRC errors on {_WHERE_GPU}: {{{{ $value | humanize }}}}/s.",
        impact="Packets are retransmitted: collectives over NVLink slow down; a degrading link "
               "may fail.",
        remediation="Watch it; if it persists, drain the node after the job and run the NVLink "
                    "diagnosis (dcgmi diag -r 3).",
        panel="nvlink_errors",
        # CRC errors below the failure level; GpuNvlinkFailure covers the rest.
        condition="""
${NVLINK_CRC_RATE} > 0
unless on (hostname, gpu)
(
  ${NVLINK_REPLAY_RECOVERY} > 0
  or
  ${NVLINK_CRC_RATE} >= ${NVLINK_CRC_FAIL_PER_SECOND}
)
""",
        for_="2m", group="gpu-interconnect",
        needs=Action.SERVICE, clears_when_fixed=True),
    AlertDef(
        name="GpuNvlinkFailure", severity="critical", category="gpu_interconnect",
        cause=CauseClass.LINK_LOSS, scope="gpu",
        summary="A GPU's NVLink is failing (replay or recovery errors).",
        description=f"NVLink replay/recovery errors or a CRC storm on {_WHERE_GPU} (value "
                    "{{ $value | humanize }}).",
        impact="NVLink replays and recoveries stall collectives; NCCL jobs hang or crash.",
        remediation=_CHECKPOINT + " Run the NVLink diagnosis; reseat or replace the GPU/NVSwitch "
                                  "tray.",
        panel="nvlink_errors",
        condition="""
${NVLINK_REPLAY_RECOVERY} > 0
or
${NVLINK_CRC_RATE} >= ${NVLINK_CRC_FAIL_PER_SECOND}
""",
        group="gpu-interconnect",
        # counted over a window: it ends once the link carries no traffic (the crashed job's
        # NCCL gone), not when the link is fixed, so only an operator's return counts
        needs=Action.SERVICE),
    AlertDef(
        name="GpuPcieReplayRate", severity="warning", category="gpu_interconnect",
        cause=CauseClass.DEGRADATION, scope="gpu",
        summary="A GPU's PCIe link replays packets too often.",
        description=f"{_WHERE_GPU} replays {{{{ $value | humanize }}}} PCIe packets per minute "
                    f"(DCGM warns above {PCIE_REPLAYS_PER_MINUTE}).",
        impact="Host-device transfers (data loading, offload) slow down; the link may fail and "
               "the GPU fall off the bus.",
        remediation="Drain the node after the job; check the riser/slot and link speed "
                    "(nvidia-smi -q).",
        panel="pcie_replays",
        # The record is per second; DCGM's limit is per minute.
        condition="${PCIE_REPLAY_RATE} * 60 > ${PCIE_REPLAYS_PER_MINUTE}",
        for_="5m", group="gpu-interconnect",
        needs=Action.SERVICE, clears_when_fixed=True),
    # --- network ----------------------------------------------------------------------------
    AlertDef(
        name="InfinibandLinkDown", severity="critical", category="network",
        cause=CauseClass.LINK_LOSS, scope="link",
        summary="An InfiniBand port that was active went down.",
        description=f"InfiniBand {_WHERE_LINK} is in state {_WHOLE} ({s.IB_STATE_ACTIVE} = "
                    f"active) after being active within the last {span(s.HISTORY_WINDOW)}.",
        impact="Inter-node collectives over this port fail: multi-node jobs on the node hang "
               "until the NCCL timeout, then crash.",
        remediation=_CHECKPOINT_LINK + " Check the cable, transceiver and switch port.",
        panel="ib_link_state",
        condition="${IB_PORT_DOWN} unless on (hostname, device, port) ${IB_PORT_IDLE_1H}",
        for_="1m", copy_labels=("device", "port"), group="network",
        needs=Action.RESTORE_LINK, clears_when_fixed=True),
    AlertDef(
        name="InfinibandLinkFlapping", severity="warning", category="network",
        cause=CauseClass.LINK_LOSS, scope="link",
        summary="An InfiniBand port is flapping.",
        description=f"InfiniBand {_WHERE_LINK} went down or recovered "
                    f"{{{{ $value | humanize }}}} times in {span(s.FLAP_WINDOW)}.",
        impact="Each flap stalls inter-node collectives; NCCL may time out and crash the job.",
        remediation="Check the cable and transceiver; drain the node if it keeps flapping.",
        panel="ib_errors",
        condition="${IB_FLAPS} >= ${IB_FLAPS_MIN}",
        copy_labels=("device", "port"), group="network",
        needs=Action.RESTORE_LINK, clears_when_fixed=True),
    AlertDef(
        name="InfinibandPhysicalErrors", severity="warning", category="network",
        cause=CauseClass.DEGRADATION, scope="link",
        summary="An InfiniBand port shows physical-layer errors.",
        description=f"InfiniBand {_WHERE_LINK}: {{{{ $value | humanize }}}} symbol/link-"
                    "integrity/remote physical errors per second.",
        impact="Retransmissions slow inter-node collectives; the link may go down.",
        remediation="Check or replace the cable and transceiver at the next opportunity.",
        panel="ib_errors",
        condition="${IB_PHYSICAL_ERRORS} > ${IB_PHYSICAL_ERRORS_PER_SECOND}",
        for_="5m", copy_labels=("device", "port"), group="network",
        needs=Action.SERVICE, clears_when_fixed=True),
    AlertDef(
        name="NetworkInterfaceDown", severity="critical", category="network",
        cause=CauseClass.LINK_LOSS, scope="link",
        summary="A network interface that was up went down.",
        description="Interface {{ $labels.device }} on {{ $labels.hostname }} is down (was up "
                    f"within the last {span(s.HISTORY_WINDOW)}; value {_WHOLE}).",
        impact="Traffic over this interface (RoCE collectives, storage, data loading) stops; "
               "the job may hang or crash.",
        remediation=_CHECKPOINT_LINK + " Check the cable, NIC and switch port.",
        panel="net_interfaces",
        condition="${NET_DOWN} unless on (hostname, device) ${NET_IDLE_1H}",
        for_="1m", copy_labels=("device",), group="network",
        needs=Action.RESTORE_LINK, clears_when_fixed=True),
    AlertDef(
        name="NetworkInterfaceFlapping", severity="warning", category="network",
        cause=CauseClass.LINK_LOSS, scope="link",
        summary="A network interface's carrier is flapping.",
        description="Interface {{ $labels.device }} on {{ $labels.hostname }} changed carrier "
                    f"{{{{ $value | humanize }}}} times in {span(s.FLAP_WINDOW)}.",
        impact="Each flap interrupts RoCE/Ethernet traffic; collectives may time out.",
        remediation="Check the cable, transceiver and switch port.",
        panel="net_interfaces",
        condition="${NET_CARRIER_CHANGES} >= ${CARRIER_CHANGES_MIN}",
        copy_labels=("device",), group="network",
        needs=Action.RESTORE_LINK, clears_when_fixed=True),
    # --- node -------------------------------------------------------------------------------
    AlertDef(
        name="NodeDown", severity="critical", category="node",
        cause=CauseClass.NODE_LOSS, scope="host",
        summary="A node is down: its node_exporter and a second witness say so.",
        description="{{ $labels.hostname }} is down: its node_exporter target is down or gone "
                    "together with its dcgm-exporter, or while the scheduler calls the node "
                    f"down (up = {_WHOLE}).",
        impact="The node is unreachable: the job's ranks on it are gone and the job crashes or "
               "hangs.",
        remediation="Check the node (ping, BMC console, the scheduler's reason). Restart the job "
                    "from its last checkpoint without it; return the node once it is back and "
                    "healthy.",
        panel="targets_up",
        condition="${NODE_LOST}",
        for_="2m", copy_labels=(s.TARGET_LABEL,), group="node",
        needs=Action.SERVICE, clears_when_fixed=True),
    AlertDef(
        name="HostTelemetryGap", severity="warning", category="node",
        cause=CauseClass.SYMPTOM, scope="host",
        summary="An exporter of a node is down while the node itself answers: a telemetry gap.",
        description="The {{ $labels.exporter }} target of {{ $labels.hostname }} is down or gone "
                    f"(up = {_WHOLE}) while the node answers: faults it would report on this "
                    "host are not seen.",
        impact="Nothing for the job by itself (the node is up); faults of this host that only "
               "this exporter reports (GPU faults for dcgm-exporter, host and link faults for "
               "node_exporter) would go unseen until it is back.",
        remediation="Restart the exporter (dcgm-exporter pod or service, node_exporter) and "
                    "check why it stopped (OOM kill, upgrade, port, TLS); the node stays in "
                    "service.",
        panel="targets_up",
        condition="${TARGET_DOWN} unless on (hostname) ${NODE_LOST}",
        for_="2m", copy_labels=(s.TARGET_LABEL,), group="telemetry",
        needs=Action.NONE, clears_when_fixed=True),
    AlertDef(
        name="NodeGpuCountDropped", severity="critical", category="gpu_hardware",
        cause=CauseClass.HARDWARE, scope="host",
        summary="A node reports fewer GPUs than it had.",
        description=f"{{{{ $labels.hostname }}}} reports {_WHOLE} GPU(s) fewer than in the last "
                    f"{span(s.HISTORY_WINDOW)}.",
        impact="A GPU disappeared (fallen off the bus or failed): jobs using it crashed; new "
               "jobs get fewer GPUs.",
        remediation=_CHECKPOINT + " Reboot the node; open a hardware ticket if the GPU does not "
                                  "return.",
        panel="gpu_count",
        condition="${HOST_GPU_COUNT_DROP}",
        for_="2m", group="node",
        needs=Action.REBOOT_NODE),
    # --- workload ---------------------------------------------------------------------------
    AlertDef(
        name="TrainingStalled", severity="warning", category="workload",
        cause=CauseClass.SYMPTOM, scope="run",
        summary="A training run stopped computing on a node while holding GPU memory.",
        description="Tensor activity of the run's GPUs on {{ $labels.hostname }} fell to "
                    "{{ $value | humanizePercentage }} while their memory stays allocated, after "
                    f"being active in the last {span(s.HISTORY_WINDOW)}.",
        impact="The job is hung (typically a collective waiting for a dead or slow peer: the "
               "NCCL-hang signature); it burns GPU hours without progress until the NCCL "
               "watchdog kills it.",
        remediation="Look for a hardware or network alert on the run's other nodes (the likely "
                    "cause); if none, dump stacks (py-spy) and restart from the last checkpoint.",
        panel="tensor_activity",
        condition="${RUN_HOST_STALLED}",
        for_="5m", group="workload",
        needs=Action.UNKNOWN),
    AlertDef(
        name="TrainingStraggler", severity="warning", category="workload",
        cause=CauseClass.SYMPTOM, scope="run",
        summary="A GPU of a training run is much less busy than the run's others.",
        description="GPU {{ $labels.gpu }} on {{ $labels.hostname }} averaged "
                    "{{ $value | humanizePercentage }} utilisation over "
                    f"{span(s.UTIL_WINDOW)}, more than {STRAGGLER_GAP * 100:g} points below the "
                    "run's busiest GPU.",
        impact="The run's GPUs are out of step: synchronous training runs at the pace of the "
               "slowest rank.",
        remediation="Look for thermal, power, PCIe or NVLink alerts on that GPU; if none, check "
                    "the data loader and CPU of that rank.",
        panel="gpu_util_spread",
        condition="${RUN_GPU_STRAGGLING}",
        for_="3m", group="workload",
        needs=Action.UNKNOWN),
)


# --- pipeline: this project's own path from scheduler to W&B -------------------------------------
# The exporter or bridge is down: a target that exposed its own metrics within the hour and is
# down now, found by what it served, so no scrape job name has to be configured.

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
        condition="max by (instance, job, source) (${EXPORTER_SOURCE_UP}) == 0",
        for_="5m", group="pipeline",
        needs=Action.NONE, clears_when_fixed=True),
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
        condition="""
time() - max by (instance, job, source) (${EXPORTER_SOURCE_LAST_SUCCESS} > 0)
> ${SOURCE_STALE_SECONDS}
""",
        for_="5m", group="pipeline",
        needs=Action.NONE, clears_when_fixed=True),
    AlertDef(
        name="WandbInfraExporterDown", severity="critical", category="pipeline",
        cause=CauseClass.SYMPTOM, scope="pipeline",
        summary="Prometheus cannot scrape the run-to-host exporter.",
        description="The exporter target {{ $labels.instance }} (job {{ $labels.job }}) is down "
                    f"(up = {_WHOLE}).",
        impact=f"The join metrics go stale within {span(s.LOOKBACK)}: every fault then alerts "
               "without run labels and no W&B run gets its issues.",
        remediation="Restart the exporter (its registrations survive in its state file); check "
                    "its port, TLS and the scrape config.",
        panel="pipeline_targets",
        condition="""
${UP_DOWN}
and on (instance, job)
${PIPELINE_TARGETS}{component="exporter"}
""",
        for_="2m", group="pipeline",
        needs=Action.NONE, clears_when_fixed=True),
    AlertDef(
        name="WandbInfraJoinMetricsMissing", severity="warning", category="pipeline",
        cause=CauseClass.SYMPTOM, scope="pipeline",
        summary="GPUs are busy but no W&B run is mapped to any host.",
        description=f"GPU 0 holds memory on {_WHOLE} host(s), and no {L.NODE_INFO} series "
                    "exists.",
        impact="Faults are detected but attributed to no run: W&B users see nothing.",
        remediation="Check that the exporter runs, is scraped, and that its sources find the "
                    "jobs (the Slurm comment or Kubernetes label convention, docs/deploy.md).",
        panel="pipeline_targets",
        # dcgm-exporter reports framebuffer memory in MiB. GPU 0 of each host only: jobs in use
        # anywhere hold some host's GPU 0, at an eighth of the cost of reading every GPU.
        condition="""
count(DCGM_FI_DEV_FB_USED{gpu="0"} > ${STALL_FB_MIN_MIB}) > 0
and on ()
absent(${NODE_INFO})
""",
        for_="15m", group="pipeline-coverage",
        needs=Action.NONE, clears_when_fixed=True),
    AlertDef(
        name="WandbInfraRunHostWithoutGpuTelemetry", severity="warning", category="pipeline",
        cause=CauseClass.SYMPTOM, scope="pipeline",
        summary="Hosts of published runs have no GPU telemetry at all.",
        description=f"{_WHOLE} host(s) running W&B runs have no dcgm-exporter target reporting "
                    f"their host name in the last {span(s.HISTORY_WINDOW)}.",
        impact="GPU faults on those hosts (XIDs, ECC, temperatures, a GPU off the bus) are never "
               "seen, so their runs' verdicts cannot name them.",
        remediation="List the hosts with this alert's expression without count() in Prometheus. "
                    "Deploy dcgm-exporter on them (the GPU Operator's DaemonSet or the systemd "
                    "unit) and scrape it; if it is scraped, make its host label match the "
                    "exporter's host name (strip_domain, host_key_regex, or relabel Hostname).",
        panel="pipeline_targets",
        # One alert for the cluster, valued with the number of hosts: a missing scrape job
        # leaves every run host without telemetry, and one alert per host would flood
        # Alertmanager with the same configuration fault (and template thousands of alerts
        # at every evaluation).
        condition="""
count(
  max by (hostname) (${NODE_INFO})
  unless on (hostname)
  ${TARGET_HOSTS}{${TARGET_LABEL}="dcgm_exporter"}
)
""",
        for_="15m", group="pipeline-coverage",
        needs=Action.NONE, clears_when_fixed=True),
    AlertDef(
        name="WandbInfraRunHostWithoutNodeState", severity="warning", category="pipeline",
        cause=CauseClass.SYMPTOM, scope="pipeline",
        summary="Hosts of published runs have no scheduler node state.",
        description=f"{_WHOLE} host(s) running W&B runs have no {nodestate.STATE} series (nor "
                    "kube-state-metrics' node series).",
        impact="The bridge cannot say whether restarting a run would land on those hosts again: "
               "its restart advice for their runs stays incomplete.",
        remediation="List the hosts with this alert's expression without count() in Prometheus. "
                    "Enable the exporter's node_state source (node_state.slurm or "
                    "node_state.kubernetes in its config), or scrape kube-state-metrics; the "
                    "node names must match the run's host names.",
        panel="pipeline_targets",
        # One alert for the cluster, as WandbInfraRunHostWithoutGpuTelemetry.
        condition="""
count(
  max by (hostname) (${NODE_INFO})
  unless on (hostname)
  (
    ${NODE_STATE}
    or
    label_replace(kube_node_spec_unschedulable, "hostname", "$1", "node", "(.+)")
  )
)
""",
        for_="15m", group="pipeline-coverage",
        needs=Action.NONE, clears_when_fixed=True),
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
        condition="""
${UP_DOWN}
and on (instance, job)
${PIPELINE_TARGETS}{component="bridge"}
""",
        for_="2m", group="pipeline",
        needs=Action.NONE, clears_when_fixed=True),
    AlertDef(
        name="WandbInfraRunsParked", severity="warning", category="pipeline",
        cause=CauseClass.SYMPTOM, scope="pipeline",
        summary="The bridge parked runs it cannot write to W&B.",
        description=f"{_WHOLE} run(s) parked by the bridge at {{{{ $labels.instance }}}}.",
        impact="Those runs' issues are kept and shown on the bridge's /runs page but not in "
               "W&B.",
        remediation="Open the bridge's /runs page for each run's reason (key revoked, run "
                    "deleted, permission) and fix it; parked runs are retried after.",
        panel="pipeline_delivery",
        condition="max by (instance, job) (${BRIDGE_PARKED_RUNS}) > 0",
        for_="10m", group="pipeline",
        needs=Action.NONE, clears_when_fixed=True),
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
        condition="""
max by (instance, job) (${BRIDGE_OLDEST_UNDELIVERED})
> ${DELIVERY_BACKLOG_SECONDS}
""",
        for_="5m", group="pipeline",
        needs=Action.NONE, clears_when_fixed=True),
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
        condition="min by (instance, job) (${BRIDGE_STORE_WRITABLE}) == 0",
        for_="1m", group="pipeline",
        needs=Action.NONE, clears_when_fixed=True),
)


# --- host memory, storage, reboots and maintenance, NVSwitch, power, repeat offenders ---
# Defined in catalog/host_alerts.py (plain data with AlertDef's keywords); registered here, last,
# so the repeat-offender records count every hardware alert the catalog has.

register(*host_alerts.definitions(AlertDef))
_HOST_VALUES: dict[str, str | int | float] = {
    **host_alerts.TEMPLATE_VALUES,
    "HARDWARE_ALERTS": host_alerts.hardware_alerts(ALERTS, ("gpu", "host")),
    "HARDWARE_GPU_ALERTS": host_alerts.hardware_alerts(ALERTS, ("gpu",)),
}
TEMPLATE_VALUES.update(_HOST_VALUES)
PLAIN_VALUES.update(_HOST_VALUES)
