"""Names of the normalised series the recording rules produce (``level:metric:operations``).

Alerts, dashboards and the bridge's post-mortem queries read these instead of raw exporter metrics,
so dcgm-exporter versions (``Hostname`` vs ``hostname``, 4.9 renames, ns vs us counters) and the
missing hostname on node_exporter series are handled once, in ``alert_rules/``.

Levels: ``gpu`` = (hostname, gpu, gpu_uuid); ``gpu_xid`` adds ``xid``; ``hostname``; ``link`` =
(hostname, device, port) for InfiniBand; ``interface`` = (hostname, device); ``instance`` keeps the
scrape target's (instance, job); ``wandb_run_gpu`` = run labels + hostname + gpu;
``wandb_run_hostname`` = run labels + hostname; ``wandb_run`` = run labels.
The operations part says what was done: ``max`` (one series per entity whatever the exporter
replicas), ``sum`` (counters added), ``rate10m``/``increase10m``/``avg2m`` (over that window),
``ratio_rate5m`` (a rate as a fraction of time), ``from_warning``/``with_hw_bits`` (kept only
from a threshold up), ``count``; a suffix such as ``_1h`` or ``not_active`` names the selection.

Almost every record is sparse: only entities with a fault or past a threshold have a series
(error counters, violation rates, temperatures from the warning threshold, clock-event bitmasks
with a hardware slowdown bit, links down now or idle all hour, GPUs stalled or idle all hour,
straggling GPUs); read a missing series as "healthy". Dense: GPU presence and the host's GPU
count. Telemetry for dashboards (temperatures, utilisation, activity, memory, power, link state)
is read straight from the exporters at query time (``dcgm_gpu``; a dense per-GPU record of each
costs a 16,000-GPU cluster seconds of evaluation every cycle), and run attribution reads the
contract-1 join metrics directly (see ``alert_rules/attribution.py``).
"""

from __future__ import annotations

from decimal import Decimal

from wandb_infra.catalog.template import fill
from wandb_infra.common import labels as L

# dcgm-exporter per-GPU fields: every name it has had (up to 4.8 / since 4.9) with the factor to
# the normalised unit (utilisation 0..100 -> ratio, MiB -> bytes).
Field = tuple[tuple[str, str], ...]
DCGM_GPU_TEMP: Field = (("DCGM_FI_DEV_GPU_TEMP", ""), ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", ""))
DCGM_MEMORY_TEMP: Field = (("DCGM_FI_DEV_MEMORY_TEMP", ""),
                           ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", ""))
DCGM_GPU_UTIL: Field = (("DCGM_FI_DEV_GPU_UTIL", " / 100"), ("DCGM_FI_DEV_GPU_UTIL_RATIO", ""))
DCGM_TENSOR_ACTIVE: Field = (("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", ""),
                             ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", ""))
DCGM_FB_USED: Field = (("DCGM_FI_DEV_FB_USED", " * 1048576"),)
DCGM_POWER_USAGE: Field = (("DCGM_FI_DEV_POWER_USAGE", ""), ("DCGM_FI_DEV_BOARD_POWER_WATTS", ""))
# Pages retired: go-dcgm's current names (PAGE_RETIRED_*) and the legacy ones dcgm-exporter
# <= 4.8 exports.
DCGM_RETIRED_SBE: Field = (("DCGM_FI_DEV_RETIRED_SBE", ""),
                           ("DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL", ""))
DCGM_RETIRED_DBE: Field = (("DCGM_FI_DEV_RETIRED_DBE", ""),
                           ("DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL", ""))
DCGM_RETIRED_PENDING: Field = (("DCGM_FI_DEV_RETIRED_PENDING", ""),
                               ("DCGM_FI_DEV_PAGE_RETIRED_PENDING", ""))
DCGM_CLOCK_EVENT_REASONS: Field = (("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", ""),
                                   ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", ""))

# Windows the records are computed over; the record names, the alert descriptions and the
# dashboards print these, so a window is changed here once.
VIOLATION_WINDOW = "5m"  # throttling counters: the share of time throttled
WEAR_WINDOW = "10m"  # memory and interconnect error counters
FLAP_WINDOW = "15m"  # link flaps and carrier changes
UTIL_WINDOW = "2m"  # utilisation averaged before comparing a run's GPUs
HISTORY_WINDOW = "1h"  # "was it healthy/active/present within the hour"
XID_RECENT = "10m"  # how long a new XID code stays an event
# dcgm-exporter's --xid-count-window-size: DCGM_EXP_XID_ERRORS_COUNT counts XIDs over this.
XID_COUNT_WINDOW = "5m"
# Prometheus' lookback: a series not scraped (or recorded) for this long is gone.
LOOKBACK = "5m"

# dcgm's clock-event reasons bitmask (DCGM_FI_DEV_CLOCKS_EVENT_REASONS), the bits read here.
CLOCK_SW_POWER_CAP = 0x4
CLOCK_HW_SLOWDOWN = 0x8
CLOCK_SW_THERMAL = 0x20
CLOCK_HW_THERMAL = 0x40
CLOCK_HW_POWER_BRAKE = 0x80
CLOCK_EVENT_NAMES: dict[int, str] = {
    CLOCK_HW_THERMAL: "HW thermal", CLOCK_HW_SLOWDOWN: "HW slowdown",
    CLOCK_HW_POWER_BRAKE: "HW power brake", CLOCK_SW_THERMAL: "SW thermal",
    CLOCK_SW_POWER_CAP: "SW power cap",
}
# node_infiniband_state_id of a working port (1 down, 2 init, 3 armed, 4 active).
IB_STATE_ACTIVE = 4

GPU_PRESENT = "gpu:dcgm_gpu:present"
GPU_TEMP_HOT = "gpu:dcgm_gpu_temp:max_from_warning"
MEMORY_TEMP_HOT = "gpu:dcgm_memory_temp:max_from_warning"
THERMAL_VIOLATION = f"gpu:dcgm_thermal_violation:ratio_rate{VIOLATION_WINDOW}"
POWER_VIOLATION = f"gpu:dcgm_power_violation:ratio_rate{VIOLATION_WINDOW}"
CLOCK_EVENT_REASONS = "gpu:dcgm_clock_event_reasons:max_with_hw_bits"
PCIE_REPLAY_RATE = f"gpu:dcgm_pcie_replay:rate{WEAR_WINDOW}"
NVLINK_CRC_RATE = f"gpu:dcgm_nvlink_crc_errors:rate{WEAR_WINDOW}"
NVLINK_REPLAY_RECOVERY = f"gpu:dcgm_nvlink_replay_recovery_errors:increase{WEAR_WINDOW}"
ECC_DBE = f"gpu:dcgm_ecc_dbe_volatile:increase{WEAR_WINDOW}"
ECC_SBE = f"gpu:dcgm_ecc_sbe_volatile:increase{WEAR_WINDOW}"
RETIRED_PAGES = "gpu:dcgm_retired_pages:sum"
RETIRED_PENDING = "gpu:dcgm_retired_pending:max"
ROW_REMAP_FAILURE = "gpu:dcgm_row_remap_failure:max"
ROW_REMAP_PENDING = "gpu:dcgm_row_remap_pending:max"
UNCORRECTABLE_ROWS = "gpu:dcgm_uncorrectable_remapped_rows:max"
XID_EVENTS = "gpu_xid:dcgm_xid_errors:recent"
GPU_RECOVERY_ACTION = "gpu:dcgm_gpu_recovery_action:max"

HOST_GPU_COUNT = "hostname:dcgm_gpus:count"
NODE_EXPORTER_TARGET = "instance:node_exporter_hostname:info"
DCGM_EXPORTER_TARGET = "instance:dcgm_exporter_hostname:info"
DCGM_TARGETS_LAGGING_RUNS = "instance:dcgm_exporter_hostname:lagging_run_hosts"
TARGET_HOSTS = f"instance:telemetry_target_hostname:info_{HISTORY_WINDOW}"
# Every scrape target down now (up == 0), all its labels kept: up read once per cycle for every
# rule and alert that asks which targets are down (several read the whole of up otherwise).
UP_DOWN = "instance:up:down"
TARGET_DOWN = "hostname:telemetry_target:down"
# Hosts gone as nodes, not only as telemetry: node_exporter down together with dcgm-exporter, or
# with the scheduler saying the node is down, or on a host with no other exporter.
NODE_LOST = "hostname:telemetry_target:node_lost"
TARGET_VANISHED = f"hostname:telemetry_target:vanished_{HISTORY_WINDOW}"
# Hosts whose only telemetry target is node_exporter (CPU nodes, or dcgm-exporter never ran):
# node_exporter down there is a node lost, with no second exporter to ask.
NODE_EXPORTER_ONLY = "hostname:telemetry_target:node_exporter_only"
HOST_GPU_COUNT_DROP = f"hostname:dcgm_gpus:dropped_{HISTORY_WINDOW}"
TARGET_LABEL = "exporter"
# This project's own exporter and bridge targets, labelled with their ``component``: seen within
# the hour, or down (up == 0) since; the pipeline's down alerts read it.
PIPELINE_TARGETS = "instance:wandb_infra_target:remembered"
PIPELINE_LABEL = "component"

IB_PORT_DOWN = "link:node_infiniband_state_id:not_active"
IB_PORT_IDLE_1H = f"link:node_infiniband_state_id:not_active_{HISTORY_WINDOW}"
IB_FLAPS = f"link:node_infiniband_link_flaps:increase{FLAP_WINDOW}"
IB_PHYSICAL_ERRORS = f"link:node_infiniband_physical_errors:rate{WEAR_WINDOW}"
NET_DOWN = "interface:node_network_up:down"
NET_IDLE_1H = f"interface:node_network_up:down_{HISTORY_WINDOW}"
NET_CARRIER_CHANGES = f"interface:node_network_carrier_changes:increase{FLAP_WINDOW}"

GPU_VANISHED = f"gpu:dcgm_gpu:vanished_{HISTORY_WINDOW}"
GPU_STALLED = "gpu:dcgm_tensor_active:stalled"
GPU_IDLE_1H = f"gpu:dcgm_tensor_active:idle_{HISTORY_WINDOW}"
POD_GPU_ROWS = "wandb_run_gpu:dcgm_exporter_pod:info"
RUN_HOSTS_GPU_ROWLESS = "wandb_run_hostname:wandb_run_gpu_info:absent"
RUN_PODS_GPUS_UNKNOWN = "wandb_run_pod:wandb_run_pod_info:without_gpu_rows"
GPU_HUNG = "gpu:dcgm_tensor_active:hung"
RUN_HOST_STALLED_SOLE = "wandb_run_hostname:dcgm_tensor_active:stalled_as_sole_run"
RUN_HOST_STALLED = "wandb_run_hostname:dcgm_tensor_active:stalled"
RUN_HOSTS_GPUS_UNKNOWN = "wandb_run_hostname:wandb_run_gpus_unknown:max"
RUN_HOSTS_SOLE_GPULESS = "wandb_run_hostname:wandb_run_gpus_unknown:sole"
GPU_UTIL_LAGGING = f"gpu:dcgm_gpu_util:lagging_avg{UTIL_WINDOW}"
RUN_GPUS_LAGGING = f"wandb_run_gpu:dcgm_gpu_util:lagging_avg{UTIL_WINDOW}"
LAGGING_RUN_GPU_ROWS = "wandb_run_gpu:wandb_run_gpu_info:of_lagging_runs"
GPU_UTIL_LAGGING_RUN_HOSTS = f"gpu:dcgm_gpu_util:avg{UTIL_WINDOW}_on_lagging_run_hosts"
RUN_GPU_UTIL_BUSIEST = f"wandb_run:dcgm_gpu_util:max_avg{UTIL_WINDOW}"
RUN_GPU_STRAGGLING = f"wandb_run_gpu:dcgm_gpu_util:straggling_avg{UTIL_WINDOW}"

# --- host memory, storage, reboots and maintenance, NVSwitch, power, repeat offenders -
# Levels: ``filesystem`` = (hostname, mountpoint); ``hostname`` as above. node_exporter series are
# named by host through NODE_EXPORTER_TARGET; smartctl_exporter and ipmi_exporter series carry no
# host name, so theirs comes from a ``hostname`` target label when the scrape config sets one,
# else from the host part of ``instance`` (alert_rules/normalise.py, ``exporter_host``).
HOST_OOM_KILLS = f"hostname:node_vmstat_oom_kill:increase{WEAR_WINDOW}"
HOST_MEMORY_PRESSURE = f"hostname:node_pressure_memory_stalled:ratio_rate{VIOLATION_WINDOW}"
HOST_MEMORY_AVAILABLE_LOW = f"hostname:node_memory_available:max_ratio{VIOLATION_WINDOW}_low"
HOST_EDAC_UNCORRECTABLE = "hostname:node_edac_uncorrectable_errors:max"
HOST_EDAC_CORRECTABLE = f"hostname:node_edac_correctable_errors:increase{WEAR_WINDOW}"
FS_READONLY = "filesystem:node_filesystem_readonly:now"
# Read-only since a remount seen here (writable within WEAR_WINDOW when it turned read-only), held
# from its own previous evaluation while it stays so: a mount read-only from boot never enters.
FS_READONLY_REMOUNTED = "filesystem:node_filesystem_readonly:remounted"
FS_AVAIL_LOW = "filesystem:node_filesystem_avail:ratio_low"
FS_NOT_ANSWERING = f"filesystem:node_filesystem_device_error:not_answering_{WEAR_WINDOW}"
HOST_BOOTED = "hostname:node_boot_time_seconds:advanced"
NODE_MAINTENANCE = "hostname:wandb_infra_node_state:maintenance"
DISK_FAILING = "hostname:smartctl_device:failing"
NVSWITCH_FATAL = "hostname:dcgm_nvswitch_fatal_error:max"
FABRIC_MANAGER_DOWN = "gpu:dcgm_fabric_manager_status:not_ready"
IPMI_POWER_FAULT = "hostname:ipmi_power_sensor_state:max_critical"
IPMI_CHASSIS_CRITICAL = "hostname:ipmi_sensor_state:max_critical"
HOST_HARDWARE_FIRING = "hostname:hardware_alerts:firing"
HOST_HARDWARE_SINCE = "hostname:hardware_alerts:episode_start"
GPU_HARDWARE_FIRING = "gpu:hardware_alerts:firing"
GPU_HARDWARE_SINCE = "gpu:hardware_alerts:episode_start"
GPU_HARDWARE_EPISODES = "gpu:hardware_alerts:episodes_7d"
# A boot time that moved later by more than this is a reboot (btime jitters by a second).
BOOT_WINDOW = "30m"  # how long a reboot stays an alert after the node is back
REPEAT_WINDOW = "7d"  # repeat offenders: hardware faults counted over this window
# Filesystems a run reads or writes (data, checkpoints, scratch): local and shared; the others
# (pseudo, overlay, squashfs, boot partitions) are never alerted on. A shared (network) one is
# served by a storage service every node mounts: its faults are that service's, not the node's
# (FUSE mounts count as shared: on training nodes they are object-store and network clients such
# as gcsfuse, s3fs, blobfuse or JuiceFS).
LOCAL_FSTYPES = "ext[234]|xfs|btrfs|zfs"
NETWORK_FSTYPES = "nfs4?|lustre|gpfs|beegfs|wekafs|ceph|cifs|fuse[.].*"
RUN_FSTYPES = f"{LOCAL_FSTYPES}|{NETWORK_FSTYPES}"
RUN_FILESYSTEMS = f'fstype=~"{RUN_FSTYPES}",mountpoint!~"/boot(/.*)?"'

# Every record above by its constant's name: the placeholders the catalog's PromQL templates use
# (``${ECC_DBE}``).
RECORDS: dict[str, str] = {
    name: value for name, value in dict(globals()).items()
    if name.isupper() and isinstance(value, str) and value.count(":") == 2
}


def span(duration: str) -> str:
    """A window as prose: ``10m`` -> ``10 minutes``, ``1h`` -> ``hour`` ("in the last hour")."""
    number, unit = int(duration[:-1]), duration[-1]
    word = {"s": "second", "m": "minute", "h": "hour", "d": "day"}[unit]
    if number == 1:
        return word
    return f"{number} {word}s"


def dcgm_raw(field: Field, *, matchers: str = "", fn: str = "", window: str = "",
             cut: str = "", only: str = "", unit: bool = True) -> str:
    """A field read from dcgm-exporter in its normalised unit, labels as scraped.

    Names sharing a factor are read with one selector (no ``or`` between them); ``fn`` and
    ``window`` make it ``fn(name[window])``; ``cut`` (e.g. ``" >= 85"``) and ``only`` (a set
    operation, e.g. ``" and on (instance, job) targets"``) filter each part first, in the
    exporter's unit, so the factor multiplies only the series left (on every GPU of a cluster,
    arithmetic costs about as much as reading the series). With ``only`` the parts are long, so
    each goes on a line of its own. ``unit=False`` leaves the values in the exporter's unit, for
    the right side of ``and``/``unless``, whose values nothing reads.
    """
    by_factor: dict[str, list[str]] = {}
    for name, factor in field:
        by_factor.setdefault(factor, []).append(name)
    parts = []
    for factor, names in by_factor.items():
        match = ",".join(m for m in (f'__name__=~"{"|".join(names)}"', matchers) if m)
        expr = f"{{{match}}}"
        if fn:
            expr = f"{fn}({expr}[{window}])"
        filters = (_unscaled(cut, factor) if cut and factor else cut) + only
        scale = factor if unit else ""
        parts.append(f"({expr}{filters}){scale}" if filters and scale
                     else f"{expr}{filters}{scale}")
    return parts[0] if len(parts) == 1 else ("\nor " if only else " or ").join(
        f"({p})" for p in parts)


def _unscaled(cut: str, factor: str) -> str:
    """``cut`` (``" < 0.9"``) as the same comparison before ``factor`` (``" / 100"``): ``" < 90"``.
    Decimal arithmetic, so the threshold prints as written (0.9 x 100 is 90, not 90.00000000000001).
    """
    if len(cut.split()) != 2 or len(factor.split()) != 2:
        raise ValueError(f"cut {cut!r} with factor {factor!r}: 'op number' each is expected")
    compare, threshold = cut.split()
    scale, by = factor.split()
    if scale not in ("*", "/") or Decimal(by) <= 0:
        raise ValueError(f"factor {factor!r}: a positive * or / constant is expected")
    raw = Decimal(threshold) / Decimal(by) if scale == "*" else Decimal(threshold) * Decimal(by)
    return f" {compare} {raw.normalize():f}"


def dcgm_gpu(field: Field, host_re: str, gpu_re: str, fn: str = "", window: str = "") -> str:
    """Per-GPU series of a field for a query (dashboards): both host label spellings
    (``Hostname`` up to dcgm-exporter 4.8.2, ``hostname`` after), the host name short or with its
    domain, and the 4.9 names. The result keeps the labels the exporter sent (no
    ``label_replace``, so dashboard variables stay the only ``$`` names)."""
    host = f"({host_re})(\\\\..+)?"  # the exporters' FQDN of a canonical (short) host name
    new = dcgm_raw(field, matchers=f'hostname=~"{host}",gpu=~"{gpu_re}"', fn=fn, window=window)
    old = dcgm_raw(field, matchers=f'Hostname=~"{host}",gpu=~"{gpu_re}"', fn=fn, window=window)
    return f"max by (Hostname, hostname, gpu) (({new}) or ({old}))"


# Interfaces that are not the node's own links (containers, bridges, tunnels): never alerted on.
VIRTUAL_INTERFACES = ("lo|docker.*|veth.*|cali.*|flannel.*|cni.*|virbr.*|br-.*|tun.*|tap.*|"
                      "kube.*|vxlan.*|tunl.*|dummy.*|nodelocaldns.*|lxc.*|genev.*")
PHYSICAL_INTERFACES = f'device!~"{VIRTUAL_INTERFACES}"'


NODE_WITH_HOST = """
max by (hostname, ${BY}) (
  max by (instance, job, ${BY}) (${INNER})
  * on (instance, job) group_left (hostname) ${TARGET}
)
"""


def node_with_host(inner: str, by: str, host_re: str = "") -> str:
    """node_exporter series (which carry no host name) with the ``hostname`` of their target,
    one series per host and ``by`` labels; ``host_re`` keeps only matching hosts.

    Other labels are dropped before the join, so it builds small label sets.
    """
    target = NODE_EXPORTER_TARGET + (f'{{{L.HOSTNAME}=~"{host_re}"}}' if host_re else "")
    return fill(NODE_WITH_HOST, {"BY": by, "INNER": inner, "TARGET": target})
