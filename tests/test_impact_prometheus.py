"""Measured impact on a real Prometheus: the demo simulator's dcgm-exporter and join metrics
through the shipped rules (60 times faster). A thermal fault on four GPUs is a slowdown whose
onset moves to the drop, a stall on every host of a run is a hang, an XID 94 that leaves the
GPUs computing has no visible effect, and the same fault with the run ending at once is a crash
unless W&B says the run finished; ``explain`` gives the same figures after the fact. A run
holding different GPUs on different hosts is read on exactly those. The four runs play at once,
each on its own hosts: the file waits for the slowest, not for their sum."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from demo.simulator.scrape import prometheus_config
from demo.stack import scale_rules
from harness.processes import prom_query, prometheus, wait_for
from harness.simulator_process import RemoteCluster, simulator
from wandb_infra.bridge.diagnosis.impact import CRASH, HANG, NONE, SLOWDOWN, Impact
from wandb_infra.bridge.diagnosis.root_cause import Diagnosis, diagnose
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.prometheus.history import Placement, as_facts, explain
from wandb_infra.bridge.prometheus.impact_reader import (
    RUN_GONE_SECONDS,
    ImpactHistory,
    run_selector,
)
from wandb_infra.catalog import series
from wandb_infra.common.runkey import RunKey

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
RULE_FILES = sorted((ROOT / "alert_rules").glob("*.rules.yml"))
HOSTS = ("gpu-node-001", "gpu-node-002", "gpu-node-003", "gpu-node-004", "gpu-node-005")
GONE = RUN_GONE_SECONDS + 2  # the run's join series gone past the impact reader's grace
BRIDGE = str(Path(sys.executable).parent / "wandb-infra-bridge")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[tuple[RemoteCluster, str]]:
    assert RULE_FILES, "alert_rules/ has no rule files: run make generate"
    workdir = tmp_path_factory.mktemp("impact-prom")
    with simulator(workdir / "sim", len(HOSTS)) as sim:
        cluster, address = sim.cluster, sim.address
        rules = []
        for path in RULE_FILES:
            rules.append(workdir / path.name)
            rules[-1].write_text(scale_rules(path.read_text(), 1 / 60, scrape_seconds=1))
        config = prometheus_config(address, cluster.hosts, interval="1s",
                                   rule_files=[str(p) for p in rules], runs_job="runs")
        with prometheus(config, workdir) as prom:
            expr = f"count({series.GPU_PRESENT}) == {8 * len(HOSTS)}"
            wait_for(lambda: prom_query(prom.url, expr), 120, expr, 0.5)
            yield cluster, prom.url


def _start(cluster: RemoteCluster, url: str, run: RunKey, hosts: tuple[str, ...]) -> float:
    cluster.assign_run(*run, hosts)
    wait_for(lambda: prom_query(url, f'wandb_run_node_info{{wandb_run_id="{run.run_id}"}}'),
             30, f"{run.run_id} published", 0.5)
    time.sleep(8)  # a baseline of the run's own activity
    return time.time()


def _diagnosis(url: str, run: RunKey, since: float, alertname: str,
               hosts: tuple[str, ...] = ()) -> Diagnosis:
    """The run's diagnosis once ``alertname`` fires for it (on every one of ``hosts``: the head
    of an issue raised on several hosts is only settled when all of them fire)."""
    def found() -> Diagnosis | None:
        alerts = explain(PrometheusClient(url), run, since - 60, time.time(),
                         min_step=1.0).alerts
        firing = {a.labels.get("hostname", "") for a in alerts if a.alertname == alertname}
        if not firing or not firing >= set(hosts):
            return None
        return diagnose(as_facts(alerts), timedelta(minutes=10))
    return wait_for(found, 120, f"{alertname} on {run.run_id} in ALERTS", 1.0)


def _head(url: str, run: RunKey, diagnosis: Diagnosis, state: str | None = None) -> Impact:
    impacts = ImpactHistory(PrometheusClient(url)).for_diagnosis(
        run, diagnosis, state)
    assert impacts is not None and diagnosis.root_cause is not None
    return impacts[diagnosis.root_cause.key]


def _show(capsys, impact: Impact) -> None:
    """The measured figures on the terminal (``pytest -s``), for the record."""
    with capsys.disabled():
        print(f"\n  {impact.headline}\n  lost: {impact.cost_text}\n  {impact.onset_reason}")


def _explained(run: RunKey, url: str, diagnosis: Diagnosis) -> tuple[dict, dict]:
    """``explain --json``'s view and its impact of the issue ``diagnosis`` leads with (found
    by root cause: its rebuilt alert starts on explain's own query grid)."""
    out = subprocess.run([BRIDGE, "explain", run.path(), "--prometheus", url, "--lookback", "1h",
                          "--step", "1", "--grace", "30", "--json"], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    head = diagnosis.root_cause
    assert head is not None
    # by alert name, not title or start: when the fault's alerts start on several hosts some
    # seconds apart (a loaded machine), explain's grid may lead with another host's alert than
    # the test's; each run here has one issue per alert name
    (issue,) = [i for i in view["issues"] if i["root_cause"]["alertname"] == head.root.alertname]
    return view, view["impacts"][issue["key"]]


@dataclass(frozen=True)
class Played:
    """What one run's scenario measured: when the fault was injected, the diagnosis once its
    alert fired, the impact read then, and (where the scenario goes on) later readings."""

    injected: float
    diagnosis: Diagnosis
    impact: Impact
    shown: dict | None = None  # explain's impact of the same issue
    final: Impact | None = None  # after the fault cleared and the run ended
    finished: Impact | None = None  # the same, had W&B said the run finished
    ended: float = 0.0
    read_at: float = 0.0  # when ``impact`` was read


def _thermal(cluster: RemoteCluster, url: str) -> Played:
    run = RunKey("team", "proj", "thermal")
    _start(cluster, url, run, (HOSTS[0],))
    injected = time.time()
    for gpu in range(4):
        cluster.inject("thermal", HOSTS[0], gpu=gpu)
    try:
        diagnosis = _diagnosis(url, run, injected, "GpuThermalViolation")
        time.sleep(6)  # the slow level settles after the alert
        impact = _head(url, run, diagnosis)
    finally:
        cluster.clear(HOSTS[0], kind="thermal")
    time.sleep(8)
    cluster.end_run(*run)
    time.sleep(GONE + 8)  # the run's join series gone past the reader's grace
    final = _head(url, run, _diagnosis(url, run, injected, "GpuThermalViolation"))
    return Played(injected, diagnosis, impact, _explained(run, url, diagnosis)[1], final)


def _hang(cluster: RemoteCluster, url: str) -> Played:
    run = RunKey("team", "proj", "hang")
    _start(cluster, url, run, HOSTS[1:3])
    injected = time.time()
    cluster.inject_hosts("stall", HOSTS[1:3])
    try:
        diagnosis = _diagnosis(url, run, injected, "TrainingStalled", HOSTS[1:3])
        impact = _head(url, run, diagnosis)
        read_at = time.time()
        return Played(injected, diagnosis, impact, _explained(run, url, diagnosis)[1],
                      read_at=read_at)
    finally:
        for host in HOSTS[1:3]:
            cluster.clear(host, kind="stall")


def _xid_94(cluster: RemoteCluster, url: str, name: str, host: str, gpu: int
            ) -> tuple[RunKey, float, Diagnosis]:
    """A run on ``host`` whose GPU ``gpu`` gets an XID 94: the run, when, and its diagnosis
    once the alert fired (the caller clears the fault)."""
    run = RunKey("team", "proj", name)
    _start(cluster, url, run, (host,))
    injected = time.time()
    cluster.inject("xid", host, gpu=gpu, code=94)
    return run, injected, _diagnosis(url, run, injected, "GpuContainedEccError")


def _calm(cluster: RemoteCluster, url: str) -> Played:
    try:
        run, injected, diagnosis = _xid_94(cluster, url, "calm", HOSTS[3], 2)
        time.sleep(5)
        impact = _head(url, run, diagnosis)
        return Played(injected, diagnosis, impact, _explained(run, url, diagnosis)[1])
    finally:
        cluster.clear(HOSTS[3], kind="xid")


def _crash(cluster: RemoteCluster, url: str) -> Played:
    """A run that ends while an XID 94 is still on (within the crash window)."""
    try:
        run, injected, diagnosis = _xid_94(cluster, url, "ends", HOSTS[4], 1)
        time.sleep(5)  # the run lives on a little with the fault
        cluster.end_run(*run)
        ended = time.time()
    finally:
        cluster.clear(HOSTS[4], kind="xid")
    time.sleep(GONE)
    return Played(injected, diagnosis, _head(url, run, diagnosis),
                  finished=_head(url, run, diagnosis, state="finished"), ended=ended)


@pytest.fixture(scope="module")
def played(world) -> Iterator[dict[str, Future[Played]]]:
    """The four runs at once, each on hosts no other touches. A scenario's failure is raised
    by the test reading it."""
    cluster, url = world
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="impact") as pool:
        yield {name: pool.submit(play, cluster, url) for name, play in
               (("thermal", _thermal), ("hang", _hang), ("calm", _calm), ("crash", _crash))}


def test_thermal_slowdown_moves_the_onset_and_explain_agrees(played, capsys):
    got = played["thermal"].result()
    impact = got.impact
    assert impact.kind == SLOWDOWN, impact
    _show(capsys, impact)
    assert impact.drop is not None and 0.45 < impact.drop < 0.62  # 0.46 -> 0.21 in the model
    assert f"tensor activity on {HOSTS[0]} GPU" in impact.text
    assert impact.text.split(", ")[1].split(" (")[0].endswith("before the alert")
    assert impact.changed_at is not None and abs(impact.changed_at - got.injected) < 3
    head = got.diagnosis.root_cause
    assert head is not None and impact.changed_at < head.root.starts_at.timestamp()
    assert impact.onset == impact.changed_at and "onset moved from" in impact.onset_reason
    assert impact.gpus == 8
    final, shown = got.final, got.shown
    assert final is not None and shown is not None
    assert final.kind == SLOWDOWN and final.until_what in ("recovery", "the run's end")
    assert 0 < final.gpu_hours < 8 * (time.time() - got.injected) / 3600
    # the same figures, to explain's own query grid (a sample apart at most); explain reads
    # later, so the level after the drop averages a few more samples: the drop agrees within
    # 1.5 points, not to its rounding (once 54% in the notes and 55% in explain)
    assert shown["kind"] == final.kind and shown["onset"] == pytest.approx(final.onset, abs=1.5)
    assert shown["drop"] == pytest.approx(final.drop, abs=0.015)
    assert shown["gpu_hours"] == pytest.approx(final.gpu_hours, abs=0.01)


def test_stall_on_every_host_is_a_hang(played, capsys):
    got = played["hang"].result()
    impact = got.impact
    assert impact.kind == HANG, impact
    _show(capsys, impact)
    assert impact.text.startswith("no GPU of the run has computed since ")
    assert impact.changed_at is not None and abs(impact.changed_at - got.injected) < 3
    assert impact.gpus == 16 and impact.until_what == "now"
    assert impact.gpu_hours == pytest.approx(16 * (got.read_at - impact.onset) / 3600,
                                             abs=0.01)
    shown = got.shown
    assert shown is not None
    assert shown["kind"] == HANG and shown["onset"] == pytest.approx(impact.onset, abs=1.5)
    assert shown["text"].startswith("no GPU of the run has computed since ")


def test_xid_94_on_computing_gpus_has_no_visible_effect(played, capsys):
    impact, shown = played["calm"].result().impact, played["calm"].result().shown
    assert impact.kind == NONE, impact
    _show(capsys, impact)
    assert impact.text.startswith("no change in the run's GPU activity (tensor activity")
    assert impact.gpu_hours == 0.0 and impact.onset_reason == ""
    assert shown is not None and shown["kind"] == NONE and shown["gpu_hours"] == 0.0


def test_a_run_ending_with_the_fault_on_crashed_unless_wandb_says_it_finished(played, capsys):
    got = played["crash"].result()
    crash, finished = got.impact, got.finished
    assert crash.kind == CRASH, crash
    _show(capsys, crash)
    assert crash.text.startswith("the run ended at ") and crash.until_what == "the run's end"
    assert abs(crash.until - got.ended) < 3 and crash.gpu_hours > 0
    assert finished is not None
    assert finished.kind == NONE and finished.gpu_hours == 0.0, finished
    assert finished.until_what == "the run's end"


def test_a_run_with_different_gpus_per_host_reads_only_those(world):
    """GPUs 0-3 of one host and 4-7 of another: 8 series, not the 16 that one union of indices
    over both hosts would take (the other GPUs may belong to another run)."""
    _, url = world
    placement = Placement(frozenset(HOSTS[:2]), {HOSTS[0]: frozenset("0123"),
                                                 HOSTS[1]: frozenset("4567")}, 0.0, 0.0)
    got = PrometheusClient(url).instant(run_selector(series.DCGM_TENSOR_ACTIVE, placement),
                                        time.time())
    pairs = {(s["metric"].get("hostname") or s["metric"].get("Hostname"), s["metric"]["gpu"])
             for s in got}
    assert pairs == {(HOSTS[0], g) for g in "0123"} | {(HOSTS[1], g) for g in "4567"}
