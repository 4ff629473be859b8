"""Every dashboard query against a real Prometheus: the simulator's dcgm-exporter (three flavours)
and node_exporter series with faults injected, the join metrics, and the shipped rules loaded.

Checks that every panel and variable query evaluates, that the variables narrow to the run's hosts
and GPUs, and that the panel each alert links to shows that fault's host, GPU and run.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from demo.simulator.cluster import Cluster
from demo.simulator.scrape import prometheus_config
from demo.simulator.server import serve
from demo.stack import scale_rules
from harness.processes import prom_query, prometheus, wait_for
from wandb_infra.catalog import host_alerts, series
from wandb_infra.catalog import panels as catalog
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.dashboards import generate

ROOT = Path(__file__).resolve().parent.parent
RULE_FILES = sorted((ROOT / "alert_rules").glob("*.rules.yml"))
RUN = {"wandb_entity": "team", "wandb_project": "llm", "wandb_run_id": "run-1"}
RUN_HOSTS = [f"gpu-node-00{i}" for i in range(1, 6)]
SPARE = "gpu-node-006"
RATE_INTERVAL = "20s"
DEADLINE_S = 120
# Grafana escapes these in multi-value variables as \\<char> inside a PromQL string.
PROM_REGEX_META = re.compile(r"([\\^$.|?*+(){}\[\]])")


@dataclass(frozen=True)
class Fault:
    """A fault injected for an alert, and where the linked panel must show it."""

    kind: str
    host: str
    gpu: int | None = None
    code: int | None = None
    device: str | None = None


# Alerts the simulator can cause, each on its own GPU or host so the faults do not mix.
FAULTS: dict[str, Fault] = {
    "GpuXidError": Fault("xid", "gpu-node-001", 1, code=48),
    "GpuUncontainedEccError": Fault("xid", "gpu-node-001", 2, code=95),
    "GpuContainedEccError": Fault("xid", "gpu-node-001", 3, code=94),
    "GpuXidApplicationError": Fault("xid", "gpu-node-001", 4, code=13),
    "GpuXidInformational": Fault("xid", "gpu-node-001", 5, code=63),
    "GpuXidUnclassified": Fault("xid", "gpu-node-001", 6, code=201),
    "GpuXidDecodeRequired": Fault("xid", "gpu-node-001", 0, code=145),
    # XID 48 needs a GPU reset: the simulated driver sets its recovery action to 1
    "GpuRecoveryActionRequired": Fault("xid", "gpu-node-001", 1, code=48),
    "GpuDoubleBitEccErrors": Fault("ecc_dbe", "gpu-node-002", 0),
    "GpuRowRemapPending": Fault("row_remap_pending", "gpu-node-002", 1),
    "GpuRowRemapFailure": Fault("row_remap_failure", "gpu-node-002", 6),
    "GpuSingleBitEccStorm": Fault("sbe_storm", "gpu-node-002", 7),
    "GpuMemoryRetirementLimit": Fault("sbe_storm", "gpu-node-002", 7),
    "GpuThermalViolation": Fault("thermal", "gpu-node-002", 2),
    "GpuTemperatureHigh": Fault("thermal", "gpu-node-002", 2),
    "GpuMemoryTemperatureCritical": Fault("thermal", "gpu-node-002", 2),
    "GpuMemoryTemperatureHigh": Fault("thermal", "gpu-node-002", 2),
    "GpuTemperatureCritical": Fault("thermal", "gpu-node-002", 2),
    "GpuNvlinkErrors": Fault("nvlink", "gpu-node-002", 3),
    "GpuNvlinkFailure": Fault("nvlink", "gpu-node-002", 3),
    "GpuPcieReplayRate": Fault("pcie", "gpu-node-002", 4),
    "GpuFallenOffBus": Fault("xid", "gpu-node-003", 7, code=79),
    "NodeGpuCountDropped": Fault("xid", "gpu-node-003", 7, code=79),
    "InfinibandLinkDown": Fault("ib_down", "gpu-node-004", device="mlx5_1"),
    "InfinibandLinkFlapping": Fault("ib_flap", "gpu-node-004", device="mlx5_2"),
    "InfinibandPhysicalErrors": Fault("ib_flap", "gpu-node-004", device="mlx5_2"),
    "GpuPowerBrake": Fault("power_brake", "gpu-node-002", 5),
    "GpuPowerThrottled": Fault("power_brake", "gpu-node-002", 5),
    "NetworkInterfaceDown": Fault("eth_down", "gpu-node-003", device="eth0"),
    "NetworkInterfaceFlapping": Fault("eth_flap", "gpu-node-004", device="eth0"),
    "TrainingStalled": Fault("stall", "gpu-node-004"),
    "TrainingStraggler": Fault("straggler", "gpu-node-001", 7),
    "NodeDown": Fault("host_lost", "gpu-node-005"),
    # host memory, filesystems (local and shared) and an unplanned reboot, from node_exporter's
    # series; the reboot comes before the GPU faults of its host (it would end them)
    "HostOomKill": Fault("oom_kill", "gpu-node-003"),
    "HostMemoryPressure": Fault("memory_pressure", "gpu-node-003"),
    "HostMemoryExhausted": Fault("memory_pressure", "gpu-node-003"),
    "HostMemoryUncorrectableErrors": Fault("edac_uncorrectable", "gpu-node-003"),
    "HostMemoryCorrectableErrors": Fault("edac_correctable", "gpu-node-003"),
    "FilesystemReadOnly": Fault("fs_readonly", "gpu-node-002", device="/scratch"),
    "SharedFilesystemReadOnly": Fault("fs_readonly", "gpu-node-002", device="/checkpoints"),
    "FilesystemFull": Fault("fs_full", "gpu-node-004", device="/scratch"),
    "SharedFilesystemFull": Fault("fs_full", "gpu-node-004", device="/checkpoints"),
    "FilesystemNotResponding": Fault("fs_not_answering", "gpu-node-003", device="/scratch"),
    "SharedFilesystemNotResponding": Fault("fs_not_answering", "gpu-node-003",
                                           device="/checkpoints"),
    "NodeRebooted": Fault("reboot", "gpu-node-001"),
}
# Host alerts (catalog/host_alerts.py) the simulator cannot cause: it serves no
# smartctl_exporter or ipmi_exporter, no NVSwitch or Fabric Manager fields, no scheduler node
# state (the exporter's), and a repeat offender needs three fault episodes. Their rules run
# under promtool on upstream fixtures (tests/test_host_faults_upstream.py); their panels read
# only fault records, so they are empty here.
NOT_SIMULATED = {"LocalDiskFailing", "NodeMaintenance", "NvswitchFatalError",
                 "FabricManagerNotReady", "HostPowerSupplyFault", "HostChassisSensorCritical",
                 "GpuRepeatOffender"}
# An exporter down on a live host: every simulated host here carries GPU faults this test reads
# from its dcgm-exporter, so the gap is checked under promtool only (tests/rules, node_alerts).
PROMTOOL_ONLY = {"HostTelemetryGap"}
HOST_ALERTS = set(host_alerts.definitions(lambda **kw: kw["name"]))
EMPTY_PANELS = {catalog.panel(key).id for key in ("local_disks", "fabric", "power_chassis")}
# Alerts whose condition only shows after minutes (a `for`, a 5-minute rate) are still checked
# for their panel, but need not have reached ALERTS within this test's bounded time.
MUST_REACH_ALERTS = ("GpuXidError", "GpuContainedEccError", "GpuUncontainedEccError",
                     "GpuXidApplicationError", "GpuDoubleBitEccErrors", "GpuThermalViolation",
                     "GpuNvlinkFailure", "InfinibandLinkFlapping", "InfinibandLinkDown",
                     "GpuPcieReplayRate", "TrainingStalled", "GpuPowerBrake",
                     "NetworkInterfaceDown", "NetworkInterfaceFlapping", "TrainingStraggler",
                     "GpuRowRemapFailure", "HostOomKill", "HostMemoryUncorrectableErrors",
                     "HostMemoryCorrectableErrors", "FilesystemReadOnly",
                     "SharedFilesystemReadOnly", "NodeRebooted")


def boards() -> dict[str, dict]:
    return {b.key: json.loads((generate.OUT_DIR / f"{b.uid}.json").read_text())
            for b in catalog.DASHBOARDS.values()}


def panel_targets(board: dict) -> dict[int, list[str]]:
    out = {}
    for panel in board["panels"]:
        if panel["type"] != "row":
            out[panel["id"]] = [t["expr"] for t in panel["targets"]]
    return out


def substitute(expr: str, values: dict[str, list[str] | str]) -> str:
    """Expand Grafana variables the way Grafana does for Prometheus (multi -> regex alternation)."""
    fixed = {"__rate_interval": RATE_INTERVAL, "__range": "10m", "__interval": "15s"}

    def repl(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name in fixed:
            return fixed[name]
        value = values[name]
        if isinstance(value, list):
            return "(" + "|".join(PROM_REGEX_META.sub(r"\\\\\1", v) for v in value) + ")"
        return value

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", repl, expr)


def variable_expr(query: str) -> tuple[str, str | None]:
    """A variable query as PromQL plus the label whose values it lists."""
    match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query, flags=re.S)
    if match:
        return f"group by ({match.group(2)}) ({match.group(1)})", match.group(2)
    match = re.fullmatch(r"query_result\((.*)\)", query, flags=re.S)
    assert match, query
    return match.group(1), None


def variable_values(url: str, board: dict, name: str, values: dict) -> list[str]:
    """Run one variable's query and apply its regex, as Grafana would."""
    var = next(v for v in board["templating"]["list"] if v["name"] == name)
    expr, label = variable_expr(substitute(var["query"], values))
    result = prom_query(url, expr)
    if label:
        return sorted({r["metric"][label] for r in result})
    pattern = re.compile(var["regex"].strip("/"))
    text = [("{" + ",".join(f'{k}="{v}"' for k, v in sorted(r["metric"].items())) + "}")
            for r in result]
    return sorted({m.group(1) for t in text for m in [pattern.search(t)] if m})


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[Cluster, str]]:
    assert RULE_FILES, "alert_rules/ has no rule files: run make generate"
    cluster = Cluster(hosts=6, flavour="Hostname",
                      host_flavours={"gpu-node-002": "hostname", "gpu-node-003": "4.9"})
    cluster.assign_run(RUN["wandb_entity"], RUN["wandb_project"], RUN["wandb_run_id"], RUN_HOSTS)
    cluster.assign_run("team", "llm", "run-2", [SPARE], gpus=[0, 1, 2, 3])
    cluster.assign_run("team", "llm", "run-3", [SPARE], gpus=[])
    workdir = tmp_path_factory.mktemp("dash-prom")
    with serve(cluster) as sim:
        rules = []
        for path in RULE_FILES:
            # the slower tiers (3, 4 and 8 minutes) evaluate every 3, 4 and 8 s, next to the 1 s
            # tier
            rules.append(workdir / path.name)
            rules[-1].write_text(scale_rules(path.read_text(), 1.0, interval_scale=1 / 60))
        config = prometheus_config(sim.address, cluster.hosts, interval="1s",
                                   rule_files=[str(p) for p in rules], runs_job="runs")
        with prometheus(config, workdir) as prom:
            _wait(prom.url, "count(up == 1) == 13")
            _wait(prom.url, "count(gpu:dcgm_gpu:present) == 48")
            # NodeDown (and its panel) name a lost host only through the target map, recorded in
            # its own slow group: a host lost before its first evaluation is never mapped.
            _wait(prom.url, f"count({series.TARGET_HOSTS}) == {2 * len(cluster.hosts)}")
            faults = {(f.kind, f.host, f.gpu, f.code, f.device) for f in FAULTS.values()}
            for fault in sorted(faults, key=lambda f: f[0] != "reboot"):
                cluster.inject(*fault)
            yield cluster, prom.url


def _wait(url: str, expr: str) -> list[dict]:
    """The first non-empty answer to ``expr`` (rules and rates need a few evaluations)."""
    return wait_for(lambda: prom_query(url, expr), DEADLINE_S, f"data for {expr}", 0.5)


def run_values(hosts: list[str], gpus: list[str]) -> dict:
    return {**RUN, "datasource": "prometheus", "hostname": hosts, "gpu": gpus}


@pytest.mark.integration
def test_variables_follow_the_join_metrics(stack):
    _cluster, url = stack
    run_board, node_board = boards()["run"], boards()["node"]
    values = run_values([], [])
    for name in ("wandb_entity", "wandb_project", "wandb_run_id"):
        assert RUN[name] in variable_values(url, run_board, name, values)
    hosts = variable_values(url, run_board, "hostname", values)
    assert hosts == RUN_HOSTS
    _wait(url, 'gpu:dcgm_gpu:present{hostname="gpu-node-006"}')
    values["hostname"] = hosts
    gpus = variable_values(url, run_board, "gpu", values)
    assert gpus == [str(i) for i in range(8)]
    # a run whose GPUs are known offers only those; one without GPU info offers its hosts' GPUs
    run2 = {**values, "wandb_run_id": "run-2", "hostname": [SPARE]}
    assert variable_values(url, run_board, "gpu", run2) == ["0", "1", "2", "3"]
    run3 = {**values, "wandb_run_id": "run-3", "hostname": [SPARE]}
    assert variable_values(url, run_board, "gpu", run3) == [str(i) for i in range(8)]
    node_hosts = variable_values(url, node_board, "hostname", {"datasource": "prometheus"})
    assert {"gpu-node-001", "gpu-node-004", SPARE} <= set(node_hosts)
    node_gpus = variable_values(url, node_board, "gpu", {"hostname": ["gpu-node-003"]})
    assert {str(i) for i in range(7)} <= set(node_gpus)


@pytest.mark.integration
@pytest.mark.parametrize("key", ["run", "node"])
def test_every_panel_query_runs_and_returns_data(stack, key):
    _cluster, url = stack
    board = boards()[key]
    values = run_values(RUN_HOSTS, [str(i) for i in range(8)])
    # every query must evaluate at once; data may take a few rule evaluations (rates, alerts).
    # The panels the simulator feeds nothing are evaluated once, not waited for.
    pending = panel_targets(board)
    for panel_id in EMPTY_PANELS & set(pending):
        for expr in pending.pop(panel_id):
            prom_query(url, substitute(expr, values))
    deadline = time.monotonic() + DEADLINE_S
    while pending:
        for panel_id, exprs in list(pending.items()):
            if any([prom_query(url, substitute(e, values)) for e in exprs]):
                del pending[panel_id]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not pending, f"panels without data: {sorted(pending)}"
    for annotation in board["annotations"]["list"]:
        assert prom_query(url, substitute(annotation["expr"], values))


@pytest.mark.integration
@pytest.mark.parametrize("alertname", sorted(FAULTS))
def test_linked_panel_shows_the_fault(stack, alertname):
    _cluster, url = stack
    assert alertname in ALERTS, f"{alertname} is not in the alert catalog"
    fault = FAULTS[alertname]
    panel = catalog.panel(ALERTS[alertname].panel)
    gpu = [str(fault.gpu)] if fault.gpu is not None else [str(i) for i in range(8)]
    values = run_values([fault.host], gpu)
    exprs = panel_targets(boards()["run"])[panel.id]
    deadline = time.monotonic() + DEADLINE_S
    while True:
        found = [r for e in exprs for r in prom_query(url, substitute(e, values))]
        matching = [r for r in found if r["metric"].get("hostname", fault.host) == fault.host
                    and (fault.gpu is None or panel.key == "gpu_count"
                         or r["metric"].get("gpu", str(fault.gpu)) == str(fault.gpu))]
        if fault.kind == "xid" and panel.key == "xid_errors":
            matching = [r for r in matching if r["metric"].get("xid") == str(fault.code)]
        if matching or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert matching, f"{alertname}: panel {panel.key} shows nothing for {fault}"
    if alertname in MUST_REACH_ALERTS:
        alerts_expr = panel_targets(boards()["run"])[catalog.panel("alerts").id][0]

        def in_alerts_panel() -> bool:
            rows = prom_query(url, substitute(alerts_expr, values))
            return (alertname, fault.host) in {
                (r["metric"]["alertname"], r["metric"].get("hostname")) for r in rows}

        wait_for(in_alerts_panel, DEADLINE_S, f"{alertname} in the run's alerts panel", 0.5)


def test_every_catalog_alert_is_exercised():
    """Pipeline alerts watch the exporter and bridge themselves: their dashboard is checked
    against the real services in tests/test_e2e.py."""
    pipeline = {name for name, a in ALERTS.items() if a.scope == "pipeline"}
    missing = set(ALERTS) - set(FAULTS) - pipeline - NOT_SIMULATED - PROMTOOL_ONLY
    assert not missing, f"add a simulated fault for {sorted(missing)}"
    assert HOST_ALERTS - set(FAULTS) >= NOT_SIMULATED
