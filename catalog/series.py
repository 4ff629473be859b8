"""Names of the normalised series the recording rules produce (``level:metric:operations``).

Alerts, dashboards and the bridge's post-mortem queries read these instead of raw exporter metrics,
so dcgm-exporter versions (``Hostname`` vs ``hostname``, 4.9 renames, ns vs us counters) and the
missing hostname on node_exporter series are handled once, in ``alert_rules/``.

Levels: ``gpu`` = (hostname, gpu, gpu_uuid); ``gpu_xid`` adds ``xid``; ``hostname``; ``link`` =
(hostname, device, port) for InfiniBand; ``interface`` = (hostname, device); ``instance`` keeps the
scrape target's (instance, job); ``wandb_run_gpu`` = run labels + hostname + gpu;
``wandb_run_hostname`` = run labels + hostname; ``wandb_run`` = run labels.

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

GPU_PRESENT = "gpu:dcgm_gpu:present"
GPU_TEMP_HOT = "gpu:dcgm_gpu_temp:celsius_hot"
MEMORY_TEMP_HOT = "gpu:dcgm_memory_temp:celsius_hot"
THERMAL_VIOLATION = "gpu:dcgm_thermal_violation:ratio_rate5m"
POWER_VIOLATION = "gpu:dcgm_power_violation:ratio_rate5m"
CLOCK_EVENT_REASONS = "gpu:dcgm_clock_event_reasons:bitmask"
PCIE_REPLAY_RATE = "gpu:dcgm_pcie_replay:rate10m"
NVLINK_CRC_RATE = "gpu:dcgm_nvlink_crc_errors:rate10m"
NVLINK_REPLAY_RECOVERY = "gpu:dcgm_nvlink_replay_recovery_errors:increase10m"
ECC_DBE = "gpu:dcgm_ecc_dbe_volatile:increase10m"
ECC_SBE = "gpu:dcgm_ecc_sbe_volatile:increase10m"
RETIRED_PAGES = "gpu:dcgm_retired_pages:sum"
RETIRED_PENDING = "gpu:dcgm_retired_pending:max"
ROW_REMAP_FAILURE = "gpu:dcgm_row_remap_failure:max"
ROW_REMAP_PENDING = "gpu:dcgm_row_remap_pending:max"
UNCORRECTABLE_ROWS = "gpu:dcgm_uncorrectable_remapped_rows:max"
XID_EVENTS = "gpu_xid:dcgm_xid_errors:recent"

HOST_GPU_COUNT = "hostname:dcgm_gpus:count"
NODE_EXPORTER_TARGET = "instance:node_exporter_hostname:info"
DCGM_EXPORTER_TARGET = "instance:dcgm_exporter_hostname:info"
TARGET_HOSTS = "instance:telemetry_target_hostname:info_1h"
TARGET_DOWN = "hostname:telemetry_target:down"
TARGET_VANISHED = "hostname:telemetry_target:vanished_1h"
HOST_GPU_COUNT_DROP = "hostname:dcgm_gpus:dropped_1h"
TARGET_LABEL = "exporter"

IB_PORT_DOWN = "link:node_infiniband_state_id:not_active"
IB_PORT_IDLE_1H = "link:node_infiniband_state_id:not_active_1h"
IB_FLAPS = "link:node_infiniband_link_flaps:increase15m"
IB_PHYSICAL_ERRORS = "link:node_infiniband_physical_errors:rate10m"
NET_DOWN = "interface:node_network_up:down"
NET_IDLE_1H = "interface:node_network_up:down_1h"
NET_CARRIER_CHANGES = "interface:node_network_carrier_changes:increase15m"

GPU_VANISHED = "gpu:dcgm_gpu:vanished_1h"
GPU_STALLED = "gpu:dcgm_tensor_active:stalled"
GPU_IDLE_1H = "gpu:dcgm_tensor_active:idle_1h"
POD_GPU_ROWS = "wandb_run_gpu:dcgm_exporter_pod:info"
RUN_GPUS_STALLED = "wandb_run_gpu:wandb_run_gpu_info:on_stalled_hosts"
RUN_HOST_STALLED = "wandb_run_hostname:dcgm_tensor_active:stalled"
RUN_HOSTS_GPUS_UNKNOWN = "wandb_run_hostname:wandb_run_gpus_unknown:max"
RUN_HOSTS_SOLE_GPULESS = "wandb_run_hostname:wandb_run_gpus_unknown:sole"
GPU_UTIL_LAGGING = "gpu:dcgm_gpu_util:lagging_avg2m"
RUN_GPUS_LAGGING = "wandb_run_gpu:dcgm_gpu_util:lagging_avg2m"
LAGGING_RUN_GPU_ROWS = "wandb_run_gpu:wandb_run_gpu_info:of_lagging_runs"
GPU_UTIL_LAGGING_RUN_HOSTS = "gpu:dcgm_gpu_util:avg2m_on_lagging_run_hosts"
RUN_GPU_UTIL_BUSIEST = "wandb_run:dcgm_gpu_util:max_avg2m"
RUN_GPU_STRAGGLING = "wandb_run_gpu:dcgm_gpu_util:straggling_avg2m"


def dcgm_raw(field: Field, *, matchers: str = "", fn: str = "", window: str = "",
             cut: str = "") -> str:
    """A field read from dcgm-exporter in its normalised unit, labels as scraped.

    Names sharing a factor are read with one selector (no ``or`` between them); ``fn`` and
    ``window`` make it ``fn(name[window])``; ``cut`` (e.g. ``" >= 85"``) filters each part first.
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
        parts.append(f"{expr}{factor}{cut}")
    return parts[0] if len(parts) == 1 else " or ".join(f"({p})" for p in parts)


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


def node_with_host(inner: str, by: str, host_re: str = "") -> str:
    """node_exporter series (which carry no host name) with the ``hostname`` of their target,
    one series per host and ``by`` labels; ``host_re`` keeps only matching hosts.

    Other labels are dropped before the join, so it builds small label sets.
    """
    target = NODE_EXPORTER_TARGET + (f'{{{L.HOSTNAME}=~"{host_re}"}}' if host_re else "")
    return (f"max by ({L.HOSTNAME}, {by}) (max by (instance, job, {by}) ({inner}) "
            f"* on (instance, job) group_left ({L.HOSTNAME}) {target})")
