"""Alerts on the host around the GPUs: host memory, the run's filesystems, reboots and
maintenance, NVSwitch and the fabric, power and chassis, and repeat offenders.

The rest of the failure landscape after GPUs and links: of the 419 unexpected interruptions of
Llama 3 pre-training ("The Llama 3 Herd of Models", Table 5), host maintenance, SSDs, power
supplies, chassis, CPUs and system memory; of Meta's research clusters ("Revisiting Reliability
in Large-Scale ML Research Clusters", 2024), filesystem mounts, main-memory errors, OOM and the
repeat-offender ("lemon") nodes whose retirement cut the failure rate of 512+ GPU jobs from 14%
to 4%.

Plain data with the same keywords as ``AlertDef``: ``definitions(AlertDef)`` builds them and
``catalog/alerts.py`` registers them, so this module imports nothing of ``alerts`` (no import
cycle). Sources and exporters:

* node_exporter (defaults): ``node_vmstat_oom_kill``, ``node_pressure_memory_*``,
  ``node_edac_*``, ``node_filesystem_{readonly,avail_bytes,size_bytes,device_error}``, the
  mountstats collector (``node_mountstats_nfs_*``, off by default: ``--collector.mountstats``),
  ``node_boot_time_seconds``;
* this project's exporter: ``wandb_infra_node_state`` (Slurm state and reason, Kubernetes
  conditions and taints);
* dcgm-exporter: ``DCGM_FI_DEV_FABRIC_MANAGER_STATUS`` (field 170) and the NVSwitch SXid fields
  (856 ``DCGM_FI_DEV_SXID_FATAL_ERROR``, legacy ``DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS``);
* where scraped (off by default; "Host hardware exporters" in docs/deploy.md): smartctl_exporter
  (``smartctl_device_smart_status``, ``..._critical_warning``, ``..._media_errors``) and
  ipmi_exporter (``ipmi_*_state``: 0 nominal, 1 warning, 2 critical).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from wandb_infra.catalog import series as s
from wandb_infra.catalog.recovery import Action
from wandb_infra.catalog.series import span
from wandb_infra.catalog.vocabulary import CauseClass

T = TypeVar("T")

# Thresholds (site policy; changed here once).
MEMORY_PRESSURE_RATIO = 0.10  # share of time every task waited for memory ("full" PSI)
# MemAvailable's share of MemTotal at its highest over VIOLATION_WINDOW: below this the kernel is
# about to OOM-kill (the check where PSI is off: old kernels, node_exporter without pressure).
MEMORY_AVAILABLE_MIN_RATIO = 0.01
EDAC_CORRECTABLE_PER_WINDOW = 10  # corrected DIMM errors per WEAR_WINDOW
FS_FREE_MIN_RATIO = 0.03  # a run filesystem with less free space is full
REBOOT_MIN_SECONDS = 60  # boot time moving later by more is a reboot (btime jitters)
# Repeat offenders: the Nth hardware-fault episode of a host or GPU within REPEAT_WINDOW.
REPEAT_FAULTS_MIN = 3
# Slurm states of a node taken for maintenance (a MAINT reservation, scontrol reboot), and the
# reasons or Kubernetes conditions/taints that say so (the exporter's ``reason`` label: the
# drain reason, or the taints and abnormal conditions: AKS ``VMEventScheduled``, AWS node
# termination handler's ``scheduled-maintenance`` taint, GKE's maintenance window).
SLURM_MAINTENANCE_STATES = ".*(MAINT|REBOOT).*"
MAINTENANCE_REASONS = (
    "(?i).*(maint|scheduled.?event|vmeventscheduled|impending.?(node.?)?termination|"
    "reboot|firmware|upgrade).*")
# Reasons that name an unplanned event although they match a word above: Slurm's own reason for
# a node that came back with a new boot time, "Node unexpectedly rebooted" (SchedMD/slurm,
# src/slurmctld/node_mgr.c; https://slurm.schedmd.com/faq.html#reboot). Such a node is a
# NodeRebooted, never maintenance (which would also silence NodeRebooted).
UNPLANNED_REASONS = "(?i).*(unexpected|unplanned).*"
# Scheduler states of a node that is gone (the second witness NodeDown needs beside node_exporter):
# Slurm DOWN or NOT_RESPONDING (scontrol marks the latter with a trailing ``*``), Kubernetes
# NotReady or Unknown (the kubelet stopped posting status).
SCHEDULER_DOWN_STATES = "(?i)(.*[+,])?(down|not_responding|notready|unknown)([*+,].*)?|.*[*].*"
# Fabric Manager states that fail DCGM's health check (dcgmFabricManagerStatus_t: 1 not
# started, 4 failure, 5 unrecognized, 6 NVML too old; 0 is a GPU without NVSwitch, 2 in
# progress, 3 success).
FM_NOT_STARTED = 1
FM_FAILURE_MIN = 4
IPMI_CRITICAL = 2
POWER_SENSOR_TYPES = "Power Supply|Power Unit"

TEMPLATE_VALUES: dict[str, str | int | float] = {
    "MEMORY_PRESSURE_RATIO": MEMORY_PRESSURE_RATIO,
    "MEMORY_AVAILABLE_MIN_RATIO": MEMORY_AVAILABLE_MIN_RATIO,
    "EDAC_CORRECTABLE_PER_WINDOW": EDAC_CORRECTABLE_PER_WINDOW,
    "FS_FREE_MIN_RATIO": FS_FREE_MIN_RATIO,
    "REPEAT_FAULTS_MIN": REPEAT_FAULTS_MIN,
    "REPEAT_WINDOW": s.REPEAT_WINDOW,
    "BOOT_WINDOW": s.BOOT_WINDOW,
    "LOCAL_FSTYPES": s.LOCAL_FSTYPES,
    "NETWORK_FSTYPES": s.NETWORK_FSTYPES,
}

_HOST = "{{ $labels.hostname }}"
_WHOLE = '{{ $value | printf "%.0f" }}'
_MOUNT = "{{ $labels.mountpoint }} on " + _HOST
_RESTART = "Restart the job from its last checkpoint"


# The repeat-offender alerts, named here for the records that exclude them and for the bridge's
# verdict, which raises a repeat offender's fault to a replacement.
GPU_REPEAT_OFFENDER = "GpuRepeatOffender"
HOST_REPEAT_OFFENDER = "HostRepeatOffender"

def definitions(make: Callable[..., T]) -> list[T]:
    """Every alert of this module, built with ``make`` (``AlertDef``)."""
    d: list[dict[str, Any]] = [
        # --- host memory ------------------------------------------------------------------------
        dict(
            name="HostOomKill", severity="critical", category="host",
            cause=CauseClass.HOST_RESOURCE, scope="host",
            summary="The kernel's OOM killer killed a process on a node.",
            description=f"The OOM killer ran {_WHOLE} time(s) on {_HOST} in the last "
                        f"{span(s.WEAR_WINDOW)} (node_vmstat_oom_kill).",
            impact="System memory ran out: a rank or its data loader was killed, so the "
                   "synchronous job fails and the other ranks report NCCL errors or hang.",
            remediation=f"{_RESTART}; the node can stay in service. Lower the host memory the "
                        "job uses (data-loader workers, pinned memory, prefetch) or request "
                        "more. If OOM kills recur on this node under other jobs, drain it and "
                        "look for a leaking daemon or memory the node lost.",
            panel="host_memory",
            condition="${HOST_OOM_KILLS}",
            group="host-memory",
            needs=Action.RESTART_APP),
        dict(
            name="HostMemoryPressure", severity="warning", category="host",
            cause=CauseClass.HOST_RESOURCE, scope="host",
            summary="A node's tasks are stalled waiting for memory.",
            description=f"Every task on {_HOST} waited for memory "
                        "{{ $value | humanizePercentage }} of the last "
                        f"{span(s.VIOLATION_WINDOW)} (PSI memory full).",
            impact="The host is reclaiming or swapping: data loading and host-side steps "
                   "slow the whole job, and an OOM kill may follow.",
            remediation="Reduce the job's host memory (data-loader workers, caches) or move it "
                        "to a node with more memory; nothing to do on the node itself.",
            panel="host_memory",
            condition="${HOST_MEMORY_PRESSURE} > ${MEMORY_PRESSURE_RATIO}",
            for_="5m", group="host-memory",
            needs=Action.NONE, clears_when_fixed=True),
        dict(
            name="HostMemoryExhausted", severity="warning", category="host",
            cause=CauseClass.HOST_RESOURCE, scope="host",
            summary="A node has almost no memory available.",
            description=f"At most {{{{ $value | humanizePercentage }}}} of {_HOST}'s memory was "
                        f"available over the last {span(s.VIOLATION_WINDOW)} "
                        "(node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes).",
            impact="The kernel is about to OOM-kill a process (a rank or its data loader): the "
                   "job fails and its other ranks report NCCL errors or hang.",
            remediation="Reduce the job's host memory (data-loader workers, pinned memory, "
                        "caches) or move it to a node with more memory; if no job explains the "
                        "usage, look for a leaking daemon on the node.",
            panel="host_memory",
            condition="${HOST_MEMORY_AVAILABLE_LOW}",
            for_="2m", group="host-memory",
            needs=Action.NONE, clears_when_fixed=True),
        dict(
            name="HostMemoryUncorrectableErrors", severity="critical", category="host",
            cause=CauseClass.HARDWARE, scope="host",
            summary="A node's system memory (DIMM) reported uncorrectable errors.",
            description=f"{_WHOLE} uncorrectable memory error(s) on {_HOST} since boot (EDAC "
                        "memory controller {{ $labels.controller }}).",
            impact="The kernel killed the process that touched the bad memory (or panicked): "
                   "the job crashed and the DIMM will fail again.",
            remediation=f"{_RESTART} without this node; drain it and replace the DIMM the "
                        "EDAC counters and the BMC's SEL name (the count clears at reboot).",
            panel="host_memory",
            condition="${HOST_EDAC_UNCORRECTABLE}",
            copy_labels=("controller",), group="host-memory",
            # the count since boot ends at a reboot (a panic's too) with the DIMM still bad, or
            # when node_exporter stops answering: only an operator's return counts
            needs=Action.SERVICE),
        dict(
            name="HostMemoryCorrectableErrors", severity="warning", category="host",
            cause=CauseClass.DEGRADATION, scope="host",
            summary="A node's system memory reports a storm of corrected errors.",
            description=f"{_WHOLE} corrected memory errors on {_HOST} in the last "
                        f"{span(s.WEAR_WINDOW)} (EDAC).",
            impact="None yet; a DIMM correcting this often tends to fail uncorrectably next.",
            remediation="Keep the job running; schedule the DIMM's replacement at the next "
                        "maintenance window.",
            panel="host_memory",
            condition="${HOST_EDAC_CORRECTABLE} > ${EDAC_CORRECTABLE_PER_WINDOW}",
            group="host-memory",
            needs=Action.NONE),
        # --- storage ----------------------------------------------------------------------------
        *_filesystem_alerts(),
        dict(
            name="LocalDiskFailing", severity="warning", category="host",
            cause=CauseClass.HARDWARE, scope="host",
            summary="A node's local disk reports failing health (SMART).",
            description="Disk {{ $labels.device }} on " + _HOST + ": {{ $labels.check }} "
                        f"(value {_WHOLE}; smartctl_exporter).",
            impact="Local scratch, caches or the OS disk may fail: reads and checkpoint writes "
                   "on it error out and the node may go read-only or down.",
            remediation="Move jobs off the node when they end; replace the disk.",
            panel="local_disks",
            condition="${DISK_FAILING}",
            for_="5m", copy_labels=("device", "check"), group="storage",
            needs=Action.SERVICE, clears_when_fixed=True),
        # --- reboots and maintenance ------------------------------------------------------------
        dict(
            name="NodeRebooted", severity="critical", category="node",
            cause=CauseClass.NODE_LOSS, scope="host",
            summary="A node rebooted without a planned maintenance.",
            description=f"{_HOST} booted again at {{{{ $value | humanizeTimestamp }}}} "
                        "(node_boot_time_seconds moved later), with no maintenance state "
                        f"seen in the last {span(s.BOOT_WINDOW)}.",
            impact="Every process on the node died with it: the job lost its ranks there and "
                   "crashed (or hangs in NCCL on the other nodes).",
            remediation=f"{_RESTART}; the node is back and needs nothing more unless it "
                        "reboots again (kernel panic, watchdog, power: read its BMC's SEL and "
                        "the previous boot's journal).",
            panel="reboots",
            condition="""
${HOST_BOOTED}
unless on (hostname)
max_over_time(${NODE_MAINTENANCE}[${BOOT_WINDOW}])
""",
            group="node-lifecycle",
            needs=Action.NONE),
        dict(
            name="NodeMaintenance", severity="warning", category="maintenance",
            cause=CauseClass.MAINTENANCE, scope="host",
            summary="A node is under planned maintenance.",
            description=f"The {{{{ $labels.scheduler }}}} state of {_HOST} is "
                        "{{ $labels.state }} (reason: {{ $labels.reason }}; value {{ $value }}).",
            impact="Maintenance, not a fault: the scheduler or cloud takes the node (a "
                   "reservation, a reboot, a host event); a job still on it is killed or "
                   "loses the node when the work starts.",
            remediation="Checkpoint and restart the job on other nodes; the node returns to "
                        "the pool when the maintenance ends.",
            panel="reboots",
            condition="${NODE_MAINTENANCE}",
            copy_labels=("scheduler", "state", "reason"), group="node-lifecycle",
            needs=Action.SERVICE, clears_when_fixed=True),
        # --- NVSwitch and the fabric ------------------------------------------------------------
        dict(
            name="NvswitchFatalError", severity="critical", category="gpu_interconnect",
            cause=CauseClass.HARDWARE, scope="host",
            summary="An NVSwitch of a node reported a fatal error (SXid).",
            description=f"NVSwitch {{{{ $labels.nvswitch }}}} on {_HOST} reported fatal SXid "
                        f"{_WHOLE}.",
            impact="NVLink traffic through the switch stops: every job using the node's "
                   "NVLink crashes or hangs, with no XID on the GPUs.",
            remediation=f"{_RESTART} without this node; reboot it (the GPUs and NVSwitches are "
                        "reset at boot) and open a ticket if the SXid returns.",
            panel="fabric",
            condition="${NVSWITCH_FATAL}",
            copy_labels=("nvswitch",), group="fabric",
            needs=Action.REBOOT_NODE),
        dict(
            name="FabricManagerNotReady", severity="critical", category="gpu_interconnect",
            cause=CauseClass.HARDWARE, scope="host",
            summary="The NVLink fabric of a node is not trained (Fabric Manager).",
            description=f"The Fabric Manager status of GPU {{{{ $labels.gpu }}}} on {_HOST} is "
                        f"{_WHOLE} (1 not started, 4 failure, 5 unrecognized, 6 NVML too old; 3 "
                        "is success).",
            impact="CUDA cannot use NVLink peer-to-peer on the node: jobs fail to start or "
                   "their collectives fail.",
            remediation="Restart nvidia-fabricmanager (or reboot the node); check its log "
                        "for the failing switch or trunk link.",
            panel="fabric",
            condition="max by (hostname, gpu) (${FABRIC_MANAGER_DOWN})",
            for_="5m", copy_labels=("gpu",), group="fabric",
            needs=Action.SERVICE, clears_when_fixed=True),
        # --- power and chassis (ipmi_exporter, off by default) ----------------------------------
        dict(
            name="HostPowerSupplyFault", severity="warning", category="host",
            cause=CauseClass.HARDWARE, scope="host",
            summary="A node's power supply or power sensor is critical (IPMI).",
            description="IPMI sensor {{ $labels.name }} on " + _HOST + " is critical (state "
                        f"{_WHOLE}).",
            impact="The node runs without power redundancy or out of its power envelope: the "
                   "GPUs' power brake slows the job, and a second failure takes the node down.",
            remediation="Replace or reseat the power supply and check the feed (PDU, rack "
                        "circuit); move jobs off the node if it also throttles.",
            panel="power_chassis",
            condition="${IPMI_POWER_FAULT}",
            for_="2m", copy_labels=("name",), group="host-power",
            needs=Action.SERVICE, clears_when_fixed=True),
        dict(
            name="HostChassisSensorCritical", severity="warning", category="host",
            cause=CauseClass.HARDWARE, scope="host",
            summary="A node's chassis sensor (fan, temperature, CPU, memory) is critical (IPMI).",
            description="IPMI sensor {{ $labels.name }} on " + _HOST + " is critical (state "
                        f"{_WHOLE}).",
            impact="A failed fan, an overheating chassis or a CPU/memory fault: the GPUs "
                   "throttle or the node shuts down, slowing or ending the job.",
            remediation="Read the BMC's SEL for the sensor; fix cooling or the failed part "
                        "before the node takes jobs again.",
            panel="power_chassis",
            condition="${IPMI_CHASSIS_CRITICAL}",
            for_="2m", copy_labels=("name",), group="host-power",
            needs=Action.SERVICE, clears_when_fixed=True),
        # --- repeat offenders -------------------------------------------------------------------
        dict(
            name=GPU_REPEAT_OFFENDER, severity="warning", category="gpu_hardware",
            cause=CauseClass.HARDWARE, scope="gpu",
            summary="A GPU keeps failing: replace it, do not reset it again.",
            description=f"GPU {{{{ $labels.gpu }}}} on {_HOST} had {_WHOLE} hardware faults in "
                        f"the last {span(s.REPEAT_WINDOW)} (repeat offender from "
                        f"{REPEAT_FAULTS_MIN}).",
            impact="A reset or reboot clears the fault but not its cause: the next job on this "
                   "GPU is likely to fail the same way.",
            remediation="Replace, not reset: drain the node and ask for a field diagnosis "
                        "and replacement (RMA) of this GPU.",
            panel="repeat_offenders",
            condition="""
${GPU_HARDWARE_EPISODES} >= ${REPEAT_FAULTS_MIN}
""",
            group="repeat-offenders",
            needs=Action.REPLACE),
        dict(
            name=HOST_REPEAT_OFFENDER, severity="warning", category="pipeline",
            cause=CauseClass.SYMPTOM, scope="pipeline",
            summary="A node keeps having hardware faults: take it out for repair.",
            description=f"{_HOST} had {_WHOLE} hardware-fault episodes in the last "
                        f"{span(s.REPEAT_WINDOW)} (repeat offender from {REPEAT_FAULTS_MIN}).",
            impact="A lemon node fails job after job; retiring the few repeat offenders is "
                   "what cuts the failure rate of large jobs (Meta: 14% to 4% for 512+ GPUs).",
            remediation="Drain the node and have it repaired (replace the failing GPU, DIMM, "
                        "PSU or board) instead of resetting it again.",
            panel="repeat_offenders",
            condition="""
changes(${HOST_HARDWARE_SINCE}[${REPEAT_WINDOW}]) + 1
>= ${REPEAT_FAULTS_MIN}
""",
            group="pipeline-repeat-offenders",
            needs=Action.NONE, clears_when_fixed=True),
    ]
    return [make(**spec) for spec in d]


# The run filesystems' three faults. On a local filesystem (LOCAL_FSTYPES) the fault is the
# node's: it leaves the pool until an operator has fixed it. On a shared one (NETWORK_FSTYPES:
# NFS, Lustre, GPFS, BeeGFS, WEKA, CephFS, SMB, FUSE clients) it is the storage service's, seen by
# every node that mounts it: restarting the job is all a node needs, and draining it (or the one
# of them a run's issue happens to be rooted on) would take healthy GPUs away for nothing.
_FS_FAULTS: tuple[dict[str, Any], ...] = (
    dict(
        name="FilesystemReadOnly", what="became read-only",
        description=f"{_MOUNT} is read-only (readonly = {_WHOLE}) since it was remounted so "
                    "(it was writable before: mounts read-only from boot are not alerted on).",
        impact="Checkpoints and logs can no longer be written (the kernel remounts read-only "
               "after I/O errors): the job fails at its next checkpoint or loses the work since "
               "the last one.",
        local=f"{_RESTART} without this node; check dmesg for the I/O error behind the remount "
              "(disk, controller) and fix it.",
        shared="check the storage servers for the fault that made the export read-only (a "
               "failed target, a full or degraded pool, an export policy) and remount once "
               "fixed.",
        condition="${FS_READONLY_REMOUNTED}", for_="1m"),
    dict(
        name="FilesystemFull", what="is full",
        description=f"{_MOUNT} has {{{{ $value | humanizePercentage }}}} free (full below "
                    f"{FS_FREE_MIN_RATIO:.0%}).",
        impact="Checkpoint and log writes fail with ENOSPC: the job crashes at its next "
               "checkpoint, or writes a truncated one.",
        local="Free space (old checkpoints, caches) or move the job's output; the alert clears "
              "once space is back.",
        shared="free space on the shared filesystem (old checkpoints, other jobs' output) or "
               "raise its quota; the alert clears once space is back.",
        condition="${FS_AVAIL_LOW}", for_="2m"),
    dict(
        name="FilesystemNotResponding", what="stopped answering",
        description=f"{_MOUNT} is not answering (statfs failing, or {_WHOLE} NFS major "
                    f"timeout(s) in the last {span(s.WEAR_WINDOW)}).",
        impact="Reads and writes on the mount hang: data loading and checkpointing block, the "
               "rank stalls and the others wait in NCCL until the watchdog kills the job.",
        local=f"{_RESTART} without this node; check the disk and its controller (dmesg), then "
              "remount or reboot the node.",
        shared="check the storage servers (NFS, Lustre OSS/MDS, GPFS NSD) and the storage "
               "network, then remount where the mount stays hung.",
        condition="${FS_NOT_ANSWERING}", for_="2m"),
)


def _filesystem_alerts() -> list[dict[str, Any]]:
    """Each filesystem fault twice: on a local filesystem (the node's, serviced) and on a shared
    one (``Shared...``: the storage service's, the node stays in service)."""
    out = []
    for f in _FS_FAULTS:
        common = dict(severity="critical", category="storage", cause=CauseClass.HOST_RESOURCE,
                      scope="host", description=f["description"], panel="filesystems",
                      for_=f["for_"], copy_labels=("mountpoint", "fstype"), group="storage",
                      clears_when_fixed=True)
        out.append(dict(
            common, name=f["name"],
            summary=f"A local filesystem the node's jobs use {f['what']}.",
            impact=f["impact"], remediation=f["local"],
            condition=f["condition"] + '{fstype=~"${LOCAL_FSTYPES}"}',
            needs=Action.SERVICE))
        out.append(dict(
            common, name="Shared" + f["name"],
            summary=f"A shared filesystem {f['what']}: its storage service is at fault, not "
                    "the node.",
            impact=f"{f['impact']} Every node that mounts it sees the same: the fault is the "
                   "storage service's.",
            remediation=f"The storage service is at fault, not the node: the node stays in "
                        f"service. {_RESTART} once the mount works again; {f['shared']}",
            condition=f["condition"] + '{fstype=~"${NETWORK_FSTYPES}"}',
            needs=Action.RESTART_APP))
    return out


# The alerts that count as a hardware fault for the repeat-offender records: the hardware class
# on a GPU or host, but never the repeat offenders themselves.
REPEAT_EXCLUDED = (GPU_REPEAT_OFFENDER, HOST_REPEAT_OFFENDER)


def hardware_alerts(alerts: dict[str, Any], scopes: tuple[str, ...]) -> str:
    """A regex of the catalog's hardware-class alerts of the given scopes."""
    names = sorted(a.name for a in alerts.values()
                   if a.cause is CauseClass.HARDWARE and a.scope in scopes
                   and a.name not in REPEAT_EXCLUDED)
    return "|".join(names)
