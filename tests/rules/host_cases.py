"""promtool cases for the host alerts (catalog/host_alerts.py), built from upstream
label sets: node_exporter's collector fixture (tests/data/node_exporter/e2e-output.txt: vmstat,
pressure, EDAC, mountstats), smartctl_exporter's EXAMPLE.md and ipmi_exporter's docs/metrics.md
(tests/data/{smartctl,ipmi}/, provenance in tests/data/README.md), this project's
``wandb_infra_node_state``, dcgm-exporter's Fabric Manager and SXid fields. Every alert gets a
fault case attributed to the run on the host and a healthy twin."""

from __future__ import annotations

from tests.rules import build as b

EXPORTER = {"instance": "exporter:9842", "job": "wandb-infra-exporter"}
# node_exporter's filesystem collector labels (device, fstype, mountpoint)
CKPT = {"device": "/dev/nvme0n1p2", "fstype": "ext4", "mountpoint": "/checkpoints"}
# The fixture's NFS mount (mountstats collector)
NFS = {"export": "192.168.1.1:/srv/test", "mountaddr": "192.168.1.1", "protocol": "tcp"}
# A shared checkpoint filesystem (filesystem collector labels of an NFSv4 and a Lustre mount)
SHARED = {"device": "192.168.1.1:/srv/ckpt", "fstype": "nfs4", "mountpoint": "/mnt/ckpt"}
LUSTRE = {"device": "10.0.0.5@o2ib:/scratch", "fstype": "lustre", "mountpoint": "/lustre"}
# The read-only description's fixed part.
REMOUNTED = ("since it was remounted so (it was writable before: mounts read-only from boot are "
             "not alerted on).")
# Slurm's reason for a node that came back with a new boot time.
UNEXPECTED = "Node unexpectedly rebooted"


def _run() -> dict[str, str]:
    """The alert labels of run A on host n1 (build.py is read lazily: it imports this module)."""
    return {**b.RUN_A, "hostname": "n1"}


def _base() -> list[b.Series]:
    return [b.uname(), b.node_info(b.RUN_A)]


def _case(name: str, alert: str, fault: list[b.Series], healthy: list[b.Series], at: str,  # noqa: PLR0917
          labels: dict[str, str], description: str) -> list[b.Case]:
    return b._pair(name, alert, [*_base(), *fault], [*_base(), *healthy], at,
                   [b.Expect({**_run(), **labels}, description)])


def state(host: str, scheduler: str, value: str, reason: str, values: str = "1x80") -> b.Series:
    """The exporter's scheduler node state."""
    return b.Series("wandb_infra_node_state", {**EXPORTER, "hostname": host,
                                               "scheduler": scheduler, "state": value,
                                               "reason": reason}, values)


def smartctl(metric: str, device: str, values: str) -> b.Series:
    """A smartctl_exporter series as EXAMPLE.md shows it, scraped on the node."""
    return b.Series(metric, {"instance": "n1:9633", "job": "smartctl", "device": device}, values)


def ipmi(metric: str, values: str, **labels: str) -> b.Series:
    """An ipmi_exporter series as docs/metrics.md shows it, scraped on the node."""
    return b.Series(metric, {"instance": "n1:9290", "job": "ipmi", **labels}, values)


def memory_cases() -> list[b.Case]:
    """OOM kills, memory pressure, DIMM errors."""
    return [
        *_case("node_vmstat_oom_kill increased", "HostOomKill",
               [b.node("node_vmstat_oom_kill", "0x20 1x60")],
               [b.node("node_vmstat_oom_kill", "0x80")], "15m", {},
               "The OOM killer ran 1 time(s) on n1 in the last 10 minutes (node_vmstat_oom_kill)."),
        # A reboot resets the counter inside the window: the kills since it, not the drop.
        *_case("node_vmstat_oom_kill increased after a reboot reset it", "HostOomKill",
               [b.node("node_vmstat_oom_kill", "40x10 0x2 2x60")],
               [b.node("node_vmstat_oom_kill", "40x10 0x70")], "15m", {},
               "The OOM killer ran 2 time(s) on n1 in the last 10 minutes (node_vmstat_oom_kill)."),
        *_case("PSI memory full 30%", "HostMemoryPressure",
               [b.node("node_pressure_memory_stalled_seconds_total", "0+9x80")],
               [b.node("node_pressure_memory_stalled_seconds_total", "0+0.3x80")], "15m", {},
               "Every task on n1 waited for memory 30% of the last 5 minutes (PSI memory full)."),
        *_case("MemAvailable below 1% of MemTotal, no PSI", "HostMemoryExhausted",
               [b.node("node_memory_MemTotal_bytes", "1e12x80"),
                b.node("node_memory_MemAvailable_bytes", "3e11x10 2e9x70")],
               [b.node("node_memory_MemTotal_bytes", "1e12x80"),
                b.node("node_memory_MemAvailable_bytes", "3e11x10 2e10x70")], "20m", {},
               "At most 0.2% of n1's memory was available over the last 5 minutes "
               "(node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes)."),
        *_case("EDAC uncorrectable errors since boot", "HostMemoryUncorrectableErrors",
               [b.node("node_edac_uncorrectable_errors_total", "5x80", controller="0")],
               [b.node("node_edac_uncorrectable_errors_total", "0x80", controller="0")], "6m",
               {"controller": "0"},
               "5 uncorrectable memory error(s) on n1 since boot (EDAC memory controller 0)."),
        *_case("EDAC corrected error storm", "HostMemoryCorrectableErrors",
               [b.node("node_edac_correctable_errors_total", "0+1x80", controller="0")],
               [b.node("node_edac_correctable_errors_total", "1x80", controller="0")], "20m", {},
               "20 corrected memory errors on n1 in the last 10 minutes (EDAC)."),
    ]


def storage_cases() -> list[b.Case]:
    """Read-only, full and unanswering run filesystems; failing local disks (SMART)."""
    size = b.node("node_filesystem_size_bytes", "1e12x80", **CKPT)
    mount_info = b.node("node_mountstats_nfs_mountpoint_info", "1x80", **NFS,
                        mountpoint="/mnt/nfs/test")

    def timeouts(values: str) -> b.Series:
        return b.node("node_mountstats_nfs_operations_major_timeouts_total", values, **NFS,
                      operation="WRITE")

    ckpt = {"mountpoint": "/checkpoints", "fstype": "ext4"}
    cases = [
        *_case("checkpoint filesystem remounted read-only", "FilesystemReadOnly",
               [b.node("node_filesystem_readonly", "0x40 1x40", **CKPT)],
               [b.node("node_filesystem_readonly", "1x80", **CKPT)], "25m", ckpt,
               f"/checkpoints on n1 is read-only (readonly = 1) {REMOUNTED}"),
        *_case("checkpoint filesystem 1% free", "FilesystemFull",
               [size, b.node("node_filesystem_avail_bytes", "1e11x40 1e10x40", **CKPT)],
               [size, b.node("node_filesystem_avail_bytes", "5e11x80", **CKPT)], "26m", ckpt,
               "/checkpoints on n1 has 1% free (full below 3%)."),
        *_case("NFS major timeouts", "SharedFilesystemNotResponding",
               [mount_info, timeouts("0x20 0+2x60")], [mount_info, timeouts("0x80")], "26m",
               {"mountpoint": "/mnt/nfs/test", "fstype": "nfs"},
               "/mnt/nfs/test on n1 is not answering (statfs failing, or 40 NFS major "
               "timeout(s) in the last 10 minutes)."),
        *_case("NFSv4 checkpoint export remounted read-only", "SharedFilesystemReadOnly",
               [b.node("node_filesystem_readonly", "0x40 1x40", **SHARED)],
               [b.node("node_filesystem_readonly", "1x80", **SHARED)], "25m",
               {"mountpoint": "/mnt/ckpt", "fstype": "nfs4"},
               f"/mnt/ckpt on n1 is read-only (readonly = 1) {REMOUNTED}"),
        *_case("Lustre 1% free", "SharedFilesystemFull",
               [b.node("node_filesystem_size_bytes", "1e12x80", **LUSTRE),
                b.node("node_filesystem_avail_bytes", "1e11x40 1e10x40", **LUSTRE)],
               [b.node("node_filesystem_size_bytes", "1e12x80", **LUSTRE),
                b.node("node_filesystem_avail_bytes", "5e11x80", **LUSTRE)], "26m",
               {"mountpoint": "/lustre", "fstype": "lustre"},
               "/lustre on n1 has 1% free (full below 3%)."),
        *_case("smartctl_device_smart_status failed", "LocalDiskFailing",
               [smartctl("smartctl_device_smart_status", "/dev/nvme0", "0x80")],
               [smartctl("smartctl_device_smart_status", "/dev/nvme0", "1x80")], "10m",
               {"device": "/dev/nvme0", "check": "smart_status failed"},
               "Disk /dev/nvme0 on n1: smart_status failed (value 0; smartctl_exporter)."),
    ]
    cases.append(b.Case("FilesystemNotResponding: statfs failing (device_error)",
                        "FilesystemNotResponding",
                        [*_base(), b.node("node_filesystem_device_error", "0x20 1x60",
                                          **{**CKPT, "mountpoint": "/scratch"})], "20m",
                        [b.Expect({**_run(), "mountpoint": "/scratch", "fstype": "ext4"},
                                  "/scratch on n1 is not answering (statfs failing, or 1 NFS "
                                  "major timeout(s) in the last 10 minutes).")]))
    # the condition once subtracted mounts read-only for the whole last hour, so
    # a remount ended its own alert an hour later; it holds while the mount stays read-only.
    # (80 minutes, 70 of them read-only, evaluated every 30 s: the old rule had ended at 70.)
    long = [b.Series(s.name, s.labels, "1x170") for s in _base()]
    cases.append(b.Case("FilesystemReadOnly: still read-only 70 minutes after the remount",
                        "FilesystemReadOnly",
                        [*long, b.node("node_filesystem_readonly", "0x20 1x150", **CKPT)],
                        "1h20m",
                        [b.Expect({**_run(), **ckpt}, "/checkpoints on n1 is read-only "
                                  f"(readonly = 1) {REMOUNTED}")]))
    cases.append(b.Case("FilesystemReadOnly: read-only from boot is never alerted on, however "
                        "long", "FilesystemReadOnly",
                        [*long, b.node("node_filesystem_readonly", "1x170", **CKPT)], "1h20m",
                        also_at=("5m",)))
    cases.append(b.Case("FilesystemReadOnly: a shared filesystem is the storage service's",
                        "FilesystemReadOnly",
                        [*_base(), b.node("node_filesystem_readonly", "0x40 1x40", **SHARED)],
                        "25m"))
    cases.append(b.Case("FilesystemNotResponding: NFS timeouts are the storage service's",
                        "FilesystemNotResponding",
                        [*_base(), mount_info, timeouts("0x20 0+2x60")], "26m"))
    cases.append(b.Case("FilesystemReadOnly: pseudo filesystems are never alerted on",
                        "FilesystemReadOnly",
                        [*_base(), b.node("node_filesystem_readonly", "0x40 1x40",
                                          device="/dev/loop3", fstype="squashfs",
                                          mountpoint="/snap/core/1")], "25m"))
    cases.append(b.Case("LocalDiskFailing: NVMe critical warning", "LocalDiskFailing",
                        [*_base(), smartctl("smartctl_device_critical_warning", "/dev/nvme0",
                                            "4x80")], "10m",
                        [b.Expect({**_run(), "device": "/dev/nvme0",
                                   "check": "NVMe critical warning"},
                                  "Disk /dev/nvme0 on n1: NVMe critical warning (value 4; "
                                  "smartctl_exporter).")]))
    return cases


def lifecycle_cases() -> list[b.Case]:
    """Unplanned reboots (and planned ones, which are not), maintenance."""
    rebooted = b.node("node_boot_time_seconds", "1000x30 _x9 2000x40")
    cases = [
        *_case("node_boot_time_seconds advanced", "NodeRebooted", [rebooted],
               [b.node("node_boot_time_seconds", "1000x80")], "25m", {},
               "n1 booted again at 1970-01-01 00:33:20 +0000 UTC (node_boot_time_seconds "
               "moved later), with no maintenance state seen in the last 30 minutes."),
        # Slurm's own reason for a node back with a new boot time names a reboot,
        # but an unplanned one (SchedMD/slurm src/slurmctld/node_mgr.c)
        *_case("Slurm: Node unexpectedly rebooted", "NodeRebooted",
               [rebooted, state("n1", "slurm", "DOWN", UNEXPECTED, "_x30 1x50")],
               [state("n1", "slurm", "DOWN", UNEXPECTED, "_x30 1x50")], "25m", {},
               "n1 booted again at 1970-01-01 00:33:20 +0000 UTC (node_boot_time_seconds "
               "moved later), with no maintenance state seen in the last 30 minutes."),
        *_case("Slurm MAINT reservation", "NodeMaintenance",
               [state("n1", "slurm", "IDLE+MAINT+RESERVED", "firmware update")],
               [state("n1", "slurm", "ALLOCATED", "")], "5m",
               {"scheduler": "slurm", "state": "IDLE+MAINT+RESERVED", "reason": "firmware update"},
               "The slurm state of n1 is IDLE+MAINT+RESERVED (reason: firmware update; value 1)."),
    ]
    taint = ("taint aws-node-termination-handler/scheduled-maintenance=i-0abc:NoSchedule")
    cases.append(b.Case("NodeMaintenance: Kubernetes scheduled-maintenance taint",
                        "NodeMaintenance",
                        [*_base(), state("n1", "kubernetes", "Ready,Tainted", taint)], "5m",
                        [b.Expect({**_run(), "scheduler": "kubernetes", "state": "Ready,Tainted",
                                   "reason": taint},
                                  f"The kubernetes state of n1 is Ready,Tainted (reason: "
                                  f"{taint}; value 1).")]))
    cases.append(b.Case("NodeMaintenance: a drain for a hardware fault is no maintenance",
                        "NodeMaintenance",
                        [*_base(), state("n1", "slurm", "IDLE+DRAIN",
                                         "wandb-infra: GpuXidError gpu-07 GPU 3")], "5m"))
    cases.append(b.Case("NodeMaintenance: Slurm's 'Node unexpectedly rebooted' is no maintenance",
                        "NodeMaintenance",
                        [*_base(), state("n1", "slurm", "DOWN", UNEXPECTED)], "5m"))
    cases.append(b.Case("NodeRebooted: a reboot during maintenance is planned", "NodeRebooted",
                        [*_base(), rebooted,
                         state("n1", "slurm", "REBOOT_ISSUED+DRAIN", "kernel update",
                               "1x30 _x50")], "25m"))
    return cases


def fabric_cases(sp: str) -> list[b.Case]:
    """NVSwitch fatal SXids (current and legacy field name) and Fabric Manager status."""
    bg = b.healthy_gpus(sp)

    def switch(metric: str, values: str) -> b.Series:
        return b.Series(metric, {sp: "n1", "nvswitch": "0", "instance": "n1:9400",
                                 "job": "dcgm"}, values)

    cases = []
    for metric in ("DCGM_FI_DEV_SXID_FATAL_ERROR", "DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS"):
        cases += _case(f"{metric} ({sp})", "NvswitchFatalError",
                       [*bg, switch(metric, "0x20 24x60")], [*bg, switch(metric, "0x80")],
                       "15m", {"nvswitch": "0"}, "NVSwitch 0 on n1 reported fatal SXid 24.")
    cases += _case(f"Fabric Manager failure ({sp})", "FabricManagerNotReady",
                   [*bg, b.dcgm(sp, "DCGM_FI_DEV_FABRIC_MANAGER_STATUS", "4x80")],
                   [*bg, b.dcgm(sp, "DCGM_FI_DEV_FABRIC_MANAGER_STATUS", "3x80")], "10m",
                   {"gpu": "0"},
                   "The Fabric Manager status of GPU 0 on n1 is 4 (1 not started, 4 failure, 5 "
                   "unrecognized, 6 NVML too old; 3 is success).")
    return cases


def power_cases() -> list[b.Case]:
    """ipmi_exporter sensors (docs/metrics.md label sets)."""
    cable = ipmi("ipmi_sensor_state", "0x80", id="139", name="Power Cable",
                 type="Cable/Interconnect")
    cases = [
        *_case("ipmi_power_state critical", "HostPowerSupplyFault",
               [cable, ipmi("ipmi_power_state", "0x20 2x60", id="90", name="Pwr Consumption")],
               [cable, ipmi("ipmi_power_state", "0x80", id="90", name="Pwr Consumption")],
               "20m", {"name": "Pwr Consumption"},
               "IPMI sensor Pwr Consumption on n1 is critical (state 2)."),
        *_case("ipmi_fan_speed_state critical", "HostChassisSensorCritical",
               [cable, ipmi("ipmi_fan_speed_state", "0x20 2x60", id="12", name="Fan1A")],
               [cable, ipmi("ipmi_fan_speed_state", "1x80", id="12", name="Fan1A")],
               "20m", {"name": "Fan1A"}, "IPMI sensor Fan1A on n1 is critical (state 2)."),
    ]
    cases.append(b.Case("HostPowerSupplyFault: a Power Supply sensor critical",
                        "HostPowerSupplyFault",
                        [*_base(), cable, ipmi("ipmi_sensor_state", "2x80", id="77",
                                               name="PS1 Status", type="Power Supply")], "10m",
                        [b.Expect({**_run(), "name": "PS1 Status"},
                                  "IPMI sensor PS1 Status on n1 is critical (state 2).")]))
    # ipmi_exporter scraping the BMC remotely: ``instance`` is the BMC's address, the scrape
    # config's ``hostname`` target label names the node.
    remote = b.Series("ipmi_sensor_state", {"instance": "10.1.0.17:9290", "job": "ipmi",
                                            "hostname": "n1", "id": "77", "name": "PS1 Status",
                                            "type": "Power Supply"}, "2x80")
    cases.append(b.Case("HostPowerSupplyFault: a BMC scraped remotely is named by its hostname "
                        "target label", "HostPowerSupplyFault", [*_base(), remote], "10m",
                        [b.Expect({**_run(), "name": "PS1 Status"},
                                  "IPMI sensor PS1 Status on n1 is critical (state 2).")]))
    cases.append(b.Case("HostPowerSupplyFault: a power supply in warning state is not critical",
                        "HostPowerSupplyFault",
                        [*_base(), cable, ipmi("ipmi_sensor_state", "1x80", id="77",
                                               name="PS1 Status", type="Power Supply")], "10m"))
    return cases


def repeat_cases() -> list[b.Timeline]:
    """The third hardware-fault episode of one GPU within the window (XID 48, counted by
    dcgm-exporter), and a GPU with two. Both repeat-offender alerts are checked on the same
    series, one timeline each way: each test costs every rule at each of its 200 steps."""
    long = "1x220"
    run = [b.Series(s.name, s.labels, long if s.values == "1x80" else "40x220")
           for s in (b.node_info(b.RUN_A), b.gpu_info(b.RUN_A, "0"), *b.healthy_gpus("hostname"))]
    episode = "1x10 0x50 "

    def xids(n: int) -> b.Series:
        return b.dcgm("hostname", "DCGM_EXP_XID_ERRORS_COUNT",
                      (episode * n) + "0x" + str(220 - 61 * n), xid="48",
                      window_size_in_ms="300000")

    gpu = b.Expect({**_run(), "gpu": "0", "gpu_uuid": "GPU-n1-0"},
                   "GPU 0 on n1 had 3 hardware faults in the last 7 days (repeat offender from 3).")
    host = b.Expect({"hostname": "n1"}, "n1 had 3 hardware-fault episodes in the last 7 days "
                                        "(repeat offender from 3).")
    return [
        b.Timeline("GpuRepeatOffender, HostRepeatOffender: third XID episode in the window",
                   [*run, xids(3)], "30s",
                   [("GpuRepeatOffender", ("100m",), [gpu]),
                    ("HostRepeatOffender", ("100m",), [host])]),
        b.Timeline("GpuRepeatOffender, HostRepeatOffender: healthy twin of third XID episode in "
                   "the window", [*run, xids(2)], "30s",
                   [("GpuRepeatOffender", ("100m",), []), ("HostRepeatOffender", ("100m",), [])]),
    ]


def cases() -> list[b.Case | b.Timeline]:
    """Every issue-28 case, for ``host_alerts.test.yml``."""
    return [*memory_cases(), *storage_cases(), *lifecycle_cases(), *fabric_cases("Hostname"),
            *fabric_cases("hostname"), *power_cases(), *repeat_cases()]
