"""Recording rules that give every fault rule one vocabulary, whatever exporter versions run.

dcgm-exporter: ``Hostname`` (<= 4.8.2) or ``hostname`` -> ``hostname``, ``UUID`` -> ``gpu_uuid``,
the 4.9 renames and unit changes (utilisation 0..100 -> ratio), violation counters in ns or us ->
fraction of time. node_exporter: ``hostname`` from ``node_uname_info{nodename}`` joined on
(instance, job). Every output is aggregated with ``max by`` so exporter replicas and per-job copies
(HPC mode, Kubernetes pod labels) collapse into one series per entity.

Cost model (Prometheus 2.42, measured on 16,000 GPUs): selecting a series costs ~7 us whatever
its samples, so a rule's price is the number of series its selectors touch. Hence: every raw
family is read once per evaluation of its tier (``tiers.py``), outputs are sparse (only faulty
entities) wherever the alerts allow, and "was it healthy within the last hour" questions are
answered by sparse records of the never-healthy entities, read by the fast alerts.
"""

from __future__ import annotations

from dataclasses import dataclass

from wandb_infra.catalog import series as s
from wandb_infra.catalog.alerts import (
    STALL_ACTIVITY_MAX,
    STALL_FB_MIN_BYTES,
    STALL_PRIOR_ACTIVITY_MIN,
    STRAGGLER_GAP,
    STRAGGLER_RUN_BUSY_MIN,
    TEMP_WARNING_C,
)
from wandb_infra.common import labels as L

GPU_KEYS = f"{L.HOSTNAME}, {L.GPU}, {L.GPU_UUID}"
RUN = ", ".join(L.RUN_LABELS)
VIOLATION_DIVISORS = {"ns": "1e9", "us": "1e6"}
# Clock-event bits the alerts read: HW slowdown (8), HW thermal (64), HW power brake (128); any
# bitmask holding one is >= 8, so smaller ones (idle, app clocks, SW power cap) are not recorded.
CLOCK_BITS_OF_INTEREST = 8
# Labels of a raw dcgm-exporter series that identify one GPU of one target.
DCGM_SERIES = "instance, job, Hostname, hostname, gpu, UUID"
LINK = "device, port"
IFACE = s.PHYSICAL_INTERFACES


@dataclass(frozen=True)
class Recording:
    """One recording rule."""

    record: str
    expr: str


# A host name whose first label is not all digits (so not an IPv4 address), with a domain: the
# first label is the host. dcgm-exporter reports Kubernetes node names (``spec.nodeName``, e.g.
# ``ip-10-0-1-23.us-west-2.compute.internal`` on EKS) and node_exporter the kernel's nodename,
# both often FQDNs; the exporter strips domains by default, so the rules do the same.
FQDN = "([^.]*[^0-9.][^.]*)[.].+"


@dataclass(frozen=True)
class HostKey:
    """How the rules turn an exporter's host label into the canonical ``hostname``.

    ``strip_domain`` must match the exporter's ``hostnames.strip_domain`` (default on), so that
    telemetry and the join metrics name a host the same way.
    """

    strip_domain: bool = True

    def canonical(self, expr: str) -> str:
        """``expr`` with its ``hostname`` label reduced to the canonical key."""
        if not self.strip_domain:
            return expr
        return f'label_replace({expr}, "{L.HOSTNAME}", "$1", "{L.HOSTNAME}", "{FQDN}")'


DEFAULT_HOST_KEY = HostKey()


def _from_dcgm_host(expr: str, host: HostKey) -> str:
    """dcgm-exporter's host label, ``Hostname`` (<= 4.8.2) or ``hostname``, as the canonical
    ``hostname``."""
    return host.canonical(f'label_replace({expr}, "{L.HOSTNAME}", "$1", "Hostname", "(.+)")')


def _gpu(inner: str, host: HostKey) -> str:
    """Rename the dcgm host/UUID labels and collapse duplicates into one series per GPU.

    The inner ``max by`` first strips every other label, so the relabelling works on small label
    sets.
    """
    renamed = _gpu_labels(f"max by (Hostname, {L.HOSTNAME}, {L.GPU}, UUID) ({inner})", host)
    return f"max by ({GPU_KEYS}) ({renamed})"


def _host_label(inner: str, host: HostKey) -> str:
    """dcgm series reduced to (hostname, gpu), whichever host label spelling they carry."""
    renamed = _from_dcgm_host(f"max by (Hostname, {L.HOSTNAME}, {L.GPU}) ({inner})", host)
    return f"max by ({L.HOSTNAME}, {L.GPU}) ({renamed})"


def _sparse(host: HostKey, *variants: str) -> str:
    """Error counters: only GPUs with a non-zero value are relabelled and recorded.

    Each variant is filtered before the ``or`` and the relabelling, so those touch the handful of
    faulty GPUs instead of every GPU of the cluster.
    """
    return _gpu(_either(*(f"({v}) > 0" for v in variants)), host)


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


def _sparse_sums(host: HostKey, fn: str, window: str, *names: tuple[str, ...]) -> str:
    """Several error counters of a GPU summed (``_tagged_sum``), under their pre-4.9 or 4.9
    names (one tuple each), non-zero only."""
    return _sparse(host, *(_tagged_sum(n, fn, window, DCGM_SERIES, sparse=True) for n in names))


XID_GAUGE = '{__name__=~"DCGM_FI_DEV_XID_ERRORS|DCGM_FI_DEV_XID_ERROR",err_code!="0"}'
# How long a new XID code stays an event (the record says "recent", the alerts fire on it).
XID_RECENT = "10m"


def _xid_codes(gauge: str, host: HostKey) -> str:
    """The code each GPU's last-XID gauge holds, as an ``xid`` label, one series per
    (hostname, gpu, xid) whatever else the series carries.

    ``count_values`` keys on the gauge's value (the code), not on ``err_code``, which versions
    before 3.3 do not have. Everything volatile is dropped here: Kubernetes pod labels, HPC
    ``hpc_job``, ``instance``/``job`` of a restarted exporter, the driver version, the
    ``Hostname``/``hostname`` spelling.
    """
    codes = f'count_values by (Hostname, {L.HOSTNAME}, {L.GPU}, UUID) ("xid", {gauge} > 0)'
    return f"max by ({GPU_KEYS}, xid) (clamp({_gpu_labels(codes, host)}, 1, 1))"


def _gpu_labels(expr: str, host: HostKey) -> str:
    """``expr`` with dcgm's host and UUID labels renamed (no aggregation)."""
    return f'label_replace({_from_dcgm_host(expr, host)}, "{L.GPU_UUID}", "$1", "UUID", "(.+)")'


def xid_rules(host: HostKey = DEFAULT_HOST_KEY) -> list[Recording]:
    """XID events of the last 10-15 minutes, per GPU and code (fast tier).

    ``DCGM_EXP_XID_ERRORS_COUNT`` counts them when enabled. Otherwise the last-XID gauge is all
    there is, and it keeps its code until DCGM restarts: an event is a code a GPU holds now and
    did not hold 10 minutes earlier, compared on (hostname, gpu, xid) only, so a new pod, Slurm
    job or exporter replica on a GPU with an old XID is not a new event (upstream
    dcgm-exporter#500). The gauge cannot show the same code again; the counter can. The
    ``err_code!="0"`` matcher reads only GPUs that ever had an XID, not the whole cluster.
    """
    counts = f"max_over_time(DCGM_EXP_XID_ERRORS_COUNT[{XID_RECENT}]) > 0"
    counted = f"max by ({GPU_KEYS}, xid) ({_gpu_labels(counts, host)})"
    gauge_events = (f"{_xid_codes(XID_GAUGE, host)} unless on ({L.HOSTNAME}, {L.GPU}, xid) "
                    f"{_xid_codes(XID_GAUGE + ' offset ' + XID_RECENT, host)}")
    return [Recording(s.XID_EVENTS, _either(counted, gauge_events))]


def dcgm_telemetry_rules(host: HostKey = DEFAULT_HOST_KEY) -> list[Recording]:
    """GPUs past a temperature or clock-event threshold (medium tier, sparse).

    Temperatures are recorded from the warning threshold up, clock-event bitmasks only with a
    hardware slowdown bit.
    """
    return [
        Recording(s.GPU_TEMP_HOT,
                  _gpu(s.dcgm_raw(s.DCGM_GPU_TEMP, cut=f" >= {TEMP_WARNING_C}"), host)),
        Recording(s.MEMORY_TEMP_HOT,
                  _gpu(s.dcgm_raw(s.DCGM_MEMORY_TEMP, cut=f" >= {TEMP_WARNING_C}"), host)),
        Recording(s.CLOCK_EVENT_REASONS,
                  _gpu(s.dcgm_raw(s.DCGM_CLOCK_EVENT_REASONS,
                                  cut=f" >= {CLOCK_BITS_OF_INTEREST}"), host)),
    ]


def dcgm_state_rules(violation_unit: str, host: HostKey = DEFAULT_HOST_KEY
                     ) -> list[Recording]:
    """GPU presence and violation rates (slow tier, sparse but for presence).

    Presence is the one dense per-GPU record (dashboards list GPUs from it; the host's GPU count
    and the GPUs that vanished within the hour derive from it, in this group's order). Every
    rate's window is longer than the tier's interval, so no increase falls between evaluations.
    """
    div = VIOLATION_DIVISORS[violation_unit]
    return [
        Recording(s.GPU_PRESENT, f"clamp({_gpu(s.dcgm_raw(s.DCGM_GPU_TEMP), host)}, 1, 1)"),
        Recording(s.HOST_GPU_COUNT, f"count by ({L.HOSTNAME}) ({s.GPU_PRESENT})"),
        Recording(s.HOST_GPU_COUNT_DROP,
                  f"max_over_time({s.HOST_GPU_COUNT}[1h]) - {s.HOST_GPU_COUNT} > 0"),
        Recording(s.GPU_VANISHED,
                  f"(max_over_time({s.GPU_PRESENT}[1h]) unless on ({L.HOSTNAME}, {L.GPU}) "
                  f"{s.GPU_PRESENT}) and on ({L.HOSTNAME}) {s.HOST_GPU_COUNT}"),
        *(Recording(record, f"clamp_max({_sparse(host, _rate(metric, '5m'))} / {div}, 1)")
          for record, metric in ((s.THERMAL_VIOLATION, "DCGM_FI_DEV_THERMAL_VIOLATION"),
                                 (s.POWER_VIOLATION, "DCGM_FI_DEV_POWER_VIOLATION"))),
    ]


def dcgm_wear_rules(host: HostKey = DEFAULT_HOST_KEY) -> list[Recording]:
    """Memory and interconnect error counters and health gauges (wear tier, sparse).

    Their job-ending forms arrive as XIDs (48, 63/64, 74, 79, 94/95) on the fast path; these
    records say how worn a part is, which 10-minute windows read every 8 minutes still tell.
    """
    return [
        Recording(s.PCIE_REPLAY_RATE, _sparse(host, _rate("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "10m"),
                                              _rate("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "10m"))),
        Recording(s.NVLINK_CRC_RATE, _sparse_sums(
            host, "rate", "10m",
            ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
             "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
            ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL",
             "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL"))),
        Recording(s.NVLINK_REPLAY_RECOVERY, _sparse_sums(
            host, "increase", "10m",
            ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
             "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
            ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL",
             "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL"))),
        *(Recording(record, _sparse(host, _rate(metric, "10m", "increase")))
          for record, metric in ((s.ECC_DBE, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
                                 (s.ECC_SBE, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"))),
        Recording(s.RETIRED_PAGES, _sparse(
            host,
            f"sum by ({DCGM_SERIES}) "
            f'(label_replace({s.dcgm_raw(s.DCGM_RETIRED_SBE)} > 0, "counter", "sbe", "", "") '
            f'or label_replace({s.dcgm_raw(s.DCGM_RETIRED_DBE)} > 0, "counter", "dbe", "", ""))')),
        Recording(s.RETIRED_PENDING, _sparse(host, s.dcgm_raw(s.DCGM_RETIRED_PENDING))),
        Recording(s.ROW_REMAP_FAILURE, _sparse(host, "DCGM_FI_DEV_ROW_REMAP_FAILURE",
                                               "DCGM_FI_DEV_ROW_REMAP_FAILED")),
        Recording(s.ROW_REMAP_PENDING, _sparse(host, "DCGM_FI_DEV_ROW_REMAP_PENDING")),
        Recording(s.UNCORRECTABLE_ROWS, _sparse(host, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                                                "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL")),
    ]


def target_map_rules(host: HostKey = DEFAULT_HOST_KEY) -> list[Recording]:
    """Which host each telemetry target reports, remembered for an hour, and the hosts whose
    target is gone (slow tier).

    node_exporter names its host in ``node_uname_info``; a dcgm-exporter target in the host
    label of its GPUs 0 and 1 (two GPUs, so one fallen off the bus does not hide the host, and
    a quarter of an 8-GPU host's series to read). The hour's memory lets a target that went down or
    vanished still name its host; the result carries the ``exporter`` it maps. A target is gone
    when the hour knew one for the host and exporter and none is scraped now (removed from
    discovery); that matters only on a host a run is on. Per host, so a target that moved to a
    new address is not gone.
    """
    first_gpus = s.dcgm_raw(s.DCGM_GPU_TEMP, matchers='gpu=~"0|1"')
    targets = " or ".join(
        f'label_replace(topk by (instance, job) (1, max_over_time({target}[1h])), '
        f'"{s.TARGET_LABEL}", "{exporter}", "", "")'
        for exporter, target in (("node_exporter", s.NODE_EXPORTER_TARGET),
                                 ("dcgm_exporter", s.DCGM_EXPORTER_TARGET)))
    by_host = f"max by ({L.HOSTNAME}, {s.TARGET_LABEL})"
    uname_host = host.canonical(
        f'label_replace(node_uname_info, "{L.HOSTNAME}", "$1", "nodename", "(.+)")')
    dcgm_host = _from_dcgm_host(
        f"count by (instance, job, Hostname, {L.HOSTNAME}) ({first_gpus})", host)
    return [
        Recording(s.NODE_EXPORTER_TARGET,
                  f"topk by (instance, job) (1, max by (instance, job, {L.HOSTNAME}) "
                  f"({uname_host}))"),
        Recording(s.DCGM_EXPORTER_TARGET,
                  f"topk by (instance, job) (1, clamp_max(count by (instance, job, {L.HOSTNAME}) "
                  f"({dcgm_host}), 1))"),
        Recording(s.TARGET_HOSTS, targets),
        Recording(s.TARGET_VANISHED,
                  f"({by_host} ({s.TARGET_HOSTS} unless on (instance, job) up) "
                  f"unless on ({L.HOSTNAME}, {s.TARGET_LABEL}) "
                  f"{by_host} ({s.TARGET_HOSTS} and on (instance, job) up)) "
                  f"and on ({L.HOSTNAME}) {L.NODE_INFO}"),
    ]


def target_rules() -> list[Recording]:
    """The hosts with a telemetry target down now (NodeDown), by ``exporter`` (fast tier, sparse:
    value 0, the target's ``up``).

    ``up`` is read once for both exporters (the target maps never share an (instance, job)).
    """
    return [
        Recording(s.TARGET_DOWN,
                  f"min by ({L.HOSTNAME}, {s.TARGET_LABEL}) ((up == 0) * on (instance, job) "
                  f"group_left ({L.HOSTNAME}, {s.TARGET_LABEL}) {s.TARGET_HOSTS})"),
    ]


def link_down_rules() -> list[Recording]:
    """InfiniBand ports not active and interfaces down, now (medium tier, sparse)."""
    return [
        Recording(s.IB_PORT_DOWN, s.node_with_host("node_infiniband_state_id != 4", LINK)),
        Recording(s.NET_DOWN, s.node_with_host(f"node_network_up{{{IFACE}}} == 0", "device")),
    ]


def node_history_rules() -> list[Recording]:
    """The links idle for the whole last hour (slow tier, sparse).

    A port or interface that was never up within the hour is unused (no cable, spare NIC), so
    its being down now is not a fault; the link-down alerts subtract these.
    """
    return [
        Recording(s.IB_PORT_IDLE_1H,
                  s.node_with_host("max_over_time(node_infiniband_state_id[1h]) != 4", LINK)),
        Recording(s.NET_IDLE_1H, s.node_with_host(
            f"max_over_time(node_network_up{{{IFACE}}}[1h]) == 0", "device")),
    ]


def link_wear_rules() -> list[Recording]:
    """InfiniBand flaps and physical errors, Ethernet carrier changes (wear tier, sparse).

    A link that went down shows on the fast path; these say a link is degrading.
    """
    return [
        Recording(s.IB_FLAPS, s.node_with_host(_tagged_sum(
            ("node_infiniband_link_downed_total", "node_infiniband_link_error_recovery_total"),
            "increase", "15m", f"instance, job, {LINK}", sparse=True), LINK)),
        Recording(s.IB_PHYSICAL_ERRORS, s.node_with_host(_tagged_sum(
            ("node_infiniband_symbol_error_total",
             "node_infiniband_local_link_integrity_errors_total",
             "node_infiniband_port_receive_remote_physical_errors_total"),
            "rate", "10m", f"instance, job, {LINK}", sparse=True), LINK)),
        Recording(s.NET_CARRIER_CHANGES, s.node_with_host(
            f"increase(node_network_carrier_changes_total{{{IFACE}}}[15m]) > 0", "device")),
    ]


# Which GPUs each run holds: the exporter's per-GPU join metric, or, on Kubernetes, the pod that
# dcgm-exporter says holds the GPU joined to that pod's run.
RUN_GPUS = f"({L.GPU_INFO} or {s.POD_GPU_ROWS})"


def pod_gpu_rules(host: HostKey = DEFAULT_HOST_KEY) -> list[Recording]:
    """The run on each GPU that a Kubernetes pod holds (slow tier).

    dcgm-exporter in Kubernetes mode labels each GPU's series with the pod holding it
    (``pod``/``namespace``, or ``exported_pod``/``exported_namespace`` when a ServiceMonitor
    without ``honorLabels`` keeps its own target labels); the exporter's pod info metric says
    which run each pod belongs to. A GPU fault then goes to the run whose pod holds the GPU
    instead of every run on the node. Pods change slowly, so the slow tier suffices; until a
    new pod's row exists its run is attributed by host.
    """
    scraped = s.dcgm_raw(s.DCGM_GPU_TEMP, matchers='exported_pod!=""')
    exported = (f'label_replace(label_replace({scraped}, "{L.POD}", "$1", "exported_pod", "(.+)"),'
                f' "{L.NAMESPACE}", "$1", "exported_namespace", "(.+)")')
    honoured = s.dcgm_raw(s.DCGM_GPU_TEMP, matchers='pod!="",exported_pod=""')
    by = f"Hostname, {L.HOSTNAME}, {L.GPU}, {L.NAMESPACE}, {L.POD}"
    held = f"max by ({by}) ({exported} or {honoured})"
    # One run per pod even if two registrations claim it, so the join can never fail.
    pods = f"topk by ({L.NAMESPACE}, {L.POD}) (1, max by ({L.NAMESPACE}, {L.POD}, {RUN}) " \
           f"({L.POD_INFO}))"
    return [Recording(s.POD_GPU_ROWS,
                      f"max by ({L.HOSTNAME}, {L.GPU}, {RUN}) "
                      f"(clamp({_from_dcgm_host(held, host)}, 1, 1) "
                      f"* on ({L.NAMESPACE}, {L.POD}) group_left ({RUN}) {pods})")]


def run_gpu_rows(hosts: str = "", on: str = L.HOSTNAME) -> str:
    """The run on each GPU, one series per (host, GPU, run) whatever the exporter replicas;
    with ``hosts``, only rows matching it ``on`` the given labels (filtered before the ``max``,
    so the aggregation touches those rows only)."""
    info = f"{RUN_GPUS} and on ({on}) ({hosts})" if hosts else RUN_GPUS
    return f"max by ({L.HOSTNAME}, {L.GPU}, {RUN}) ({info})"


def run_host_rows(hosts: str = "") -> str:
    """The runs on each host, one series per (host, run); with ``hosts``, only those hosts."""
    info = f"{L.NODE_INFO} and on ({L.HOSTNAME}) ({hosts})" if hosts else L.NODE_INFO
    return f"max by ({L.HOSTNAME}, {RUN}) ({info})"


def stall_rules(host: HostKey = DEFAULT_HOST_KEY) -> list[Recording]:
    """Runs that stopped computing on a host while holding its GPUs' memory (medium tier).

    Sparse from the start: the GPUs idle with memory held (matched on the raw series, before any
    relabelling), then the runs on their hosts. A run is stalled on a host when every GPU it
    holds there is stalled and one of them was active within the hour (GPUs idle all hour, from
    ``workload_history_rules``, are an idle allocation, not a hang). A run whose GPUs are
    unknown, alone on the host, holds all of them.
    """
    raw_gpu = "on (Hostname, hostname, gpu)"
    # MIG: a GPU's instances (GPU_I_ID) are separate series; the GPU counts as stalled only when
    # none of them computes, since the join metrics do not say which run holds which instance.
    # The second selector matches MIG series only, so it costs nothing on other clusters.
    busy_instance = s.dcgm_raw(s.DCGM_TENSOR_ACTIVE, matchers='GPU_I_ID!=""',
                               cut=f" >= {STALL_ACTIVITY_MAX}")
    idle = (f"({s.dcgm_raw(s.DCGM_TENSOR_ACTIVE, cut=f' < {STALL_ACTIVITY_MAX}')}) and "
            "on (Hostname, hostname, gpu, GPU_I_ID) "
            f"({s.dcgm_raw(s.DCGM_FB_USED, cut=f' > {STALL_FB_MIN_BYTES}')}) "
            f"unless {raw_gpu} ({busy_instance})")
    rows, stalled = s.RUN_GPUS_STALLED, s.GPU_STALLED
    on_gpu, on_run_host = f"on ({L.HOSTNAME}, {L.GPU})", f"on ({RUN}, {L.HOSTNAME})"
    on_host = f"on ({L.HOSTNAME})"
    return [
        Recording(stalled, _host_label(idle, host)),
        Recording(rows, run_gpu_rows(stalled)),
        Recording(s.RUN_HOST_STALLED, _either(
            f"max by ({RUN}, {L.HOSTNAME}) ({rows} * {on_gpu} group_left () {stalled}) "
            f"unless {on_run_host} ({rows} unless {on_gpu} {stalled}) "
            f"and {on_run_host} ({rows} unless {on_gpu} {s.GPU_IDLE_1H})",
            f"({s.RUN_HOSTS_SOLE_GPULESS} and {on_host} {stalled}) * {on_host} group_left () "
            f"(max by ({L.HOSTNAME}) ({stalled}) "
            f"and {on_host} (count by ({L.HOSTNAME}) ({stalled}) == {on_host} "
            f"{s.HOST_GPU_COUNT}) "
            f"and {on_host} ({stalled} unless {on_gpu} {s.GPU_IDLE_1H}))")),
    ]


def workload_history_rules(host: HostKey = DEFAULT_HOST_KEY) -> list[Recording]:
    """What the workload alerts compare against, over minutes to an hour (slow tier).

    GPUs whose tensor pipes stayed idle all hour; the runs whose GPUs are unknown, and those
    alone on their host (they own its GPUs); straggling GPUs. A straggler is more than the gap
    below its run's busiest GPU, so below ``1 - gap`` in any case: those lagging GPUs are found
    first (sparse), then the GPU rows of their runs; utilisation is relabelled to the canonical
    host (the exporters' host names may be FQDNs) and kept for those runs' hosts only.
    """
    tensor_idle = _host_label(s.dcgm_raw(s.DCGM_TENSOR_ACTIVE, fn="max_over_time", window="1h",
                                         cut=f" <= {STALL_PRIOR_ACTIVITY_MIN}"), host)

    def util(cut: str = "") -> str:
        return s.dcgm_raw(s.DCGM_GPU_UTIL, fn="avg_over_time", window="2m", cut=cut)

    unknown, sole = s.RUN_HOSTS_GPUS_UNKNOWN, s.RUN_HOSTS_SOLE_GPULESS
    lagging, lagging_runs = s.GPU_UTIL_LAGGING, s.RUN_GPUS_LAGGING
    rows, run_util = s.LAGGING_RUN_GPU_ROWS, s.GPU_UTIL_LAGGING_RUN_HOSTS
    on_gpu, on_host, on_run = (f"on ({L.HOSTNAME}, {L.GPU})", f"on ({L.HOSTNAME})",
                               f"on ({RUN})")
    sole_lagging = f"({sole} and {on_run} {lagging_runs})"
    hosts = f"max by ({L.HOSTNAME}) ({rows}) or max by ({L.HOSTNAME}) {sole_lagging}"
    return [
        Recording(s.GPU_IDLE_1H, tensor_idle),
        Recording(unknown, f"max by ({L.HOSTNAME}, {RUN}) ({L.NODE_INFO} "
                           f"unless on ({L.HOSTNAME}, {RUN}) {RUN_GPUS})"),
        Recording(sole, f"{unknown} and {on_host} (count by ({L.HOSTNAME}) ({unknown}) == 1)"),
        Recording(lagging, _host_label(util(f" < {1 - STRAGGLER_GAP:g}"), host)),
        Recording(lagging_runs,
                  f"({run_gpu_rows(lagging, f'{L.HOSTNAME}, {L.GPU}')} * {on_gpu} "
                  f"group_left () {lagging}) "
                  f"or ({lagging} * {on_host} group_left ({RUN}) {sole})"),
        Recording(rows, run_gpu_rows(lagging_runs, RUN)),
        Recording(run_util, f"{_host_label(util(), host)} and {on_host} ({hosts})"),
        Recording(s.RUN_GPU_UTIL_BUSIEST,
                  f"max by ({RUN}) (({rows} * {on_gpu} group_left () {run_util}) "
                  f"or ({run_util} * {on_host} group_left ({RUN}) {sole_lagging}))"),
        Recording(s.RUN_GPU_STRAGGLING,
                  f"{lagging_runs} < {on_run} group_left () "
                  f"(({s.RUN_GPU_UTIL_BUSIEST} > {STRAGGLER_RUN_BUSY_MIN}) - {STRAGGLER_GAP})"),
    ]
