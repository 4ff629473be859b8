"""Recording rules that give every fault rule one vocabulary, whatever exporter versions run.

dcgm-exporter: ``Hostname`` (<= 4.8.2) or ``hostname`` -> ``hostname``, ``UUID`` -> ``gpu_uuid``,
the 4.9 renames and unit changes (utilisation 0..100 -> ratio), violation counters in ns or us ->
fraction of time. node_exporter: ``hostname`` from ``node_uname_info{nodename}`` joined on
(instance, job). Every output is aggregated with ``max by`` so exporter replicas and per-job copies
(HPC mode, Kubernetes pod labels) collapse into one series per entity.

Each record is a PromQL template (``catalog/template.py``): literal PromQL with ``${NAME}``
placeholders for record names, thresholds, windows and the shared relabelling steps below, so the
rule file shows the same text indented the same way. ``help`` says what the record holds and why;
the generator prints it as a comment above the rule.

Cost model (Prometheus 2.42, measured on 16,000 GPUs): selecting a series costs ~7 us whatever
its samples, so a rule's price is the number of series its selectors touch. Hence: every raw
family is read once per evaluation of its tier (``tiers.py``), outputs are sparse (only faulty
entities) wherever the alerts allow, and "was it healthy within the last hour" questions are
answered by sparse records of the never-healthy entities, read by the fast alerts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from wandb_infra.alert_rules import tiers
from wandb_infra.catalog import host_alerts as h
from wandb_infra.catalog import selfmetrics as m
from wandb_infra.catalog import series as s
from wandb_infra.catalog.alerts import (
    STALL_ACTIVITY_MAX,
    STALL_FB_MIN_BYTES,
    STALL_PRIOR_ACTIVITY_MIN,
    STRAGGLER_GAP,
    STRAGGLER_RUN_BUSY_MIN,
    TEMP_WARNING_C,
)
from wandb_infra.catalog.alerts import TEMPLATE_VALUES as TEMPLATE_VALUES_OF_ALERTS
from wandb_infra.catalog.template import Value, fill
from wandb_infra.common import labels as L
from wandb_infra.common import nodestate

RUN = ", ".join(L.RUN_LABELS)
VIOLATION_DIVISORS = {"ns": "1e9", "us": "1e6"}
# Clock-event bits the alerts read: HW slowdown, HW thermal, HW power brake; any bitmask holding
# one is at least the smallest of them, so smaller ones (idle, app clocks, SW power cap) are not
# recorded.
CLOCK_BITS_OF_INTEREST = min(s.CLOCK_HW_SLOWDOWN, s.CLOCK_HW_THERMAL, s.CLOCK_HW_POWER_BRAKE)
# Labels of a raw dcgm-exporter series that identify one GPU of one target.
DCGM_SERIES = "instance, job, Hostname, hostname, gpu, UUID"
LINK = "device, port"
# A host name whose first label is not all digits (so not an IPv4 address), with a domain: the
# first label is the host. dcgm-exporter reports Kubernetes node names (``spec.nodeName``, e.g.
# ``ip-10-0-1-23.us-west-2.compute.internal`` on EKS) and node_exporter the kernel's nodename,
# both often FQDNs; the exporter strips domains by default, so the rules do the same.
FQDN = "([^.]*[^0-9.][^.]*)[.].+"
XID_GAUGE = '{__name__=~"DCGM_FI_DEV_XID_ERRORS|DCGM_FI_DEV_XID_ERROR",err_code!="0"}'

# Names every template may use besides its own: records, windows, thresholds, label lists.
COMMON: dict[str, Value] = {
    **s.RECORDS,
    "RUN": RUN, "NODE_INFO": L.NODE_INFO, "GPU_INFO": L.GPU_INFO,
    "POD_INFO": L.POD_INFO, "TARGET_LABEL": s.TARGET_LABEL, "FQDN": FQDN,
    "PIPELINE_LABEL": s.PIPELINE_LABEL,
    "DCGM_SERIES": DCGM_SERIES, "LINK": LINK, "IFACE": s.PHYSICAL_INTERFACES,
    "VIOLATION_WINDOW": s.VIOLATION_WINDOW, "WEAR_WINDOW": s.WEAR_WINDOW,
    "FLAP_WINDOW": s.FLAP_WINDOW, "HISTORY_WINDOW": s.HISTORY_WINDOW,
    "XID_RECENT": s.XID_RECENT, "XID_GAUGE": XID_GAUGE, "IB_STATE_ACTIVE": s.IB_STATE_ACTIVE,
    "STRAGGLER_GAP": STRAGGLER_GAP, "STRAGGLER_RUN_BUSY_MIN": STRAGGLER_RUN_BUSY_MIN,
}


def promql(template: str, **values: Value) -> str:
    """A template filled with ``COMMON`` and the given values."""
    return fill(template, {**COMMON, **values})


@dataclass(frozen=True)
class Recording:
    """One recording rule: its name, its PromQL, and what it holds and why (the comment)."""

    record: str
    expr: str
    help: str


# --- shared relabelling steps ----------------------------------------------------------------

# One label_replace step: (destination, source, regex whose first group is the value).
Step = tuple[str, str, str]
DCGM_HOST: Step = ("hostname", "Hostname", "(.+)")
GPU_UUID: Step = ("gpu_uuid", "UUID", "(.+)")
# A ServiceMonitor without honorLabels renames the training pod's labels to exported_*.
POD_LABELS = "namespace, pod, exported_namespace, exported_pod"
POD_EXPORTED: list[Step] = [("pod", "exported_pod", "(.+)"),
                            ("namespace", "exported_namespace", "(.+)")]


def relabelled(expr: str, steps: list[Step]) -> str:
    """``expr`` through nested ``label_replace`` steps, innermost first, one step a line."""
    if not steps:
        return expr
    lines = ["label_replace(" * len(steps), "  " + expr.replace("\n", "\n  ") + ","]
    lines += [f'  "{dst}", "$1", "{src}", "{regex}")' + ("," if i < len(steps) - 1 else "")
              for i, (dst, src, regex) in enumerate(steps)]
    return "\n".join(lines)


def _by(by: str, expr: str, op: str = "max") -> str:
    """``op by (by) (expr)`` (``max`` unless told), on one line when ``expr`` is; around a
    relabelling (``relabelled``) the aggregation opens on the steps' line and closes on the last
    step's, one step a line."""
    if "\n" not in expr:
        return f"{op} by ({by}) ({expr})"
    first, rest = expr.split("\n", 1)
    if first and first == "label_replace(" * first.count("label_replace("):
        return f"{op} by ({by}) ({first}\n  " + rest.replace("\n", "\n  ") + ")"
    return promql("${OP} by (${BY}) (\n  ${EXPR}\n)", OP=op, BY=by, EXPR=expr)


@dataclass(frozen=True)
class HostKey:
    """How the rules turn an exporter's host label into the canonical ``hostname``.

    ``strip_domain`` must match the exporter's ``hostnames.strip_domain`` (default on), so that
    telemetry and the join metrics name a host the same way.
    """

    strip_domain: bool = True
    # The host key is the first group of this regex where it matches the whole host name (the
    # generator's host_key_regex, the mixin's hostKeyRegex); default: the first label of an FQDN.
    regex: str = FQDN

    def steps(self) -> list[Step]:
        """The step reducing ``hostname`` to the canonical key (none when domains are kept)."""
        return [("hostname", "hostname", self.regex)] if self.strip_domain else []

    def canonical(self, expr: str) -> str:
        """``expr`` with its ``hostname`` label reduced to the canonical key."""
        return relabelled(expr, self.steps())


DEFAULT_HOST_KEY = HostKey()


def _from_dcgm_host(expr: str, host: HostKey) -> str:
    """dcgm-exporter's host label, ``Hostname`` (<= 4.8.2) or ``hostname``, as the canonical
    ``hostname``."""
    return relabelled(expr, [DCGM_HOST, *host.steps()])


def _gpu_labels(expr: str, host: HostKey) -> str:
    """``expr`` with dcgm's host and UUID labels renamed (no aggregation)."""
    return relabelled(expr, [DCGM_HOST, *host.steps(), GPU_UUID])


def _gpu(inner: str, host: HostKey, op: str = "max", pods: bool = False) -> str:
    """One series per GPU, keyed (hostname, gpu, gpu_uuid), and with ``pods`` per Kubernetes pod
    holding it, with the pod labels as scraped (namespace, pod, and exported_* behind a
    ServiceMonitor without honorLabels): the inner aggregation strips every other label first,
    so the relabelling works on small label sets. The pod labels are not renamed here, where
    every GPU would pay for it; the pod join renames the few exported_* rows it reads. ``group``
    (valued 1) where only presence counts: on every GPU of a cluster each step of a query costs
    about as much as reading the series, so no ``clamp`` follows."""
    key = "hostname, gpu, gpu_uuid" + (", " + POD_LABELS if pods else "")
    keyed = _by("Hostname, hostname, gpu, UUID" + (", " + POD_LABELS if pods else ""), inner, op)
    return _by(key, relabelled(keyed, [DCGM_HOST, *host.steps(), GPU_UUID]), op)


def _host_label(inner: str, host: HostKey) -> str:
    """dcgm series reduced to (hostname, gpu), whichever host label spelling they carry."""
    keyed = _by("Hostname, hostname, gpu", inner)
    return _by("hostname, gpu", _from_dcgm_host(keyed, host))


def _paren(expr: str) -> str:
    """``expr`` in parentheses, on lines of their own when it spans several."""
    if "\n" not in expr:
        return f"({expr})"
    return promql("(\n  ${EXPR}\n)", EXPR=expr)


def _either(*variants: str) -> str:
    """Old-or-new metric names (4.9 renames): the first present wins per series."""
    if len(variants) == 1:
        return variants[0]
    # ``or`` binds loosest: only a variant holding a set operation of its own needs parentheses.
    return "\nor\n".join(_paren(v) if re.search(r"\n(or|and|unless)\b", v) else v
                         for v in variants)


def _sparse(host: HostKey, *variants: str) -> str:
    """Error counters: only GPUs with a non-zero value are relabelled and recorded.

    Each variant is filtered before the ``or`` and the relabelling, so those touch the handful of
    faulty GPUs instead of every GPU of the cluster; a multi-line variant is a sum of parts each
    filtered so (``_tagged_sum``), non-zero already.
    """
    return _gpu(_either(*(f"{v} > 0" if "\n" not in v else v for v in variants)), host)


TAGGED_PART = 'label_replace(${FN}(${METRIC}[${WINDOW}]) > 0, "counter", "${TAG}", "", "")'
TAGGED_SUM = """
sum by (${BY}) (
  ${PARTS}
)
"""


def _tagged_sum(metrics: tuple[str, ...], fn: str, window: str, by: str) -> str:
    """The non-zero ``fn(counter[window])`` of several counters summed; each is tagged with a
    ``counter`` label first, so the ``or`` keeps them all although their names are dropped."""
    parts = "\nor\n".join(promql(TAGGED_PART, FN=fn, METRIC=m, WINDOW=window, TAG=str(i))
                          for i, m in enumerate(metrics))
    return promql(TAGGED_SUM, BY=by, PARTS=parts)


def _sparse_sums(host: HostKey, fn: str, window: str, *names: tuple[str, ...]) -> str:
    """Several error counters of a GPU summed (``_tagged_sum``), under their pre-4.9 or 4.9
    names (one tuple each), non-zero only."""
    return _sparse(host, *(_tagged_sum(n, fn, window, DCGM_SERIES) for n in names))


# --- XIDs (fast tier) --------------------------------------------------------------------------

# count_values keys on the gauge's value (the code), not on err_code, which versions before 3.3
# do not have.
XID_CODES = """
max by (hostname, gpu, gpu_uuid, xid) (clamp(
  ${RELABELLED},
  1, 1
))
"""
XID_CODE_VALUES = 'count_values by (Hostname, hostname, gpu, UUID) ("xid", ${GAUGE} > 0)'
# The code each series held last before the recent window: a range, so neither a staleness
# marker nor a missed scrape right at ``offset`` hides it (range reads skip both).
XID_HELD_BEFORE = "last_over_time(${GAUGE}[${HISTORY_WINDOW}] offset ${XID_RECENT})"
XID_NEW_CODES = """
${NOW}
unless on (hostname, gpu, xid)
${BEFORE}
"""


def _xid_codes(gauge: str, host: HostKey) -> str:
    """The code each GPU's last-XID gauge holds, as an ``xid`` label, one series per
    (hostname, gpu, xid) whatever else the series carries."""
    codes = promql(XID_CODE_VALUES, GAUGE=gauge)
    return promql(XID_CODES, RELABELLED=_gpu_labels(codes, host))


def xid_rules(host: HostKey = DEFAULT_HOST_KEY) -> list[Recording]:
    """XID events of the last 10-15 minutes, per GPU and code (fast tier)."""
    counts = promql("max_over_time(DCGM_EXP_XID_ERRORS_COUNT[${XID_RECENT}]) > 0")
    counted = _by("hostname, gpu, gpu_uuid, xid", _gpu_labels(counts, host))
    before = promql(XID_HELD_BEFORE, GAUGE=XID_GAUGE)
    gauge_events = promql(XID_NEW_CODES, NOW=_xid_codes(XID_GAUGE, host),
                          BEFORE=_xid_codes(before, host))
    return [Recording(
        s.XID_EVENTS, _either(counted, gauge_events),
        "XID events per (GPU, code), valued 1 or the count: DCGM_EXP_XID_ERRORS_COUNT when "
        "dcgm-exporter counts them, else a code the last-XID gauge holds now and did not hold "
        f"last before {s.XID_RECENT} ago (its last sample in the {s.span(s.HISTORY_WINDOW)} "
        "before: the gauge keeps its code until DCGM restarts, and an exporter restart or a "
        "missed scrape leaves no hole that makes an old code new). Compared on (hostname, gpu, "
        "xid) alone, so a new pod, job or host-label spelling is no event (dcgm-exporter#500); "
        "err_code!=\"0\" selects only GPUs that ever had an XID.")]


# --- GPU telemetry past a threshold (medium tier) ----------------------------------------------

def dcgm_telemetry_rules(host: HostKey = DEFAULT_HOST_KEY) -> list[Recording]:
    """GPUs past a temperature or clock-event threshold (medium tier, sparse)."""
    def hot(field: s.Field) -> str:
        return _gpu(s.dcgm_raw(field, cut=f" >= {TEMP_WARNING_C}"), host)

    return [
        Recording(s.GPU_TEMP_HOT, hot(s.DCGM_GPU_TEMP),
                  f"GPU die temperature (C) of the GPUs at or above the {TEMP_WARNING_C} C "
                  "warning, one series per GPU whatever the dcgm-exporter version; sparse, so "
                  "the temperature alerts read a handful of GPUs."),
        Recording(s.MEMORY_TEMP_HOT, hot(s.DCGM_MEMORY_TEMP),
                  f"HBM temperature (C) of the GPUs at or above the {TEMP_WARNING_C} C "
                  "warning (sparse, as the die temperature)."),
        Recording(s.CLOCK_EVENT_REASONS,
                  _gpu(s.dcgm_raw(s.DCGM_CLOCK_EVENT_REASONS,
                                  cut=f" >= {CLOCK_BITS_OF_INTEREST}"), host),
                  "Clock-event reasons bitmask of the GPUs that may have a hardware slowdown "
                  f"bit set (bitmask >= {CLOCK_BITS_OF_INTEREST}: HW slowdown, HW thermal, HW "
                  "power brake); the thermal and power-brake alerts test the bits."),
    ]


# --- GPU presence and violation rates (slow tier) ----------------------------------------------

GPUS_DROPPED = """
max_over_time(${HOST_GPU_COUNT}[${HISTORY_WINDOW}]) - ${HOST_GPU_COUNT} > 0
"""
GPU_VANISHED = """
max by (hostname, gpu, gpu_uuid) (
  max_over_time(${GPU_PRESENT}[${HISTORY_WINDOW}])
  unless on (hostname, gpu)
  ${GPU_PRESENT}
)
and on (hostname)
${HOST_GPU_COUNT}
"""
VIOLATION_RATIO = """
clamp_max(
  ${RATE} / ${DIVISOR},
  1
)
"""


def dcgm_state_rules(violation_unit: str, host: HostKey = DEFAULT_HOST_KEY
                     ) -> list[Recording]:
    """GPU presence and violation rates (slow tier, sparse but for presence).

    Presence is the one dense per-GPU record (dashboards list GPUs from it; the host's GPU count
    derives from it in this group's order, the GPUs vanished within the hour in
    ``gpu_vanished_rules``). Every
    rate's window is longer than the tier's interval, so no increase falls between evaluations.
    """
    def ratio(metric: str) -> str:
        rate = _sparse(host, promql("rate(${METRIC}[${VIOLATION_WINDOW}])", METRIC=metric))
        return promql(VIOLATION_RATIO, RATE=rate, DIVISOR=VIOLATION_DIVISORS[violation_unit])

    why = (f"violation counter over {s.VIOLATION_WINDOW} as a fraction of time ({violation_unit} "
           "per second / 1 s, capped at 1), GPUs with a non-zero rate only")
    return [
        Recording(s.GPU_PRESENT,
                  _gpu(s.dcgm_raw(s.DCGM_GPU_TEMP), host, "group", pods=True),
                  "1 for every GPU dcgm-exporter reports (read from its temperature, which every "
                  "version exports), with the Kubernetes pod holding it as scraped (namespace, "
                  "pod, or exported_namespace/exported_pod where a ServiceMonitor without "
                  "honorLabels renamed them): the only dense per-GPU record; dashboards list "
                  "GPUs from it, and the GPU count, the pods' runs and the vanished GPUs derive "
                  "from it."),
        Recording(s.HOST_GPU_COUNT,
                  promql("count by (hostname) (group by (hostname, gpu) (${GPU_PRESENT}))"),
                  "Number of GPUs each host reports now (each once, whatever pods or exporter "
                  "replicas report it)."),
        Recording(s.HOST_GPU_COUNT_DROP, promql(GPUS_DROPPED),
                  f"GPUs fewer than a host's most within the last {s.span(s.HISTORY_WINDOW)} "
                  "(hosts with a drop only), for NodeGpuCountDropped."),
        Recording(s.THERMAL_VIOLATION, ratio("DCGM_FI_DEV_THERMAL_VIOLATION"),
                  "Share of time each GPU was throttled for heat: the thermal " + why + "."),
        Recording(s.POWER_VIOLATION, ratio("DCGM_FI_DEV_POWER_VIOLATION"),
                  "Share of time each GPU was throttled at its power limit: the power " + why
                  + "."),
    ]


def gpu_vanished_rules() -> list[Recording]:
    """The GPUs gone within the hour (wear tier): a range read of every GPU's presence, so it
    runs at the slowest pace; the host's GPU count, which drops at once, alerts at the slow
    tier (NodeGpuCountDropped) and an XID 79 on the fast path."""
    return [
        Recording(s.GPU_VANISHED, promql(GPU_VANISHED),
                  f"GPUs present within the last {s.span(s.HISTORY_WINDOW)} and gone now while "
                  "their host still reports GPUs (a GPU fallen off the bus without an XID 79); "
                  "a host gone entirely is NodeDown instead."),
    ]


# --- memory and interconnect wear (wear tier) --------------------------------------------------

def dcgm_wear_rules(host: HostKey = DEFAULT_HOST_KEY) -> list[Recording]:
    """Memory and interconnect error counters and health gauges (wear tier, sparse).

    Their job-ending forms arrive as XIDs (48, 63/64, 74, 79, 94/95) on the fast path; these
    records say how worn a part is, which windows longer than the tier's interval still tell.
    """
    def counter(fn: str, *metrics: str) -> str:
        return _sparse(host, *(promql("${FN}(${METRIC}[${WEAR_WINDOW}])", FN=fn, METRIC=m)
                               for m in metrics))

    retired = promql("""
sum by (${DCGM_SERIES}) (
  label_replace(${SBE} > 0, "counter", "sbe", "", "")
  or
  label_replace(${DBE} > 0, "counter", "dbe", "", "")
)
""", SBE=s.dcgm_raw(s.DCGM_RETIRED_SBE), DBE=s.dcgm_raw(s.DCGM_RETIRED_DBE))
    window = s.WEAR_WINDOW
    sparse = "GPUs with a non-zero value only; the 4.9 names read too"
    return [
        Recording(s.PCIE_REPLAY_RATE,
                  counter("rate", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                          "DCGM_FI_DEV_PCIE_REPLAY_TOTAL"),
                  f"PCIe replays per second over {window} per GPU ({sparse})."),
        Recording(s.NVLINK_CRC_RATE, _sparse_sums(
            host, "rate", window,
            ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
             "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
            ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL",
             "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL")),
                  f"NVLink flit and data CRC errors per second over {window}, summed per GPU "
                  f"({sparse})."),
        Recording(s.NVLINK_REPLAY_RECOVERY, _sparse_sums(
            host, "increase", window,
            ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
             "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
            ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL",
             "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL")),
                  f"NVLink replay and recovery errors in the last {window}, summed per GPU "
                  f"({sparse})."),
        Recording(s.ECC_DBE, counter("increase", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
                  f"Double-bit (uncorrectable) volatile ECC errors in the last {window} per GPU "
                  "(non-zero only)."),
        Recording(s.ECC_SBE, counter("increase", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
                  f"Single-bit (corrected) volatile ECC errors in the last {window} per GPU "
                  "(non-zero only)."),
        Recording(s.RETIRED_PAGES, _sparse(host, retired),
                  "Pages retired for single- and double-bit errors, summed per GPU (non-zero "
                  "only; the legacy and current names read), against DCGM's retirement limit."),
        Recording(s.RETIRED_PENDING, _sparse(host, s.dcgm_raw(s.DCGM_RETIRED_PENDING)),
                  "Pages waiting for a GPU reset to be retired, per GPU (non-zero only)."),
        Recording(s.ROW_REMAP_FAILURE,
                  _sparse(host, "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_FAILED"),
                  f"1 on GPUs whose row remapping failed ({sparse})."),
        Recording(s.ROW_REMAP_PENDING, _sparse(host, "DCGM_FI_DEV_ROW_REMAP_PENDING"),
                  "Row remaps waiting for a GPU reset, per GPU (non-zero only)."),
        Recording(s.GPU_RECOVERY_ACTION,
                  _sparse(host, "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
                          "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"),
                  "The driver's recovery action per GPU (DCGM field 1523, current and legacy "
                  "name; 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset; non-zero "
                  "only)."),
        Recording(s.UNCORRECTABLE_ROWS,
                  _sparse(host, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                          "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL"),
                  f"Rows remapped for uncorrectable errors per GPU ({sparse})."),
    ]


# --- which host each telemetry target reports (slow tier) --------------------------------------

NODE_EXPORTER_TARGET = """
topk by (instance, job) (1,
  max by (instance, job, hostname) (
    ${UNAME_HOST}
  )
)
"""
DCGM_EXPORTER_TARGET = """
topk by (instance, job) (1,
  clamp_max(
    count by (instance, job, hostname) (
      ${GPU_HOSTS}
    ),
    1
  )
)
"""
TARGET_OF = """
label_replace(topk by (instance, job) (1, max_over_time(${TARGET}[${HISTORY_WINDOW}])),
  "${TARGET_LABEL}", "${EXPORTER}", "", "")
"""
# The maps seen within the hour, else what this record held at its last evaluation for the
# targets still down (up == 0: still in discovery), or gone from discovery while their host has a
# run: a host down for a day still names its host, and it is forgotten when its target is up
# again or removed from discovery with no run on it (decommissioned). The seen maps win, so a
# target keeps one host: ``or on (instance, job)`` adds a remembered map only where no seen one
# has that target, reading the seen maps (an hour of both) once.
TARGET_REMEMBERED = """
topk by (instance, job) (1,
  ${SEEN}
  or on (instance, job)
  (
    (
      last_over_time(${TARGET_HOSTS}[${HISTORY_WINDOW}])
      and on (instance, job)
      ${UP_DOWN}
    )
    or
    (
      (last_over_time(${TARGET_HOSTS}[${HISTORY_WINDOW}]) unless on (instance, job) up)
      and on (hostname)
      ${NODE_INFO}
    )
  )
)
"""
NODE_EXPORTER_ONLY = """
max by (hostname) (${TARGET_HOSTS}{${TARGET_LABEL}="node_exporter"})
unless on (hostname)
${TARGET_HOSTS}{${TARGET_LABEL}!="node_exporter"}
"""
# A host with a target none of whose targets is scraped: every target of the hosts known, less
# those with one in up (each of the map and up read once).
TARGET_VANISHED = """
(
  max by (hostname, ${TARGET_LABEL}) (${TARGET_HOSTS})
  unless on (hostname, ${TARGET_LABEL})
  max by (hostname, ${TARGET_LABEL}) (${TARGET_HOSTS} and on (instance, job) up)
)
and on (hostname)
${NODE_INFO}
"""


def target_map_rules(host: HostKey = DEFAULT_HOST_KEY) -> list[Recording]:
    """Which host each telemetry target reports, remembered while it is down, the hosts whose
    target is gone, and this project's own targets (slow tier)."""
    first_gpus = s.dcgm_raw(s.DCGM_GPU_TEMP, matchers='gpu=~"0|1"')
    uname_host = host.canonical(
        'label_replace(node_uname_info, "hostname", "$1", "nodename", "(.+)")')
    gpu_hosts = _from_dcgm_host(
        promql("count by (instance, job, Hostname, hostname) (${FIRST})", FIRST=first_gpus), host)
    seen = _paren("\nor\n".join(
        promql(TARGET_OF, TARGET=target, EXPORTER=exporter)
        for exporter, target in (("node_exporter", s.NODE_EXPORTER_TARGET),
                                 ("dcgm_exporter", s.DCGM_EXPORTER_TARGET))))
    targets = promql(TARGET_REMEMBERED, SEEN=seen)
    return [
        Recording(s.NODE_EXPORTER_TARGET, promql(NODE_EXPORTER_TARGET, UNAME_HOST=uname_host),
                  "The host each node_exporter target (instance, job) reports, from "
                  "node_uname_info's nodename: node_exporter series carry no host name, so "
                  "every node record joins this."),
        Recording(s.DCGM_EXPORTER_TARGET, promql(DCGM_EXPORTER_TARGET, GPU_HOSTS=gpu_hosts),
                  "The host each dcgm-exporter target reports, from the host label of its GPUs "
                  "0 and 1 (two, so one fallen off the bus does not hide the host; a quarter of "
                  "an 8-GPU host's series to read)."),
        Recording(s.TARGET_HOSTS, targets,
                  f"Both target maps, labelled with the {s.TARGET_LABEL} they map: those seen "
                  f"within the {s.span(s.HISTORY_WINDOW)}, and for as long as it stays down "
                  "(up = 0) or, with a run on its host, gone from discovery, what this record "
                  "held for a target: a target down for a day still names its host (reads its "
                  "own last value; forgotten when the target is up again or removed from "
                  "discovery with no run on its host)."),
        Recording(s.NODE_EXPORTER_ONLY, promql(NODE_EXPORTER_ONLY),
                  "Hosts whose only target is node_exporter (its outage is a node lost): NodeDown "
                  "reads these, not every map."),
        Recording(s.TARGET_VANISHED, promql(TARGET_VANISHED),
                  f"Hosts (with a run) whose {s.TARGET_LABEL} target the last "
                  f"{s.span(s.HISTORY_WINDOW)} knew and none is scraped now (removed from "
                  "discovery), valued 1; per host, so a target that moved to a new address is "
                  "not gone. NodeDown reads it as up = 0."),
        Recording(s.PIPELINE_TARGETS, promql(PIPELINE_REMEMBERED, SEEN="\nor\n".join(
            promql(PIPELINE_SEEN, METRIC=metric, COMPONENT=component)
            for component, metric in (("exporter", m.EXPORTER_HOSTS),
                                      ("bridge", m.BRIDGE_QUEUE_RUNS)))),
                  f"This project's exporter and bridge targets by {s.PIPELINE_LABEL}: seen "
                  f"serving their metrics within the {s.span(s.HISTORY_WINDOW)}, or down "
                  "(up = 0) since (reads its own last value), so their down alerts last as long "
                  "as the target is down; forgotten when it is up again or removed from "
                  "discovery."),
    ]


PIPELINE_SEEN = """
label_replace(clamp(max by (instance, job) (max_over_time(${METRIC}[${HISTORY_WINDOW}])), 1, 1),
  "${PIPELINE_LABEL}", "${COMPONENT}", "", "")
"""
PIPELINE_REMEMBERED = """
${SEEN}
or
(
  last_over_time(${PIPELINE_TARGETS}[${HISTORY_WINDOW}])
  and on (instance, job)
  ${UP_DOWN}
)
"""


TARGET_DOWN = """
min by (hostname, ${TARGET_LABEL}) (
  ${UP_DOWN}
  * on (instance, job) group_left (hostname, ${TARGET_LABEL})
  ${TARGET_HOSTS}
)
or
(${TARGET_VANISHED} * 0)
"""
# node_exporter down or gone, and a second witness: the host's other exporters down or gone too,
# the scheduler calling the node down, or no other exporter on the host to ask.
NODE_LOST = """
${TARGET_DOWN}{${TARGET_LABEL}="node_exporter"}
and on (hostname)
(
  ${TARGET_DOWN}{${TARGET_LABEL}!="node_exporter"}
  or
  ${STATE}{state=~"${DOWN_STATES}"}
  or
  (${TARGET_DOWN} and on (hostname) ${NODE_EXPORTER_ONLY})
)
"""


def target_rules() -> list[Recording]:
    """The hosts with a telemetry target down now, and those lost as nodes (fast tier, sparse)."""
    return [
        Recording(
            s.UP_DOWN, "up == 0",
            "Every scrape target down now (up == 0, all its labels): up read once per cycle."),
        Recording(
            s.TARGET_DOWN, promql(TARGET_DOWN),
            f"Hosts with a telemetry target down now or, with a run on the host, gone from "
            f"discovery, by {s.TARGET_LABEL}, valued 0 (its up). One exporter down is a "
            "telemetry gap; the node is lost only as the record below says."),
        Recording(
            s.NODE_LOST, promql(NODE_LOST, STATE=nodestate.STATE,
                                DOWN_STATES=h.SCHEDULER_DOWN_STATES),
            "Hosts lost as nodes (NodeDown): node_exporter down or gone together with "
            "dcgm-exporter, or with the scheduler's state saying the node is down (Slurm DOWN "
            "or not responding, Kubernetes NotReady or Unknown), or on a host with no other "
            "exporter. A dcgm-exporter outage alone, or node_exporter's on a host whose "
            "dcgm-exporter answers, is a telemetry gap (HostTelemetryGap), never a node loss."),
    ]


# --- links (medium, slow and wear tiers) -------------------------------------------------------

# The physical interfaces' up gauge (the selector of virtual ones is long, so on its own line).
PHYSICAL_UP = "node_network_up{\n  ${IFACE}\n}"


def link_down_rules() -> list[Recording]:
    """InfiniBand ports not active and interfaces down, now (medium tier, sparse)."""
    return [
        Recording(s.IB_PORT_DOWN, s.node_with_host(
            promql("node_infiniband_state_id != ${IB_STATE_ACTIVE}"), LINK),
                  f"InfiniBand ports not active now (state != {s.IB_STATE_ACTIVE}), valued with "
                  "their state, named by host."),
        Recording(s.NET_DOWN, s.node_with_host(promql("${UP} == 0", UP=promql(PHYSICAL_UP)),
                                               "device"),
                  "Physical network interfaces down now (virtual ones excluded), named by host."),
    ]


def node_history_rules() -> list[Recording]:
    """The links idle for the whole last hour (wear tier, sparse: an hour's idleness does not
    change within minutes)."""
    hour = s.span(s.HISTORY_WINDOW)
    return [
        Recording(s.IB_PORT_IDLE_1H, s.node_with_host(promql(
            "max_over_time(node_infiniband_state_id[${HISTORY_WINDOW}]) != ${IB_STATE_ACTIVE}"),
            LINK),
                  f"InfiniBand ports not active at any time in the last {hour}: unused (no "
                  "cable, spare HCA), so their being down is no fault; InfinibandLinkDown "
                  "subtracts them."),
        Recording(s.NET_IDLE_1H, s.node_with_host(promql(
            "max_over_time(\n  ${UP}[${HISTORY_WINDOW}]\n) == 0", UP=promql(PHYSICAL_UP)),
            "device"),
                  f"Interfaces down for the whole last {hour} (unused); NetworkInterfaceDown "
                  "subtracts them."),
    ]


def link_wear_rules() -> list[Recording]:
    """InfiniBand flaps and physical errors, Ethernet carrier changes (wear tier, sparse)."""
    by = f"instance, job, {LINK}"
    return [
        Recording(s.IB_FLAPS, s.node_with_host(_tagged_sum(
            ("node_infiniband_link_downed_total", "node_infiniband_link_error_recovery_total"),
            "increase", s.FLAP_WINDOW, by), LINK),
                  f"InfiniBand link-down and error-recovery events in the last {s.FLAP_WINDOW} "
                  "per port (non-zero only): a link going down shows on the fast path, these "
                  "say it is degrading."),
        Recording(s.IB_PHYSICAL_ERRORS, s.node_with_host(_tagged_sum(
            ("node_infiniband_symbol_error_total",
             "node_infiniband_local_link_integrity_errors_total",
             "node_infiniband_port_receive_remote_physical_errors_total"),
            "rate", s.WEAR_WINDOW, by), LINK),
                  f"InfiniBand symbol, link-integrity and remote physical errors per second "
                  f"over {s.WEAR_WINDOW}, summed per port (non-zero only)."),
        Recording(s.NET_CARRIER_CHANGES, s.node_with_host(promql(
            "increase(\n  ${CHANGES}[${FLAP_WINDOW}]\n) > 0",
            CHANGES=promql("node_network_carrier_changes_total{\n  ${IFACE}\n}")),
            "device"),
                  f"Carrier changes per physical interface in the last {s.FLAP_WINDOW} "
                  "(non-zero only)."),
    ]


# --- runs on GPUs (slow tier) ------------------------------------------------------------------

# The runs on a host with no GPU row there: the pod join below and the runs whose GPUs are
# unknown both start from them, so the GPU rows are read for this once.
RUN_HOSTS_ROWLESS = """
max by (hostname, ${RUN}) (${NODE_INFO})
unless on (hostname, ${RUN}) ${GPU_INFO}
"""
# The pods of runs with no GPU row on their host, under the training pod's namespace/pod. Rows
# the exporter's GPU rows already hold are left out before the join: every reader reads both,
# and where runs register their GPUs too (Slurm jobs in pods) the join then touches no GPU.
RUN_PODS = """
max by (hostname, namespace, pod, ${RUN}) (
  ${EXPORTED}
  or ${POD_INFO}{exported_pod=""}
)
and on (hostname, ${RUN}) ${RUN_HOSTS_GPU_ROWLESS}
"""
# The pod on each GPU is its exported_* pair where a ServiceMonitor without honorLabels renamed
# dcgm-exporter's labels (namespace/pod are then the exporter's own), else namespace/pod. One
# run per pod even if two registrations claim it, so the join can never fail.
POD_GPU_ROWS = """
max by (hostname, gpu, ${RUN}) (
  (
    (${GPU_PRESENT}{exported_pod="",pod!=""} or ${PRESENT_EXPORTED})
    and on (namespace, pod) ${RUN_PODS_GPUS_UNKNOWN}
  )
  * on (namespace, pod) group_left (${RUN})
  topk by (namespace, pod) (1, ${RUN_PODS_GPUS_UNKNOWN})
)
"""


def pod_gpu_rules() -> list[Recording]:
    """The run on each GPU that a Kubernetes pod holds (wear tier, with the runs whose GPUs are
    unknown: placement changes as runs start and end, and each of these reads every GPU or GPU
    row, so at the slow tier they cost twice as much for answers that rarely change)."""
    # The exporter's side behind a ServiceMonitor without honorLabels: its namespace/pod are the
    # training pod's as exported_*, and namespace/pod the exporter's own (never a GPU's pod).
    exported = relabelled(f'{L.POD_INFO}{{exported_pod!=""}}', POD_EXPORTED)
    return [
        Recording(s.RUN_HOSTS_GPU_ROWLESS, promql(RUN_HOSTS_ROWLESS),
                  f"Runs on a host where {L.GPU_INFO} has no row of theirs (GPUs by pod or "
                  "unknown)."),
        Recording(s.RUN_PODS_GPUS_UNKNOWN, promql(RUN_PODS, EXPORTED=exported),
                  f"The pods of {L.POD_INFO} (namespace/pod as the training pod's, also behind "
                  "a ServiceMonitor without honorLabels) whose run has no GPU row on the host: "
                  "the pods whose GPUs the join below looks up."),
        Recording(s.POD_GPU_ROWS, promql(POD_GPU_ROWS, PRESENT_EXPORTED=relabelled(
                      f'{s.GPU_PRESENT}{{exported_pod!=""}}', POD_EXPORTED)),
                  "The run on each GPU a Kubernetes pod holds (presence's pod joined to those "
                  "pods), so a GPU fault goes to that run, not every run on the node; a run with "
                  f"GPU rows on a host is placed there by {L.GPU_INFO} alone."),
    ]


# Which GPUs each run holds: the exporter's per-GPU join metric, or, on Kubernetes, the pod that
# dcgm-exporter says holds the GPU joined to that pod's run. Each source is filtered before
# the union, so the ``or`` matches only the few rows left.
RUN_GPU_ROWS_OF = """
max by (hostname, gpu, ${RUN}) (
  (${GPU_INFO} and on (${ON}) ${HOSTS})
  or (${POD_ROWS} and on (${ON}) ${HOSTS})
)
"""
RUN_HOST_ROWS = """
max by (hostname, ${RUN}) (
  ${NODE_INFO} and on (hostname) ${HOSTS}
)
"""


def run_gpu_rows(hosts: str, on: str = L.HOSTNAME, pod_rows: str = s.POD_GPU_ROWS) -> str:
    """The run on each GPU of ``hosts`` (matched ``on`` the given labels), one series per (host,
    GPU, run) whatever the exporter replicas; filtered before the union and the ``max``, so they
    touch those rows only. ``pod_rows`` is how the reader's group reads the pod rows."""
    return promql(RUN_GPU_ROWS_OF, ON=on, HOSTS=_paren(hosts), POD_ROWS=pod_rows)


def run_host_rows(hosts: str) -> str:
    """The runs on each of ``hosts``, one series per (host, run)."""
    return promql(RUN_HOST_ROWS, HOSTS=_paren(hosts))


# --- stalls (medium tier) ----------------------------------------------------------------------

# MIG: a GPU's instances (GPU_I_ID) are separate series; the GPU counts as stalled only when none
# of them computes, since the join metrics do not say which run holds which instance. The last
# selector matches MIG series only, so it costs nothing on other clusters.
IDLE_WITH_MEMORY = """
(${IDLE})
and on (Hostname, hostname, gpu, GPU_I_ID)
(${MEMORY_HELD})
unless on (Hostname, hostname, gpu)
(${BUSY_INSTANCE})
"""
# A run whose GPUs are unknown and alone on its host holds all of them: stalled when every GPU
# there is and one of them is hung.
SOLE_STALLED = """
(${SOLE_READ} and on (hostname) ${GPU_HUNG})
* on (hostname) group_left ()
(
  max by (hostname) (${GPU_STALLED})
  and on (hostname)
  (count by (hostname) (${GPU_STALLED}) == on (hostname) ${HOST_GPU_COUNT})
)
"""


def stall_rules(host: HostKey = DEFAULT_HOST_KEY) -> list[Recording]:
    """The GPUs that stopped computing while holding memory (medium tier), and the runs alone on
    such hosts; the runs holding known GPUs are joined by the attribution group, from the rows
    it reads for every fault (``attribution.stall_join``)."""
    idle = promql(
        IDLE_WITH_MEMORY,
        IDLE=s.dcgm_raw(s.DCGM_TENSOR_ACTIVE, cut=f" < {STALL_ACTIVITY_MAX}"),
        MEMORY_HELD=s.dcgm_raw(s.DCGM_FB_USED, cut=f" > {STALL_FB_MIN_BYTES}", unit=False),
        BUSY_INSTANCE=s.dcgm_raw(s.DCGM_TENSOR_ACTIVE, matchers='GPU_I_ID!=""',
                                 cut=f" >= {STALL_ACTIVITY_MAX}"))
    return [
        Recording(s.GPU_STALLED, _host_label(idle, host),
                  f"Tensor activity of the GPUs idle (< {STALL_ACTIVITY_MAX}) while holding "
                  f"more than {STALL_FB_MIN_BYTES // 2**20} MiB of memory, matched on the raw "
                  "series before any relabelling so it stays sparse; a MIG GPU only when none "
                  "of its instances computes."),
        Recording(s.GPU_HUNG,
                  promql("${GPU_STALLED} unless on (hostname, gpu) ${IDLE_1H_READ}",
                         IDLE_1H_READ=tiers.reading(s.GPU_IDLE_1H, tiers.WEAR)),
                  "Those of them active within the last "
                  f"{s.span(s.HISTORY_WINDOW)}: a hang; GPUs idle all that time are an idle "
                  "allocation."),
        Recording(s.RUN_HOST_STALLED_SOLE,
                  promql(SOLE_STALLED,
                         SOLE_READ=tiers.reading(s.RUN_HOSTS_SOLE_GPULESS, tiers.WEAR)),
                  "Runs whose GPUs are unknown, alone on a host whose every GPU is stalled and "
                  "one hung (valued with their activity)."),
    ]


# --- workload history and stragglers (slow tier) -----------------------------------------------

GPUS_UNKNOWN = """
${RUN_HOSTS_GPU_ROWLESS}
unless on (hostname, ${RUN}) ${POD_GPU_ROWS}
"""
SOLE_GPULESS = """
${RUN_HOSTS_GPUS_UNKNOWN}
and on (hostname)
(count by (hostname) (${RUN_HOSTS_GPUS_UNKNOWN}) == 1)
"""
RUN_GPUS_LAGGING = """
(
  ${LAGGING_ROWS}
  * on (hostname, gpu) group_left ()
  ${GPU_UTIL_LAGGING}
)
or
(
  ${GPU_UTIL_LAGGING}
  * on (hostname) group_left (${RUN})
  ${RUN_HOSTS_SOLE_GPULESS}
)
"""
SOLE_LAGGING = """
(
  ${RUN_HOSTS_SOLE_GPULESS}
  and on (${RUN})
  ${RUN_GPUS_LAGGING}
)
"""
TARGETS_OF_LAGGING_RUNS = """
${DCGM_EXPORTER_TARGET}
and on (hostname) (
  max by (hostname) (${LAGGING_RUN_GPU_ROWS})
  or max by (hostname) ${SOLE_LAGGING}
)
"""
RUN_BUSIEST = """
max by (${RUN}) (
  (${LAGGING_RUN_GPU_ROWS} * on (hostname, gpu) group_left () ${GPU_UTIL_LAGGING_RUN_HOSTS})
  or (${GPU_UTIL_LAGGING_RUN_HOSTS} * on (hostname) group_left (${RUN}) ${SOLE_LAGGING})
)
"""
STRAGGLING = """
${RUN_GPUS_LAGGING}
< on (${RUN}) group_left ()
(
  (${RUN_GPU_UTIL_BUSIEST} > ${STRAGGLER_RUN_BUSY_MIN}) - ${STRAGGLER_GAP}
)
"""


def workload_history_rules(host: HostKey = DEFAULT_HOST_KEY) -> list[Recording]:
    """GPUs idle for the hour and runs whose GPUs are unknown (wear tier: neither changes within
    minutes): what the stall and straggler records compare against."""
    tensor_idle = _host_label(s.dcgm_raw(s.DCGM_TENSOR_ACTIVE, fn="max_over_time",
                                         window=s.HISTORY_WINDOW,
                                         cut=f" <= {STALL_PRIOR_ACTIVITY_MIN}"), host)
    hour = s.span(s.HISTORY_WINDOW)
    return [
        Recording(s.GPU_IDLE_1H, tensor_idle,
                  f"Peak tensor activity of the GPUs that stayed at or below "
                  f"{STALL_PRIOR_ACTIVITY_MIN} for the whole last {hour}: an idle allocation, "
                  "which the stall record does not call a hang."),
        Recording(s.RUN_HOSTS_GPUS_UNKNOWN, promql(GPUS_UNKNOWN),
                  "Runs on a host whose GPUs there are unknown (no per-GPU or pod row): GPU "
                  "faults reach them by host."),
        Recording(s.RUN_HOSTS_SOLE_GPULESS, promql(SOLE_GPULESS),
                  "Those runs when they are alone on the host, so they hold all its GPUs."),
    ]


def straggler_rules(host: HostKey = DEFAULT_HOST_KEY) -> list[Recording]:
    """GPUs well below their run's busiest (wear tier: a straggler slows a run, it does not end
    it, and the search reads utilisation twice and the GPU rows of the runs it finds).

    A straggler is more than the gap below its run's busiest GPU, so below ``1 - gap`` in any
    case: those lagging GPUs are found first (sparse), then the GPU rows of their runs; the
    second utilisation read keeps only the series of those hosts' dcgm-exporter targets (the
    target map, joined on instance and job) before any arithmetic or relabelling, which would
    otherwise touch every GPU. A target the map does not know yet leaves its host's GPUs out of
    the run's busiest, which can hide a straggler, never invent one.
    """
    def util(cut: str = "", only: str = "") -> str:
        return s.dcgm_raw(s.DCGM_GPU_UTIL, fn="avg_over_time", window=s.UTIL_WINDOW, cut=cut,
                          only=only)

    lagging_below = f"{1 - STRAGGLER_GAP:g}"
    sole_lagging = promql(SOLE_LAGGING)
    window = s.span(s.UTIL_WINDOW)
    return [
        Recording(s.GPU_UTIL_LAGGING, _host_label(util(f" < {lagging_below}"), host),
                  f"Utilisation averaged over {window} of the GPUs below {lagging_below} (every "
                  "straggler is): the straggler search's sparse start."),
        Recording(s.RUN_GPUS_LAGGING,
                  promql(RUN_GPUS_LAGGING,
                         LAGGING_ROWS=run_gpu_rows(s.GPU_UTIL_LAGGING, "hostname, gpu")),
                  "Those GPUs with the run holding them (by GPU row, or the sole run of the "
                  "host), valued with their utilisation."),
        Recording(s.LAGGING_RUN_GPU_ROWS, run_gpu_rows(s.RUN_GPUS_LAGGING, RUN),
                  "Every GPU row of the runs with a lagging GPU: the runs whose busiest GPU is "
                  "needed."),
        Recording(s.DCGM_TARGETS_LAGGING_RUNS,
                  promql(TARGETS_OF_LAGGING_RUNS, SOLE_LAGGING=sole_lagging),
                  "The dcgm-exporter targets of those runs' hosts, so their utilisation is read "
                  "from these targets alone."),
        Recording(s.GPU_UTIL_LAGGING_RUN_HOSTS,
                  _host_label(util(only=f" and on (instance, job) {s.DCGM_TARGETS_LAGGING_RUNS}"),
                              host),
                  f"GPU utilisation averaged over {window} on those hosts only, read through "
                  "their targets before any relabelling."),
        Recording(s.RUN_GPU_UTIL_BUSIEST, promql(RUN_BUSIEST, SOLE_LAGGING=sole_lagging),
                  f"Utilisation of each such run's busiest GPU (averaged over {window})."),
        Recording(s.RUN_GPU_STRAGGLING, promql(STRAGGLING),
                  f"GPUs more than {STRAGGLER_GAP * 100:g} points below their run's busiest "
                  f"GPU while that one is above {STRAGGLER_RUN_BUSY_MIN:.0%} busy, valued with "
                  "their utilisation; TrainingStraggler fires on it."),
    ]


# --- host memory, storage, reboots and maintenance, NVSwitch, power, repeat offenders --
# Sparse like the rest: every raw family is filtered by its threshold before any join. node_exporter
# series are named by host through the target map; smartctl_exporter and ipmi_exporter series by
# the host part of their ``instance`` (``exporter_host``). Read by catalog/host_alerts.py.

MEMORY_AVAILABLE = """
max_over_time(node_memory_MemAvailable_bytes[${VIOLATION_WINDOW}])
/ on (instance, job)
node_memory_MemTotal_bytes
< ${MIN}
"""
HOST_LEVEL = """
max by (hostname) (
  max by (instance, job) (${INNER})
  * on (instance, job) group_left (hostname) ${NODE_EXPORTER_TARGET}
)
"""
HOST_LEVEL_BY = """
max by (hostname, ${BY}) (
  sum by (instance, job, ${BY}) (${INNER})
  * on (instance, job) group_left (hostname) ${NODE_EXPORTER_TARGET}
)
"""
# NFS major timeouts per mount point: the mountpoint info is the many side (one export may be
# mounted twice), the timeouts summed per export the one side.
NFS_TIMEOUTS = """
max by (instance, job, mountpoint) (
  node_mountstats_nfs_mountpoint_info
  * on (instance, job, export, mountaddr, protocol) group_left ()
  sum by (instance, job, export, mountaddr, protocol) (
    increase(node_mountstats_nfs_operations_major_timeouts_total[${WEAR_WINDOW}]) > 0
  )
)
"""
FS_NOT_ANSWERING = """
max by (instance, job, mountpoint, fstype) (
  node_filesystem_device_error{${RUN_FILESYSTEMS}} == 1
)
or on (instance, job, mountpoint)
label_replace(${NFS}, "fstype", "nfs", "", "")
"""
# Read-only since a remount: read-only now and changed within WEAR_WINDOW (a 0/1 gauge that
# changed and is read-only now was writable: the turn, seen by at least one evaluation;
# changes() keeps only the mounts that turned, where min_over_time() == 0 kept every writable
# one), then held from the record's own previous value while it stays read-only. A mount
# read-only from its first sample (from boot) never enters.
FS_REMOUNTED = """
(
  ${READONLY}
  and on (hostname, mountpoint, fstype)
  ${WRITABLE}
)
or
(${READONLY} and on (hostname, mountpoint, fstype) ${REMOUNTED})
"""
FS_AVAIL_RATIO = """
node_filesystem_avail_bytes{${RUN_FILESYSTEMS}}
/
(node_filesystem_size_bytes{${RUN_FILESYSTEMS}} > 0)
< ${FS_FREE_MIN_RATIO}
"""
BOOT_ADVANCED = """
max_over_time(node_boot_time_seconds[${BOOT_WINDOW}])
> min_over_time(node_boot_time_seconds[${BOOT_WINDOW}]) + ${REBOOT_MIN_SECONDS}
"""
MAINTENANCE = """
max by (hostname, scheduler, state, reason) (
  ${STATE}{scheduler="slurm",state=~"${SLURM_STATES}"}
  or
  ${STATE}{reason=~"${REASONS}",reason!~"${UNPLANNED}"}
)
"""
# The host part of the scrape target (``host:port``), for exporters that name no host.
# The host of an exporter's series: its ``hostname`` target label where the scrape config sets
# one (ipmi_exporter scraping a BMC remotely), else the host part of ``instance``. label_join
# puts both side by side ("gpu01;10.1.0.7:9290" or ";gpu01:9633"); the regex takes the first
# when present, else the second without its port.
INSTANCE_HOST = """
label_replace(
  label_join(${EXPR}, "host_source", ";", "hostname", "instance"),
  "hostname", "$1$2", "host_source", "([^;]+);.*|;(.+?)(:[0-9]+)?"
)
"""
TAGGED_CHECK = 'label_replace(${EXPR}, "check", "${CHECK}", "", "")'
DISK_CHECKS = (
    ("smart_status failed", "smartctl_device_smart_status == 0"),
    ("NVMe critical warning", "smartctl_device_critical_warning > 0"),
    ("media errors", "increase(smartctl_device_media_errors[${WEAR_WINDOW}]) > 0"),
)
FABRIC_NOT_READY = """
${STATUS} == ${FM_NOT_STARTED}
or
${STATUS} >= ${FM_FAILURE_MIN}
"""
IPMI_POWER = """
ipmi_sensor_state{type=~"${POWER_TYPES}"} >= ${IPMI_CRITICAL}
or
ipmi_power_state >= ${IPMI_CRITICAL}
or
ipmi_voltage_state >= ${IPMI_CRITICAL}
or
ipmi_current_state >= ${IPMI_CRITICAL}
"""
IPMI_CHASSIS = """
ipmi_fan_speed_state >= ${IPMI_CRITICAL}
or
ipmi_temperature_state >= ${IPMI_CRITICAL}
or
ipmi_sensor_state{type!~"${POWER_TYPES}"} >= ${IPMI_CRITICAL}
"""
HARDWARE_FIRING = """
max by (${BY}) (
  ALERTS{alertstate="firing",alertname=~"${NAMES}"}
)
"""
# When each host's (GPU's) current hardware-fault episode began: the start the previous
# evaluation recorded while the fault still fires, else now. Each episode keeps one value, so
# changes() over a window counts the episodes in it, whatever the group's interval (episodes less
# than the lookback apart merge into one).
EPISODE_START = """
(${SINCE} and on (${BY}) ${FIRING})
or
(${FIRING} * 0 + time())
"""


def _host_values() -> dict[str, Value]:
    return {
        "RUN_FILESYSTEMS": s.RUN_FILESYSTEMS, "BOOT_WINDOW": s.BOOT_WINDOW,
        "FS_FREE_MIN_RATIO": h.FS_FREE_MIN_RATIO, "REBOOT_MIN_SECONDS": h.REBOOT_MIN_SECONDS,
        "STATE": nodestate.STATE, "SLURM_STATES": h.SLURM_MAINTENANCE_STATES,
        "REASONS": h.MAINTENANCE_REASONS, "UNPLANNED": h.UNPLANNED_REASONS,
        "FM_NOT_STARTED": h.FM_NOT_STARTED,
        "FM_FAILURE_MIN": h.FM_FAILURE_MIN, "IPMI_CRITICAL": h.IPMI_CRITICAL,
        "POWER_TYPES": h.POWER_SENSOR_TYPES, "NODE_EXPORTER_TARGET": s.NODE_EXPORTER_TARGET,
    }


def _host(inner: str) -> str:
    """node_exporter series reduced to one per host (max per target, then named by host)."""
    return promql(HOST_LEVEL, INNER=inner, **_host_values())


def _host_by(inner: str, by: str) -> str:
    """node_exporter series summed per target and ``by`` labels, named by host."""
    return promql(HOST_LEVEL_BY, INNER=inner, BY=by, **_host_values())


def _instance_host(expr: str, by: str, host: HostKey) -> str:
    """An exporter's series named by its ``hostname`` target label or ``instance``'s host
    (``INSTANCE_HOST``); the aggregation drops the helper label."""
    named = host.canonical(promql(INSTANCE_HOST, EXPR=expr))
    return promql(f"max by (hostname, {by}) (\n  ${{EXPR}}\n)", EXPR=named)


def _h(template: str, **values: Value) -> str:
    return promql(template, **{**_host_values(), **values})


def host_rules(host: HostKey = DEFAULT_HOST_KEY) -> list[Recording]:
    """Host memory, filesystems, reboots, maintenance, NVSwitch/fabric, disks and IPMI sensors
    (medium tier, sparse)."""
    fs = s.RUN_FILESYSTEMS
    disks = "\nor\n".join(_h(TAGGED_CHECK, EXPR=_paren(_h(expr)), CHECK=check)
                           for check, expr in DISK_CHECKS)
    fm_status = "DCGM_FI_DEV_FABRIC_MANAGER_STATUS"
    sxid = '{__name__=~"DCGM_FI_DEV_SXID_FATAL_ERROR|DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS"} > 0'
    nvswitch = _by("hostname, nvswitch", _from_dcgm_host(
        _by("Hostname, hostname, nvswitch", sxid), host))
    fabric = _host_label(_h(FABRIC_NOT_READY, STATUS=fm_status), host)
    return [
        Recording(s.HOST_OOM_KILLS, _host(_h(
            "node_vmstat_oom_kill - min_over_time(node_vmstat_oom_kill[${WEAR_WINDOW}]) > 0")),
                  f"OOM kills per host in the last {s.WEAR_WINDOW} (node_vmstat_oom_kill, "
                  "non-zero only): the kernel killed a process for lack of system memory. "
                  "Counted exactly, now minus the window's lowest sample (after a reboot, the "
                  "kills since it): increase() extrapolates, and a description saying 3 kills "
                  "for 2 misleads. One range read: the four it took cost twice as much."),
        Recording(s.HOST_MEMORY_PRESSURE, _host(_h(
            "rate(node_pressure_memory_stalled_seconds_total[${VIOLATION_WINDOW}]) > ${MIN}",
            MIN=h.MEMORY_PRESSURE_RATIO / 2)),
                  "Share of time every task of the host waited for memory (PSI memory full, "
                  f"over {s.VIOLATION_WINDOW}), hosts above half the alert's threshold only."),
        Recording(s.HOST_MEMORY_AVAILABLE_LOW, _host(_h(
            MEMORY_AVAILABLE, MIN=h.MEMORY_AVAILABLE_MIN_RATIO)),
                  "Hosts whose available memory stayed below "
                  f"{h.MEMORY_AVAILABLE_MIN_RATIO:.0%} of their total for the last "
                  f"{s.VIOLATION_WINDOW} (its highest MemAvailable over MemTotal): memory "
                  "exhaustion where PSI is not published."),
        Recording(s.FS_READONLY, s.node_with_host(
            f"node_filesystem_readonly{{{fs}}} == 1", "mountpoint, fstype"),
                  "Run filesystems (data, checkpoint, scratch types; no pseudo, overlay or boot "
                  "mounts) mounted read-only now, by host, mount point and type."),
        Recording(s.FS_READONLY_REMOUNTED, _h(
            FS_REMOUNTED, READONLY=s.FS_READONLY, REMOUNTED=s.FS_READONLY_REMOUNTED,
            WRITABLE=_paren(s.node_with_host(_h(
                f"changes(node_filesystem_readonly{{{fs}}}[${{WEAR_WINDOW}}]) > 0"),
                "mountpoint, fstype"))),
                  "Run filesystems read-only since a remount seen here (writable within the "
                  f"last {s.span(s.WEAR_WINDOW)} when they turned read-only), for as long as "
                  "they stay so: read from its own previous evaluation, so mounts read-only from "
                  "boot are never in it and a remount stays in it past any window."),
        Recording(s.FS_AVAIL_LOW, s.node_with_host(_h(FS_AVAIL_RATIO), "mountpoint, fstype"),
                  f"Free share of the run filesystems below {h.FS_FREE_MIN_RATIO:.0%} "
                  "(avail / size), by host and mount point."),
        Recording(s.FS_NOT_ANSWERING, s.node_with_host(
            _h(FS_NOT_ANSWERING, NFS=_paren(_h(NFS_TIMEOUTS))), "mountpoint, fstype"),
                  "Run filesystems not answering: statfs failing (node_filesystem_device_error, "
                  f"a stuck mount) or NFS major timeouts in the last {s.WEAR_WINDOW} (mountstats "
                  "collector), by host and mount point."),
        Recording(s.HOST_BOOTED, _host(_h(BOOT_ADVANCED)),
                  f"The new boot time of hosts whose node_boot_time_seconds moved later by more "
                  f"than {h.REBOOT_MIN_SECONDS} s within the last {s.BOOT_WINDOW}: a reboot, "
                  "seen once the node is back."),
        Recording(s.NODE_MAINTENANCE, _h(MAINTENANCE),
                  f"Hosts under maintenance as the exporter's {nodestate.STATE} says: a Slurm "
                  "MAINT or REBOOT state, or a reason (drain reason, Kubernetes taint or "
                  "condition) naming maintenance or a scheduled host event."),
        Recording(s.NVSWITCH_FATAL, nvswitch,
                  "The last fatal SXid of each NVSwitch (DCGM field 856, current and legacy "
                  "name; non-zero only), by host and switch."),
        Recording(s.FABRIC_MANAGER_DOWN, fabric,
                  "GPUs whose Fabric Manager status fails DCGM's health check (1 not started, "
                  ">= 4 failure, unrecognized, NVML too old), by host and GPU."),
        Recording(s.DISK_FAILING, _instance_host(disks, "device, check", host),
                  "Local disks smartctl_exporter reports failing (SMART status failed, an NVMe "
                  f"critical warning, media errors in the last {s.WEAR_WINDOW}), tagged with the "
                  "check, named by the host part of the exporter's instance."),
        Recording(s.IPMI_POWER_FAULT, _instance_host(_h(IPMI_POWER), "name", host),
                  "IPMI power-supply, power, voltage and current sensors in critical state "
                  "(ipmi_exporter), named by the host part of the exporter's instance (or its "
                  "relabelled instance: remote BMC scrapes must set it to the node's name)."),
        Recording(s.IPMI_CHASSIS_CRITICAL, _instance_host(_h(IPMI_CHASSIS), "name", host),
                  "IPMI fan, temperature and other (CPU, memory, chassis) sensors critical now "
                  "(ipmi_exporter), by host and sensor."),
    ]


def host_history_rules() -> list[Recording]:
    """The DIMM error counters (slow tier, sparse)."""
    return [
        Recording(s.HOST_EDAC_UNCORRECTABLE, _host_by(
            "node_edac_uncorrectable_errors_total > 0", "controller"),
                  "Uncorrectable system-memory errors since boot per host and memory controller "
                  "(EDAC, non-zero only); the count clears when the node reboots."),
        Recording(s.HOST_EDAC_CORRECTABLE, _host(_h(
            "sum by (instance, job) (\n  increase(node_edac_correctable_errors_total"
            "[${WEAR_WINDOW}]) > 0\n)")),
                  f"Corrected system-memory errors per host in the last {s.WEAR_WINDOW} (EDAC, "
                  "non-zero only)."),
    ]


def repeat_rules() -> list[Recording]:
    """Hardware-fault episodes per host and GPU, for the repeat offenders."""
    from_catalog = TEMPLATE_VALUES_OF_ALERTS
    host_firing = promql(HARDWARE_FIRING, BY="hostname", NAMES=from_catalog["HARDWARE_ALERTS"])
    gpu, gpu_by = s.GPU_HARDWARE_FIRING, "hostname, gpu, gpu_uuid"
    gpu_firing = promql(HARDWARE_FIRING, BY=gpu_by, NAMES=from_catalog["HARDWARE_GPU_ALERTS"])
    return [
        Recording(s.HOST_HARDWARE_FIRING, host_firing,
                  "1 for each host with a hardware-class alert firing (GPU or host: the "
                  "catalog's hardware alerts but the repeat offenders), from ALERTS."),
        Recording(s.HOST_HARDWARE_SINCE,
                  promql(EPISODE_START, SINCE=s.HOST_HARDWARE_SINCE,
                         FIRING=s.HOST_HARDWARE_FIRING, BY="hostname"),
                  "When each host's current hardware-fault episode began (Unix time), read back "
                  "from its own previous evaluation: changes() over a window + 1 is the number "
                  "of episodes in it."),
        Recording(gpu, gpu_firing,
                  "1 for each GPU (by UUID, so a replaced GPU starts afresh) with a GPU "
                  "hardware alert firing."),
        Recording(s.GPU_HARDWARE_SINCE,
                  promql(EPISODE_START, SINCE=s.GPU_HARDWARE_SINCE, FIRING=gpu, BY=gpu_by),
                  "When each GPU's current hardware-fault episode began."),
        Recording(s.GPU_HARDWARE_EPISODES,
                  promql("changes(${SINCE}[${WINDOW}]) + 1", SINCE=s.GPU_HARDWARE_SINCE,
                         WINDOW=s.REPEAT_WINDOW),
                  f"Hardware-fault episodes of each GPU in the last {s.span(s.REPEAT_WINDOW)} "
                  "(GPUs with one at least): GpuRepeatOffender counts them, and the GPU join "
                  "looks up the runs on the GPUs in it."),
    ]
