"""Names of the normalised series the recording rules produce (``level:metric:operations``).

Alerts, dashboards and the bridge's post-mortem queries read these instead of raw exporter metrics,
so dcgm-exporter versions (``Hostname`` vs ``hostname``, 4.9 renames, ns vs us counters) and the
missing hostname on node_exporter series are handled once, in ``alert_rules/``.

Levels: ``gpu`` = (hostname, gpu, gpu_uuid); ``gpu_xid`` adds ``xid``; ``hostname``; ``link`` =
(hostname, device, port) for InfiniBand; ``interface`` = (hostname, device); ``instance`` keeps the
scrape target's (instance, job); ``wandb_run_gpu`` = run labels + hostname + gpu;
``wandb_run_hostname`` = run labels + hostname.

Error counters and violation rates (ECC, retired pages, row remaps, NVLink, PCIe, violations,
InfiniBand errors and flaps, interface carrier changes) are sparse: only entities with a non-zero
value have a series, which keeps evaluation cheap on large clusters; read a missing series as
zero. Dense: temperatures, utilisation, activity, memory,
power, clock-event bits, presence.
"""

from __future__ import annotations

GPU_PRESENT = "gpu:dcgm_gpu:present"
GPU_TEMP = "gpu:dcgm_gpu_temp:celsius"
MEMORY_TEMP = "gpu:dcgm_memory_temp:celsius"
GPU_UTIL = "gpu:dcgm_gpu_util:ratio"
TENSOR_ACTIVE = "gpu:dcgm_tensor_active:ratio"
FB_USED = "gpu:dcgm_fb_used:bytes"
POWER_USAGE = "gpu:dcgm_power_usage:watts"
THERMAL_VIOLATION = "gpu:dcgm_thermal_violation:ratio_rate5m"
POWER_VIOLATION = "gpu:dcgm_power_violation:ratio_rate5m"
CLOCK_EVENT_REASONS = "gpu:dcgm_clock_event_reasons:bitmask"
PCIE_REPLAY_RATE = "gpu:dcgm_pcie_replay:rate5m"
NVLINK_CRC_RATE = "gpu:dcgm_nvlink_crc_errors:rate5m"
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
TARGET_UP = "hostname:telemetry_target_up:min"
TARGET_LABEL = "exporter"

IB_STATE = "link:node_infiniband_state_id:max"
IB_FLAPS = "link:node_infiniband_link_flaps:increase15m"
IB_PHYSICAL_ERRORS = "link:node_infiniband_physical_errors:rate5m"
NET_UP = "interface:node_network_up:max"
NET_CARRIER_CHANGES = "interface:node_network_carrier_changes:increase15m"

RUN_GPUS = "wandb_run_gpu:wandb_run_gpu_info:max"
RUN_HOSTS = "wandb_run_hostname:wandb_run_node_info:max"
RUN_HOSTS_GPUS_UNKNOWN = "wandb_run_hostname:wandb_run_gpus_unknown:max"
RUN_GPU_ASSIGNMENT = "wandb_run_gpu:wandb_run_gpu_assignment:max"
RUN_GPU_UTIL = "wandb_run_gpu:dcgm_gpu_util:avg2m"
RUN_HOST_TENSOR = "wandb_run_hostname:dcgm_tensor_active:max"
RUN_HOST_FB = "wandb_run_hostname:dcgm_fb_used:max"
