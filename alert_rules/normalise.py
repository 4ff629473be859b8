"""Recording rules that give every fault rule one vocabulary, whatever exporter versions run.

dcgm-exporter: ``Hostname`` (<= 4.8.2) or ``hostname`` -> ``hostname``, ``UUID`` -> ``gpu_uuid``,
the 4.9 renames and unit changes (utilisation 0..100 -> ratio), violation counters in ns or us ->
fraction of time. node_exporter: ``hostname`` from ``node_uname_info{nodename}`` joined on
(instance, job). Every output is aggregated with ``max by`` so exporter replicas and per-job copies
(HPC mode, Kubernetes pod labels) collapse into one series per entity. Runs: the run's GPU series
(by GPU when the run's GPUs are known, else the host's when exactly one run holds it).
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.catalog import series as s
from bridge.catalog.alerts import TEMP_WARNING_C
from exporter import labels as L

GPU_KEYS = f"{L.HOSTNAME}, {L.GPU}, {L.GPU_UUID}"
RUN = ", ".join(L.RUN_LABELS)
VIOLATION_DIVISORS = {"ns": "1e9", "us": "1e6"}
# Clock-event bits the alerts read: HW slowdown (8), HW thermal (64), HW power brake (128); any
# bitmask holding one is >= 8, so smaller ones (idle, app clocks, SW power cap) are not recorded.
CLOCK_BITS_OF_INTEREST = 8
VIRTUAL_INTERFACES = ("lo|docker.*|veth.*|cali.*|flannel.*|cni.*|virbr.*|br-.*|tun.*|tap.*|"
                      "kube.*|vxlan.*|tunl.*|dummy.*|nodelocaldns.*|lxc.*|genev.*")


@dataclass(frozen=True)
class Recording:
    """One recording rule; ``labels`` are static labels added to its output."""

    record: str
    expr: str
    labels: tuple[tuple[str, str], ...] = ()


def _gpu(inner: str) -> str:
    """Rename the dcgm host/UUID labels and collapse duplicates into one series per GPU.

    The inner ``max by`` first strips every other label, so the relabelling works on small label
    sets (the dominant cost on a large cluster).
    """
    return (f"max by ({GPU_KEYS}) (label_replace(label_replace("
            f"max by (Hostname, {L.HOSTNAME}, {L.GPU}, UUID) ({inner}), "
            f'"{L.HOSTNAME}", "$1", "Hostname", "(.+)"), "{L.GPU_UUID}", "$1", "UUID", "(.+)"))')


def _host_label(inner: str) -> str:
    """dcgm series reduced to (hostname, gpu), whichever host label spelling they carry."""
    return (f'label_replace(max by (Hostname, {L.HOSTNAME}, {L.GPU}) ({inner}), '
            f'"{L.HOSTNAME}", "$1", "Hostname", "(.+)")')


def _sparse(*variants: str) -> str:
    """Error counters: only GPUs with a non-zero value are relabelled and recorded.

    Each variant is filtered before the ``or`` and the relabelling, so those touch the handful of
    faulty GPUs instead of every GPU of the cluster.
    """
    return _gpu(_either(*(f"({v}) > 0" for v in variants)))


def _either(*variants: str) -> str:
    """Old-or-new metric names (4.9 renames): the first present wins per series."""
    return " or ".join(f"({v})" for v in variants)


def _rate(metric: str, window: str, fn: str = "rate") -> str:
    return f"{fn}({metric}[{window}])"


def _tagged_sum(metrics: tuple[str, ...], fn: str, window: str, by: str,
                sparse: bool = False) -> str:
    """Sum a function of several counters without duplicate label sets (names are dropped).

    ``sparse``: only non-zero terms are kept (before the ``or``), for error counters.
    """
    cut = " > 0" if sparse else ""
    parts = " or ".join(
        f'label_replace({fn}({m}[{window}]){cut}, "counter", "{i}", "", "")'
        for i, m in enumerate(metrics))
    return f"sum by ({by}) ({parts})"


def _with_host(inner: str, by: str) -> str:
    """Give node_exporter series the hostname of their target (other labels are dropped before
    the join, so it builds small label sets)."""
    return (f"max by ({L.HOSTNAME}, {by}) (max by (instance, job, {by}) ({inner}) "
            f"* on (instance, job) group_left ({L.HOSTNAME}) {s.NODE_EXPORTER_TARGET})")


def dcgm_rules(violation_unit: str) -> list[Recording]:
    """Per-GPU normalised series from dcgm-exporter."""
    div = VIOLATION_DIVISORS[violation_unit]
    xid_last = _either(*(f"{m} > 0 unless {m} offset 10m"
                         for m in ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR")))
    return [
        Recording(s.GPU_PRESENT, f"clamp({_gpu(s.dcgm_raw(s.DCGM_GPU_TEMP))}, 1, 1)"),
        Recording(s.GPU_TEMP_HOT, _gpu(s.dcgm_raw(s.DCGM_GPU_TEMP, cut=f" >= {TEMP_WARNING_C}"))),
        Recording(s.MEMORY_TEMP_HOT,
                  _gpu(s.dcgm_raw(s.DCGM_MEMORY_TEMP, cut=f" >= {TEMP_WARNING_C}"))),
        *(Recording(record, f"clamp_max({_sparse(_rate(metric, '5m'))} / {div}, 1)")
          for record, metric in ((s.THERMAL_VIOLATION, "DCGM_FI_DEV_THERMAL_VIOLATION"),
                                 (s.POWER_VIOLATION, "DCGM_FI_DEV_POWER_VIOLATION"))),
        Recording(s.CLOCK_EVENT_REASONS,
                  _gpu(s.dcgm_raw(s.DCGM_CLOCK_EVENT_REASONS,
                                  cut=f" >= {CLOCK_BITS_OF_INTEREST}"))),
        Recording(s.PCIE_REPLAY_RATE, _sparse(_rate("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "5m"),
                                              _rate("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "5m"))),
        Recording(s.NVLINK_CRC_RATE, _sparse(
            _tagged_sum(("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                         "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"), "rate", "5m",
                        "instance, job, Hostname, hostname, gpu, UUID", sparse=True),
            _tagged_sum(("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL",
                         "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL"), "rate", "5m",
                        "instance, job, Hostname, hostname, gpu, UUID", sparse=True))),
        Recording(s.NVLINK_REPLAY_RECOVERY, _sparse(
            _tagged_sum(("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
                         "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"), "increase", "10m",
                        "instance, job, Hostname, hostname, gpu, UUID", sparse=True),
            _tagged_sum(("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL",
                         "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL"), "increase", "10m",
                        "instance, job, Hostname, hostname, gpu, UUID", sparse=True))),
        Recording(s.ECC_DBE, _sparse(_rate("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "10m", "increase"))),
        Recording(s.ECC_SBE, _sparse(_rate("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "10m", "increase"))),
        Recording(s.RETIRED_PAGES, _sparse(
            "sum by (instance, job, Hostname, hostname, gpu, UUID) "
            '(label_replace(DCGM_FI_DEV_RETIRED_SBE > 0, "counter", "sbe", "", "") '
            'or label_replace(DCGM_FI_DEV_RETIRED_DBE > 0, "counter", "dbe", "", ""))')),
        Recording(s.RETIRED_PENDING, _sparse("DCGM_FI_DEV_RETIRED_PENDING")),
        Recording(s.ROW_REMAP_FAILURE, _sparse("DCGM_FI_DEV_ROW_REMAP_FAILURE",
                                               "DCGM_FI_DEV_ROW_REMAP_FAILED")),
        Recording(s.ROW_REMAP_PENDING, _sparse("DCGM_FI_DEV_ROW_REMAP_PENDING")),
        Recording(s.UNCORRECTABLE_ROWS, _sparse("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                                                "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL")),
        Recording(s.XID_EVENTS, _either(
            f"max by ({GPU_KEYS}, xid) (label_replace(label_replace("
            "max_over_time(DCGM_EXP_XID_ERRORS_COUNT[10m]) > 0, "
            f'"{L.HOSTNAME}", "$1", "Hostname", "(.+)"), "{L.GPU_UUID}", "$1", "UUID", "(.+)"))',
            f"count by ({GPU_KEYS}, xid) (label_replace(label_replace(label_replace("
            f'{xid_last}, "xid", "$1", "err_code", "(.+)"), '
            f'"{L.HOSTNAME}", "$1", "Hostname", "(.+)"), "{L.GPU_UUID}", "$1", "UUID", "(.+)"))')),
        Recording(s.HOST_GPU_COUNT, f"count by ({L.HOSTNAME}) ({s.GPU_PRESENT})"),
    ]


def target_rules() -> list[Recording]:
    """Which host each telemetry target reports, and whether it is up (for NodeDown)."""
    dcgm_any = s.dcgm_raw(s.DCGM_GPU_TEMP)
    rules = [
        Recording(s.NODE_EXPORTER_TARGET,
                  f"topk by (instance, job) (1, max by (instance, job, {L.HOSTNAME}) "
                  f'(label_replace(node_uname_info, "{L.HOSTNAME}", "$1", "nodename", "(.+)")))'),
        Recording(s.DCGM_EXPORTER_TARGET,
                  f"topk by (instance, job) (1, clamp_max(count by (instance, job, {L.HOSTNAME}) "
                  f'(label_replace(count by (instance, job, Hostname, {L.HOSTNAME}) ({dcgm_any}), '
                  f'"{L.HOSTNAME}", "$1", "Hostname", "(.+)")), 1))'),
    ]
    for exporter, target in (("node_exporter", s.NODE_EXPORTER_TARGET),
                             ("dcgm_exporter", s.DCGM_EXPORTER_TARGET)):
        rules.append(Recording(
            s.TARGET_UP,
            f"min by ({L.HOSTNAME}) (up * on (instance, job) group_left ({L.HOSTNAME}) "
            f"topk by (instance, job) (1, max_over_time({target}[1h])))",
            ((s.TARGET_LABEL, exporter),)))
    return rules


def node_rules() -> list[Recording]:
    """InfiniBand and Ethernet/RoCE series with the host's name (error and flap counts sparse:
    only non-zero ports are joined and recorded)."""
    link = "device, port"
    iface = f'device!~"{VIRTUAL_INTERFACES}"'
    return [
        Recording(s.IB_STATE, _with_host("node_infiniband_state_id", link)),
        Recording(s.IB_FLAPS, _with_host(_tagged_sum(
            ("node_infiniband_link_downed_total", "node_infiniband_link_error_recovery_total"),
            "increase", "15m", f"instance, job, {link}", sparse=True), link)),
        Recording(s.IB_PHYSICAL_ERRORS, _with_host(_tagged_sum(
            ("node_infiniband_symbol_error_total",
             "node_infiniband_local_link_integrity_errors_total",
             "node_infiniband_port_receive_remote_physical_errors_total"),
            "rate", "5m", f"instance, job, {link}", sparse=True), link)),
        Recording(s.NET_UP, _with_host(f"node_network_up{{{iface}}}", "device")),
        Recording(s.NET_CARRIER_CHANGES, _with_host(
            f"increase(node_network_carrier_changes_total{{{iface}}}[15m]) > 0", "device")),
    ]


def _per_run_gpu(metric: str) -> str:
    """A per-GPU series relabelled with the run(s) on that GPU (never another run's GPU)."""
    return (f"{s.RUN_GPU_ASSIGNMENT} * on ({L.HOSTNAME}, {L.GPU}) group_left () "
            f"max by ({L.HOSTNAME}, {L.GPU}) ({metric})")


def run_rules() -> list[Recording]:
    """Deduplicated join records (read by every attributed alert), which run each GPU serves,
    and what the workload alerts (stall, straggler) need per run.

    The GPU-to-run assignment is recorded once (the runs holding the GPU, else the host's only
    run whose GPUs are unknown), so each per-run series is one join of the metric with it.
    """
    gpuless = s.RUN_HOSTS_GPUS_UNKNOWN
    sole_gpuless = f"({gpuless} and on ({L.HOSTNAME}) (count by ({L.HOSTNAME}) ({gpuless}) == 1))"
    return [
        Recording(s.RUN_GPUS, f"max by ({L.HOSTNAME}, {L.GPU}, {RUN}) ({L.GPU_INFO})"),
        Recording(s.RUN_HOSTS, f"max by ({L.HOSTNAME}, {RUN}) ({L.NODE_INFO})"),
        Recording(s.RUN_HOSTS_GPUS_UNKNOWN,
                  f"max by ({L.HOSTNAME}, {RUN}) ({L.NODE_INFO} unless on ({L.HOSTNAME}, {RUN}) "
                  f"{L.GPU_INFO})"),
        Recording(s.RUN_GPU_ASSIGNMENT,
                  f"{s.RUN_GPUS} or (max by ({L.HOSTNAME}, {L.GPU}) ({s.GPU_PRESENT} "
                  f"unless on ({L.HOSTNAME}, {L.GPU}) {s.RUN_GPUS}) "
                  f"* on ({L.HOSTNAME}) group_left ({RUN}) {sole_gpuless})"),
        Recording(s.RUN_GPU_UTIL, _per_run_gpu(_host_label(
            s.dcgm_raw(s.DCGM_GPU_UTIL, fn="avg_over_time", window="2m")))),
        Recording(s.RUN_HOST_TENSOR, f"max by ({RUN}, {L.HOSTNAME}) "
                                     f"({_per_run_gpu(_host_label(s.dcgm_raw(s.DCGM_TENSOR_ACTIVE)))})"),
        Recording(s.RUN_HOST_FB, f"max by ({RUN}, {L.HOSTNAME}) "
                                 f"({_per_run_gpu(_host_label(s.dcgm_raw(s.DCGM_FB_USED)))})"),
    ]
