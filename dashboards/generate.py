"""Generate the Grafana dashboards as code (grafana-foundation-sdk 11.6 builders) into JSON files.

Why generated: every panel id, dashboard uid, variable name and series name comes from the shared
catalog (``catalog/``: panels, series) and the join-metric contract (``common/labels``), so
the deep links the bridge builds and the alerts' ``panel_id`` annotations always land on a panel
that exists. ``python -m wandb_infra.dashboards.generate`` rewrites the committed JSON in a source
checkout; where the package is installed it writes only into ``--out-dir DIR``. ``--check`` fails
when the files there differ from what this module produces.

Queries read the normalised series of ``alert_rules/`` (``hostname``/``gpu`` labels on every dcgm
flavour) and take each range over ``$__rate_interval``: the ``*_over_time`` keeps a short spike
(a temperature peak, a link that was down for one scrape) visible when Grafana's step is wider
than the scrape interval. Each query names the records it reads at every step; one reading records
evaluated every few minutes (the slower tiers of ``alert_rules/tiers.py``) gets the slowest one's
interval as its minimum step, so its graph does not break between two evaluations.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wandb_infra.alert_rules.generate import record_tiers
from wandb_infra.alert_rules.tiers import reading
from wandb_infra.catalog import panels as catalog
from wandb_infra.catalog import selfmetrics as m
from wandb_infra.catalog import series
from wandb_infra.catalog.alerts import (
    PCIE_REPLAYS_PER_MINUTE,
    RETIRED_PAGES_LIMIT,
    STRAGGLER_GAP,
    TEMP_CRITICAL_C,
    TEMP_WARNING_C,
    UNCORRECTABLE_ROWS_LIMIT,
    duration_seconds,
)
from wandb_infra.catalog.series import span
from wandb_infra.catalog.xid import XidClass, codes, prose
from wandb_infra.common import labels
from wandb_infra.common.generated import checkout_root, write_or_check

MISSING_SDK = ("the dashboard generator needs Grafana's foundation SDK: "
               "pip install 'wandb-infra-issues[generate]'")

try:  # the generator's one dependency the runtime does not need: the `generate` extra
    from grafana_foundation_sdk.builders import common as common_builder
    from grafana_foundation_sdk.builders import dashboard as dash
    from grafana_foundation_sdk.builders import prometheus, statetimeline, table, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import common as common_model
    from grafana_foundation_sdk.models import dashboard as model
    from grafana_foundation_sdk.models import prometheus as prom_model
except ImportError as exc:
    raise ImportError(MISSING_SDK) from exc

# The source checkout this module runs from (None where it is installed), and the default output:
# the checkout's dashboards/, this module's folder there; never written to outside a checkout.
CHECKOUT = checkout_root(__file__)
OUT_DIR = Path(__file__).resolve().parent
DATASOURCE_VAR = "datasource"
DS = model.DataSourceRef(type_val="prometheus", uid="${" + DATASOURCE_VAR + "}")
TAGS = ["wandb", "gpu", "infrastructure"]
SCHEMA_VERSION = 39

RUN_SELECTOR = ",".join(f'{name}="${name}"' for name in labels.RUN_LABELS)
HOST_SELECTOR = f'{labels.HOSTNAME}=~"${labels.HOSTNAME}"'
GPU_SELECTOR = f'{HOST_SELECTOR},{labels.GPU}=~"${labels.GPU}"'
GPU_LEGEND = f"{{{{{labels.HOSTNAME}}}}} GPU {{{{{labels.GPU}}}}}"
# Raw dcgm-exporter series carry the host as ``hostname`` or (up to 4.8.2) ``Hostname``.
DCGM_LEGEND = f"{{{{{labels.HOSTNAME}}}}}{{{{Hostname}}}} GPU {{{{{labels.GPU}}}}}"
HOST_LEGEND = f"{{{{{labels.HOSTNAME}}}}}"
LINK_LEGEND = f"{HOST_LEGEND} {{{{device}}}}/{{{{port}}}}"
ALERT_LABELS = ("alertname", "alertstate", "severity", "category", labels.HOSTNAME, labels.GPU,
                "device", "port")

# Rows group panels by the tens digit of their catalog id; row ids never collide with panel ids.
ROWS: dict[int, tuple[int, str]] = {
    0: (100, "Issues"),
    1: (101, "Thermal and power"),
    2: (102, "GPU errors: XID, ECC, row remapping"),
    3: (103, "Interconnect: NVLink and PCIe"),
    4: (104, "Workload: activity and memory (MFU proxy)"),
    5: (105, "Network and telemetry"),
    6: (106, "This project's pipeline: exporter and bridge"),
    7: (107, "Host: memory, filesystems, reboots and maintenance, fabric, power"),
}

# Clock-event reason bits worth a line (dcgm bitmask, gpu-faults.md).
VIOLATION_RATE = f"{span(series.VIOLATION_WINDOW).split()[0]}-minute rate"
CLOCK_BITS: tuple[tuple[int, str], ...] = tuple(series.CLOCK_EVENT_NAMES.items())
IB_STATES = {"1": ("Down", "red"), "2": ("Init", "orange"), "3": ("Armed", "yellow"),
             str(series.IB_STATE_ACTIVE): ("Active", "green")}


@dataclass(frozen=True)
class Query:
    """One PromQL target, its legend, and the records it reads at every step (not those read over
    the whole ``$__range``, always found): they set the target's minimum step."""

    expr: str
    legend: str
    records: tuple[str, ...] = ()


@dataclass(frozen=True)
class PanelSpec:
    """How to draw one catalog panel: visualisation, unit, description and queries."""

    viz: str
    unit: str
    description: str
    queries: tuple[Query, ...]
    width: int = 12
    height: int = 8
    mappings: dict[str, tuple[str, str]] | None = None
    max_value: float | None = None
    # The recording rules keep error series only while non-zero: no series means none recorded.
    sparse: bool = False


def record_q(fn: str, record: str, selector: str, legend: str) -> Query:
    """``fn_over_time(record{selector}[$__rate_interval])``."""
    return Query(f"{fn}_over_time({record}{{{selector}}}[$__rate_interval])", legend, (record,))


def gpu_q(fn: str, record: str, legend_suffix: str = "") -> Query:
    """A per-GPU record, aggregated over the rate interval."""
    return record_q(fn, record, GPU_SELECTOR, GPU_LEGEND + legend_suffix)


def dcgm_q(fn: str, field: series.Field, legend_suffix: str = "") -> Query:
    """A per-GPU dcgm-exporter field read at query time (no dense recording rule holds it)."""
    return Query(series.dcgm_gpu(field, f"${labels.HOSTNAME}", f"${labels.GPU}",
                                 f"{fn}_over_time", "$__rate_interval"),
                 DCGM_LEGEND + legend_suffix)


def util(fn: str) -> str:
    """The selected GPUs' utilisation, ``fn`` over the rate interval, read from dcgm-exporter."""
    return series.dcgm_gpu(series.DCGM_GPU_UTIL, f"${labels.HOSTNAME}", f"${labels.GPU}",
                           f"{fn}_over_time", "$__rate_interval")


def node_q(fn: str, metric: str, by: str, legend: str) -> Query:
    """A node_exporter series of the selected hosts, named by host (joined at query time to the
    node_exporter target map)."""
    return Query(series.node_with_host(f"{fn}_over_time({metric}[$__rate_interval])", by,
                                       f"${labels.HOSTNAME}"),
                 legend, (series.NODE_EXPORTER_TARGET,))


def _xids(cls: XidClass) -> str:
    """The catalog's codes of one class as prose (``8, 11, 13 and 39-41``), so the text follows
    it."""
    return prose(codes(cls))


def alerts_table(alert_selector: str) -> Query:
    """Alerts that fired in the dashboard's time range, one row per alert and entity."""
    by = ", ".join(ALERT_LABELS)
    return Query(f"max by ({by}) (max_over_time(ALERTS{{{alert_selector}}}[$__range]))", "")


def specs(alert_selector: str, scope: str) -> dict[str, PanelSpec]:
    """Panel specs by catalog key; ``alert_selector`` picks the run's or the hosts' alerts."""
    timeline_by = f"alertname, {labels.HOSTNAME}, {labels.GPU}, device"
    return {
        "alerts": PanelSpec(
            "table", "none",
            f"Every alert that fired for this {scope} in the time range (firing now or recently), "
            "with the GPU, host or link it was raised on. The bridge groups these into issues and "
            "marks the root cause.",
            (alerts_table(alert_selector),), width=24, height=7),
        "issue_timeline": PanelSpec(
            "state", "none",
            "When each alert was firing: the first bar is usually the root cause (hardware before "
            "node loss before link loss before slowdowns and stalls).",
            (Query(f"max by ({timeline_by}) (ALERTS{{{alert_selector},alertstate=\"firing\"}})",
                   "{{alertname}} {{hostname}} {{gpu}}{{device}}"),), width=24, height=7,
            mappings={"1": ("Firing", "red")}),
        "gpu_temperature": PanelSpec(
            "timeseries", "celsius",
            f"GPU die temperature (max over the interval). {TEMP_WARNING_C} C is a warning, "
            f"{TEMP_CRITICAL_C} C critical; clocks are cut before that.",
            (dcgm_q("max", series.DCGM_GPU_TEMP),)),
        "hbm_temperature": PanelSpec(
            "timeseries", "celsius",
            f"HBM (memory) temperature (max over the interval). {TEMP_WARNING_C} C is a warning, "
            f"{TEMP_CRITICAL_C} C critical.",
            (dcgm_q("max", series.DCGM_MEMORY_TEMP),)),
        "thermal_violation": PanelSpec(
            "timeseries", "percentunit",
            f"Share of time the GPU was throttled for temperature ({VIOLATION_RATE} of dcgm's "
            "violation counter, normalised to a fraction). Above a few percent the run slows.",
            (gpu_q("max", series.THERMAL_VIOLATION),), max_value=1, sparse=True),
        "power_violation": PanelSpec(
            "timeseries", "percentunit",
            f"Share of time the GPU was throttled by its power limit ({VIOLATION_RATE} of dcgm's "
            "violation counter, normalised to a fraction).",
            (gpu_q("max", series.POWER_VIOLATION),), max_value=1, sparse=True),
        "clock_events": PanelSpec(
            "timeseries", "short",
            "Clock-event reasons that slow a GPU, one line per active reason (1 = active): HW "
            "thermal, HW slowdown and power brake point at cooling or power delivery.",
            tuple(
                Query(f"floor({dcgm_q('max', series.DCGM_CLOCK_EVENT_REASONS).expr} / {bit})"
                      f" % 2 == 1", f"{DCGM_LEGEND} {name}")
                for bit, name in CLOCK_BITS)),
        "power_usage": PanelSpec(
            "timeseries", "watt",
            "Board power draw (average over the interval). A drop with steady utilisation "
            "often means a stall or throttling.",
            (dcgm_q("avg", series.DCGM_POWER_USAGE),)),
        "xid_errors": PanelSpec(
            "timeseries", "short",
            "XID errors reported by the driver, one line per GPU and XID code. "
            "NVIDIA's catalog says to restart the application for "
            f"{_xids(XidClass.APPLICATION)} (and 94, a contained memory error) and to do nothing "
            f"for {_xids(XidClass.INFORMATIONAL)}; {_xids(XidClass.DECODE)} are decoded from "
            "their fields; the other catalogued codes need a GPU reset, a reboot or support "
            "(the runbook's XID catalog gives each code's action).",
            (record_q("max", series.XID_EVENTS, GPU_SELECTOR, f"{GPU_LEGEND} XID {{{{xid}}}}"),),
            sparse=True),
        "ecc_errors": PanelSpec(
            "timeseries", "short",
            f"Double- and single-bit ECC errors in the last {span(series.WEAR_WINDOW)}, pages "
            "retired and pages pending retirement. Any double-bit error kills the process on "
            "that GPU.",
            (gpu_q("max", series.ECC_DBE, f" DBE {series.WEAR_WINDOW}"),
             gpu_q("max", series.ECC_SBE, f" SBE {series.WEAR_WINDOW}"),
             gpu_q("max", series.RETIRED_PAGES, " retired pages"),
             gpu_q("max", series.RETIRED_PENDING, " retirement pending")), sparse=True),
        "row_remap": PanelSpec(
            "timeseries", "short",
            "HBM row remapping: a pending remap is applied at the next GPU reset; a failed "
            f"remap or many uncorrectable rows ({UNCORRECTABLE_ROWS_LIMIT}) means the GPU should "
            "be replaced. Retired pages, the older GPUs' equivalent, count against the same "
            f"limit ({RETIRED_PAGES_LIMIT}).",
            (gpu_q("max", series.ROW_REMAP_PENDING, " pending"),
             gpu_q("max", series.ROW_REMAP_FAILURE, " failed"),
             gpu_q("max", series.UNCORRECTABLE_ROWS, " uncorrectable rows"),
             gpu_q("max", series.RETIRED_PAGES, " retired pages")), sparse=True),
        "gpu_count": PanelSpec(
            "timeseries", "short",
            "GPUs dcgm-exporter reports per host (min over the interval). Fewer than the host "
            "has means a GPU fell off the bus or the driver lost it.",
            (record_q("min", series.HOST_GPU_COUNT, HOST_SELECTOR, HOST_LEGEND),)),
        "nvlink_errors": PanelSpec(
            "timeseries", "short",
            f"NVLink CRC errors per second and replay/recovery errors in the last "
            f"{span(series.WEAR_WINDOW)}. Any replay or recovery error degrades collectives on "
            "that host.",
            (gpu_q("max", series.NVLINK_CRC_RATE, " CRC/s"),
             gpu_q("max", series.NVLINK_REPLAY_RECOVERY,
                   f" replay+recovery {series.WEAR_WINDOW}")),
            sparse=True),
        "pcie_replays": PanelSpec(
            "timeseries", "cps",
            f"PCIe replays per second ({span(series.WEAR_WINDOW).split()[0]}-minute rate). DCGM "
            f"warns above {PCIE_REPLAYS_PER_MINUTE} per minute on Gen4 x16 and about twice that "
            "on Gen5: a bad riser, slot or cable.",
            (gpu_q("max", series.PCIE_REPLAY_RATE),), sparse=True),
        "tensor_activity": PanelSpec(
            "timeseries", "percentunit",
            "Tensor-pipe activity (tracks MFU within a few points) and GPU utilisation. Tensor "
            "activity near zero with utilisation high and memory held is a hung collective.",
            (dcgm_q("avg", series.DCGM_TENSOR_ACTIVE, " tensor"),
             dcgm_q("avg", series.DCGM_GPU_UTIL, " utilisation")), max_value=1),
        "gpu_memory": PanelSpec(
            "timeseries", "bytes",
            "Framebuffer memory in use. Held memory with no activity is a stall; memory freed "
            "at once is a crash.",
            (dcgm_q("max", series.DCGM_FB_USED),)),
        "gpu_util_spread": PanelSpec(
            "timeseries", "percentunit",
            f"Max minus min GPU utilisation across the run's GPUs. Above {STRAGGLER_GAP:.0%} for "
            "minutes means a straggler holds the others back.",
            (Query(f"max({util('max')}) - min({util('min')})", "spread"),), max_value=1),
        "ib_link_state": PanelSpec(
            "state", "none",
            "InfiniBand port state per host and HCA (min over the interval, so a short drop "
            "shows): Active is healthy, Down or Init breaks the job's collectives.",
            (node_q("min", "node_infiniband_state_id", "device, port", LINK_LEGEND),),
            mappings=IB_STATES),
        "ib_errors": PanelSpec(
            "timeseries", "short",
            "InfiniBand physical errors per second (symbol, link integrity, remote physical) "
            f"and link-down events in the last {span(series.FLAP_WINDOW)}: flapping links stall "
            "NCCL.",
            (record_q("max", series.IB_PHYSICAL_ERRORS, HOST_SELECTOR, f"{LINK_LEGEND} errors/s"),
             record_q("max", series.IB_FLAPS, HOST_SELECTOR,
                      f"{LINK_LEGEND} flaps {series.FLAP_WINDOW}")),
            sparse=True),
        "net_interfaces": PanelSpec(
            "timeseries", "short",
            "Ethernet/RoCE interfaces: up (1) or down (0), and carrier changes in the last "
            f"{span(series.FLAP_WINDOW)}.",
            (node_q("min", f"node_network_up{{{series.PHYSICAL_INTERFACES}}}", "device",
                    f"{HOST_LEGEND} {{{{device}}}} up"),
             record_q("max", series.NET_CARRIER_CHANGES, HOST_SELECTOR,
                      f"{HOST_LEGEND} {{{{device}}}} carrier changes {series.FLAP_WINDOW}"))),
        "pipeline_targets": PanelSpec(
            "timeseries", "short",
            "Whether Prometheus scrapes the exporter and the bridge (1 up, 0 down), found by the "
            "metrics they serve, and how many runs and hosts the exporter maps. No runs while "
            "GPUs are busy means faults reach no W&B run.",
            (Query(f"max by (instance, job) (up and on (instance, job) "
                   f"(max_over_time({m.EXPORTER_HOSTS}[$__range]) or "
                   f"max_over_time({m.BRIDGE_QUEUE_RUNS}[$__range])))", "{{job}} {{instance}} up"),
             Query(f"max by (instance) ({m.EXPORTER_RUNS})", "{{instance}} runs mapped"),
             Query(f"max by (instance) ({m.EXPORTER_HOSTS})", "{{instance}} hosts mapped"))),
        "pipeline_sources": PanelSpec(
            "timeseries", "s",
            "Seconds since each exporter source (Slurm, Kubernetes, W&B, registrations) last "
            "polled successfully; it should stay near the source's interval.",
            (Query(f"time() - max by (instance, source) ({m.EXPORTER_SOURCE_LAST_SUCCESS})",
                   "{{source}} since last success"),)),
        "pipeline_delivery": PanelSpec(
            "timeseries", "short",
            "The bridge's runs waiting for a W&B write, runs parked (not retried until fixed), "
            "the age in seconds of the oldest undelivered change, and whether its store is "
            "writable (1).",
            (Query(f"max by (instance) ({m.BRIDGE_QUEUE_RUNS})", "{{instance}} queued runs"),
             Query(f"max by (instance) ({m.BRIDGE_PARKED_RUNS})", "{{instance}} parked runs"),
             Query(f"max by (instance) ({m.BRIDGE_OLDEST_UNDELIVERED})",
                   "{{instance}} oldest undelivered (s)"),
             Query(f"min by (instance) ({m.BRIDGE_STORE_WRITABLE})",
                   "{{instance}} store writable"))),
        "targets_up": PanelSpec(
            "timeseries", "short",
            "Whether Prometheus can scrape each host's node_exporter and dcgm-exporter (1 up, "
            "0 down). Both down at once means the host itself is gone.",
            (Query(f"min by ({labels.HOSTNAME}, {series.TARGET_LABEL}) (up * on (instance, job) "
                   f"group_left ({labels.HOSTNAME}, {series.TARGET_LABEL}) topk by (instance, job) "
                   f"(1, max_over_time({series.TARGET_HOSTS}{{{HOST_SELECTOR}}}[$__range])))",
                   f"{HOST_LEGEND} {{{{{series.TARGET_LABEL}}}}}"),), max_value=1),
    }


# ---- the host around the GPUs (catalog/host_alerts.py) -----------------------------

def host_specs(board_key: str) -> dict[str, PanelSpec]:
    """Panels of the host alerts: the sparse records they read (no series: nothing recorded)."""
    sel = "" if board_key == "pipeline" else HOST_SELECTOR

    def rec(record: str, legend: str, fn: str = "max") -> Query:
        return record_q(fn, record, sel, legend)

    mount = f"{HOST_LEGEND} {{{{mountpoint}}}}"
    sensor = f"{HOST_LEGEND} {{{{name}}}}"
    episodes = "changes({record}{{{sel}}}[{window}]) + 1"
    return {
        "host_memory": PanelSpec(
            "timeseries", "short",
            f"OOM kills in the last {span(series.WEAR_WINDOW)} (a process killed for lack of "
            "system memory), the share of time every task waited for memory (PSI full), "
            "uncorrectable DIMM errors since boot and corrected ones in the last "
            f"{span(series.WEAR_WINDOW)} (EDAC).",
            (rec(series.HOST_OOM_KILLS, f"{HOST_LEGEND} OOM kills"),
             rec(series.HOST_MEMORY_PRESSURE, f"{HOST_LEGEND} memory pressure (share)"),
             rec(series.HOST_EDAC_UNCORRECTABLE,
                 f"{HOST_LEGEND} uncorrectable DIMM errors (mc {{{{controller}}}})"),
             rec(series.HOST_EDAC_CORRECTABLE, f"{HOST_LEGEND} corrected DIMM errors")),
            sparse=True),
        "filesystems": PanelSpec(
            "timeseries", "short",
            "Run filesystems (data, checkpoints, scratch) in trouble: the free share of those "
            "nearly full, 1 for those read-only now, and those not answering (1 statfs failing, "
            "or the count of NFS major timeouts).",
            (rec(series.FS_AVAIL_LOW, f"{mount} free share", "min"),
             rec(series.FS_READONLY, f"{mount} read-only"),
             rec(series.FS_NOT_ANSWERING, f"{mount} not answering")), sparse=True),
        "local_disks": PanelSpec(
            "timeseries", "short",
            "Local disks smartctl_exporter reports failing: SMART status failed (0), an NVMe "
            "critical warning (its bits), media errors.",
            (rec(series.DISK_FAILING, f"{HOST_LEGEND} {{{{device}}}} {{{{check}}}}"),),
            sparse=True),
        "reboots": PanelSpec(
            "timeseries", "short",
            f"1 while a host is under maintenance (scheduler state or reason), and 1 for "
            f"{span(series.BOOT_WINDOW)} after a host booted again.",
            (rec(series.NODE_MAINTENANCE, f"{HOST_LEGEND} maintenance {{{{state}}}}"),
             Query(f"count by ({labels.HOSTNAME}) (max_over_time({series.HOST_BOOTED}{{{sel}}}"
                   "[$__rate_interval]))", f"{HOST_LEGEND} rebooted", (series.HOST_BOOTED,))),
            sparse=True),
        "fabric": PanelSpec(
            "timeseries", "short",
            "The last fatal SXid per NVSwitch, and the Fabric Manager status of GPUs whose "
            "NVLink fabric is not trained (1 not started, 4 failure; 3 success is not shown).",
            (rec(series.NVSWITCH_FATAL, f"{HOST_LEGEND} NVSwitch {{{{nvswitch}}}} SXid"),
             rec(series.FABRIC_MANAGER_DOWN, f"{GPU_LEGEND} Fabric Manager status")),
            sparse=True),
        "power_chassis": PanelSpec(
            "timeseries", "short",
            "IPMI sensors in critical state (2), from ipmi_exporter where it is scraped: power "
            "supplies, power, voltage and current; fans, temperatures and other chassis "
            "sensors.",
            (rec(series.IPMI_POWER_FAULT, f"{sensor} (power)"),
             rec(series.IPMI_CHASSIS_CRITICAL, f"{sensor} (chassis)")), sparse=True),
        "repeat_offenders": PanelSpec(
            "timeseries", "short",
            "Hardware-fault episodes per host and per GPU in the dashboard's time range (the "
            f"alerts count the last {span(series.REPEAT_WINDOW)}): from the third, replace the "
            "part instead of resetting it again.",
            (Query(episodes.format(record=series.HOST_HARDWARE_SINCE, sel=sel,
                                   window="$__range"), f"{HOST_LEGEND} episodes"),
             Query(episodes.format(record=series.GPU_HARDWARE_SINCE, sel=sel,
                                   window="$__range"), f"{GPU_LEGEND} episodes")),
            sparse=True),
    }


# ---- variables -------------------------------------------------------------------------------

def datasource_variable() -> dash.DatasourceVariable:
    """The one datasource variable every panel uses."""
    return (dash.DatasourceVariable(DATASOURCE_VAR).label("Data source").type("prometheus")
            .description("Prometheus holding dcgm-exporter, node_exporter and the join metrics."))


def query_variable(name: str, query: str, description: str, *, multi: bool = False,
                   regex: str = "") -> dash.QueryVariable:
    """A variable filled from PromQL (``label_values`` or ``query_result``)."""
    var = (dash.QueryVariable(name).label(name).datasource(DS).description(description)
           .query(query)
           .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
           .sort(model.VariableSort.ALPHABETICAL_ASC))
    if regex:
        var = var.regex(regex)
    if multi:
        var = var.multi(True).include_all(True)
    return var


def run_variables() -> list[Any]:
    """entity -> project -> run -> the run's hosts -> the run's GPUs (all from the join metrics)."""
    node_info, gpu_info = labels.NODE_INFO, labels.GPU_INFO
    ent, proj, run = labels.ENTITY, labels.PROJECT, labels.RUN_ID
    host, gpu = labels.HOSTNAME, labels.GPU
    selector = f"{{{RUN_SELECTOR},{HOST_SELECTOR}}}"
    # Kubernetes: the GPUs the run's pods hold, from dcgm-exporter's pod labels (rules), a record
    # of the wear tier, so read over its last evaluation.
    pod_rows = reading(f"{series.POD_GPU_ROWS}{selector}", record_tiers()[series.POD_GPU_ROWS])
    run_gpus = f"({gpu_info}{selector} or {pod_rows})"
    gpu_query = (
        f"query_result(max by ({host}, {gpu}) ({run_gpus}) or (max by ({host}, {gpu}) "
        f"({series.GPU_PRESENT}{{{HOST_SELECTOR}}}) unless on () count({run_gpus})))")
    return [
        datasource_variable(),
        query_variable(ent, f"label_values({node_info}, {ent})", "W&B entity (team or user)."),
        query_variable(proj, f'label_values({node_info}{{{ent}="${ent}"}}, {proj})',
                       "W&B project."),
        query_variable(run, f'label_values({node_info}{{{ent}="${ent}",{proj}="${proj}"}}, '
                            f"{run})", "W&B run id."),
        query_variable(host, f"label_values({node_info}{{{RUN_SELECTOR}}}, {host})",
                       "Hosts the run is on.", multi=True),
        query_variable(gpu, gpu_query,
                       "The run's GPUs on the selected hosts; every GPU of those hosts when the "
                       "run's GPUs are not known.", multi=True, regex=f'/{gpu}="([^"]+)"/'),
    ]


def node_variables() -> list[Any]:
    """Hosts and GPUs from what dcgm-exporter reports."""
    host, gpu = labels.HOSTNAME, labels.GPU
    return [
        datasource_variable(),
        query_variable(host, f"label_values({series.GPU_PRESENT}, {host})",
                       "Hosts with GPUs reporting.", multi=True),
        query_variable(gpu, f"label_values({series.GPU_PRESENT}{{{HOST_SELECTOR}}}, {gpu})",
                       "GPUs of the selected hosts.", multi=True),
    ]


# ---- panels ----------------------------------------------------------------------------------

RECORD_TIERS = record_tiers()


def min_interval(query: Query) -> str | None:
    """The slowest evaluation interval of the records ``query`` reads at each step (None: every
    cycle): a shorter step or ``$__rate_interval`` would break the graph between two
    evaluations. A name that is no record is a KeyError."""
    tiers = [tier for r in query.records if (tier := RECORD_TIERS[r]) is not None]
    return max(tiers, key=duration_seconds, default=None)


def _target(query: Query, ref: str, *, instant: bool = False) -> prometheus.Dataquery:
    target = (prometheus.Dataquery().expr(query.expr).ref_id(ref).datasource(DS)
              .legend_format(query.legend or "__auto"))
    interval = min_interval(query)
    if interval and not instant:
        target = target.interval(interval)
    if instant:
        return target.instant().format(prom_model.PromQueryFormat.TABLE)
    return target.range()


def _mappings(mapping: dict[str, tuple[str, str]]) -> list[model.ValueMapping]:
    return [model.ValueMap(options={
        value: model.ValueMappingResult(text=text, color=color, index=i)
        for i, (value, (text, color)) in enumerate(mapping.items())})]


def node_link(title: str) -> dash.DashboardLink:
    """A data link from a host's series to the node dashboard, same time range."""
    url = (f"/d/{catalog.NODE.uid}/{catalog.NODE.slug}?var-{labels.HOSTNAME}="
           f"${{__field.labels.{labels.HOSTNAME}}}&${{__url_time_range}}")
    return dash.DashboardLink(title).type(model.DashboardLinkType.LINK).url(url)


def build_panel(key: str, spec: PanelSpec, board_key: str) -> Any:
    """One panel with the catalog's id and title and the spec's queries."""
    entry = catalog.panel(key)
    builders: dict[str, Callable[[], Any]] = {
        "timeseries": timeseries.Panel, "table": table.Panel, "state": statetimeline.Panel,
    }
    panel = (builders[spec.viz]().id(entry.id).title(entry.title).description(spec.description)
             .datasource(DS).unit(spec.unit).span(spec.width).height(spec.height))
    refs = "ABCDEFGHIJ"
    for i, query in enumerate(spec.queries):
        panel = panel.with_target(_target(query, refs[i], instant=spec.viz == "table"))
    if spec.max_value is not None:
        panel = panel.min(0).max(spec.max_value)
    if spec.mappings:
        panel = panel.mappings(_mappings(spec.mappings))
    if spec.sparse:
        panel = panel.no_value("None recorded")
    if spec.viz == "timeseries":
        panel = (panel.line_width(1).fill_opacity(10).span_nulls(False)
                 .legend(common_builder.VizLegendOptions()
                         .display_mode(common_model.LegendDisplayMode.TABLE)
                         .placement(common_model.LegendPlacement.RIGHT)
                         .show_legend(True).calcs(["max", "lastNotNull"])))
    if spec.viz == "state":
        panel = panel.show_value(common_model.VisibilityMode.NEVER).merge_values(True)
    if spec.viz == "table":
        panel = panel.with_transformation(model.DataTransformerConfig(
            id_val="organize", options={"excludeByName": {"Time": True, "Value": True}}))
    if board_key == "run" and spec.viz == "timeseries" and key != "gpu_util_spread":
        panel = panel.data_links([node_link("Open this host in Node GPU health")])
    return panel


def build_dashboard(board: catalog.Dashboard) -> dict[str, Any]:
    """The JSON model of one catalog dashboard."""
    if board.key == "run":
        alert_selector = RUN_SELECTOR
        variables = run_variables()
        scope = "run"
        description = ("Infrastructure under one W&B run: its hosts' and GPUs' faults, throttling, "
                       "interconnect and network, with the run's alerts marked on every graph.")
    elif board.key == "pipeline":
        alert_selector = 'category="pipeline"'
        variables = [datasource_variable()]
        scope = "pipeline"
        description = ("This project's own path from scheduler to W&B: the run-to-host exporter "
                       "and its sources, the bridge's delivery queue and store.")
    else:
        alert_selector = HOST_SELECTOR
        variables = node_variables()
        scope = "host"
        description = "All GPUs and links of one or a few hosts, for the operator."
    panel_specs = {**specs(alert_selector, scope), **host_specs(board.key)}
    other = catalog.NODE if board.key == "run" else catalog.RUN
    builder = (dash.Dashboard(board.title).uid(board.uid).description(description).tags(TAGS)
               .editable().time("now-6h", "now").refresh("1m").timezone("browser")
               .tooltip(model.DashboardCursorSync.CROSSHAIR).variables(variables)
               .annotation(dash.AnnotationQuery().name("Alerts").datasource(DS).enable(True)
                           .icon_color("red").expr(f'ALERTS{{{alert_selector},'
                                                   f'alertstate="firing"}}'))
               .link(dash.DashboardLink(other.title).type(model.DashboardLinkType.LINK)
                     .url(f"/d/{other.uid}/{other.slug}").include_vars(True).keep_time(True)
                     .icon("dashboard")))
    current_row = None
    for key, entry in catalog.PANELS.items():
        if board.key not in entry.dashboards:
            continue
        row_id, row_title = ROWS.get(entry.id // 10, (100 + entry.id // 10, "More"))
        if row_id != current_row:
            builder = builder.with_row(dash.Row(row_title).id(row_id))
            current_row = row_id
        if key not in panel_specs:
            raise KeyError(f"catalog panel {key!r} has no PanelSpec in dashboards/generate.py")
        builder = builder.with_panel(build_panel(key, panel_specs[key], board.key))
    data = json.loads(JSONEncoder(sort_keys=True).encode(builder.build()))
    data["schemaVersion"] = SCHEMA_VERSION
    for annotation in data["annotations"]["list"]:
        if annotation.get("expr"):
            # Fields of the Prometheus annotation query that the SDK's generic model lacks.
            annotation.update({
                "titleFormat": "{{alertname}}",
                "textFormat": "{{hostname}} GPU {{gpu}} {{device}} ({{severity}})",
                "tagKeys": "severity,category", "step": "60s", "useValueForTime": False,
            })
    return data


def render(out_dir: Path | None = None) -> dict[Path, str]:
    """File path (in ``out_dir``, by default ``OUT_DIR``) -> JSON text for every catalog
    dashboard."""
    return {
        (out_dir or OUT_DIR) / f"{board.uid}.json":
            json.dumps(build_dashboard(board), indent=2, sort_keys=True) + "\n"
        for board in catalog.DASHBOARDS.values()
    }


def main(argv: Iterable[str] | None = None) -> int:
    """Write the dashboards, or with --check report the ones that are out of date."""
    parser = argparse.ArgumentParser(description="Generate Grafana dashboards from the catalog.")
    parser.add_argument("--out-dir", type=Path,
                        help="folder to write the dashboard JSON files into (default in a source "
                             "checkout: its dashboards/; required where the package is installed)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a dashboard there differs")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.out_dir is None and CHECKOUT is None:
        print("error: not run from a source checkout of wandb-infra-issues: pass --out-dir DIR "
              "(the folder to write the dashboards into)", file=sys.stderr)
        return 2
    return write_or_check(render(args.out_dir), args.check)


if __name__ == "__main__":
    sys.exit(main())
