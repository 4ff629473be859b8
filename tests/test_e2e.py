"""End to end: real Prometheus + Alertmanager + exporter + bridge + the W&B stand-in on loopback.

One stack (the same one ``make demo`` runs, from the example configs in deploy/) serves every test
in this module, in order: scenario 1 (XID 94 cascade on 64 hosts x 8 GPUs), scenario 2 (thermal
slowdown with a neighbour run on the same hosts), resolve, and ``explain`` after the fact.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from demo import scenarios
from demo.stack import Stack, StackConfig
from harness.processes import stays_true, wait_for
from harness.wandb_standin import WandbStandin
from wandb_infra.catalog import selfmetrics
from wandb_infra.catalog.panels import PIPELINE

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parent.parent
CASCADE = scenarios.RunRef(scenarios.ENTITY, "llm-pretrain", "cascade64")
THERMAL = scenarios.RunRef(scenarios.ENTITY, "llm-finetune", "thermal2")
NEIGHBOUR = scenarios.RunRef(scenarios.ENTITY, "eval-sweep", "neighbour")
LINK = scenarios.RunRef(scenarios.ENTITY, "llm-pretrain", "ibflap3")
RESET = scenarios.RunRef(scenarios.ENTITY, "llm-pretrain", "reset5")
USER_NOTES = "My own notes: lr 3e-4, <b>keep</b> this *exactly*.\n"


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _dashboard_panels() -> dict[str, set[int]]:
    out = {}
    for path in (ROOT / "dashboards").glob("*.json"):
        dash = json.loads(path.read_text())
        out[dash["uid"]] = {p["id"] for p in dash["panels"]}
    return out


@pytest.fixture(scope="module")
def standin():
    with WandbStandin() as server:
        for run in (CASCADE, THERMAL, NEIGHBOUR, LINK, RESET):
            server.add_run(run.entity, run.project, run.run_id, tags=["baseline"],
                           notes=USER_NOTES)
        yield server


@pytest.fixture(scope="module")
def stack(standin, tmp_path_factory):
    config = StackConfig(workdir=tmp_path_factory.mktemp("e2e"), hosts=68,
                         wandb_base_url=standin.url, wandb_api_key=standin.api_key,
                         markers=True, grafana_url="https://grafana.example")
    with Stack(config) as running:
        yield running


@pytest.fixture(scope="module")
def cascade(stack):
    hosts = list(stack.cluster.hosts)[:64]
    return scenarios.xid94_cascade(stack, hosts)


def test_scenario1_single_root_cause_is_the_xid94_gpu(cascade):
    _, view = cascade
    assert len(view["issues"]) == 1
    issue = view["issues"][0]
    root = issue["root_cause"]
    assert (root["alertname"], root["hostname"], root["gpu"]) == (
        "GpuContainedEccError", "gpu-node-017", "3")
    stalls = [c for c in issue["consequences"] if c["alertname"] == "TrainingStalled"]
    assert {c["hostname"] for c in stalls} == {f"gpu-node-{i:03d}" for i in range(1, 65)}
    assert all(_ts(c["starts_at"]) >= _ts(root["starts_at"]) for c in stalls)


def test_scenario1_projected_onto_the_wandb_run(cascade, stack, standin):
    run, _ = cascade
    def projected():
        rec = standin.run(run.entity, run.project, run.run_id)
        return rec if "infra:GpuContainedEccError" in rec.tags and "TrainingStalled" in rec.notes \
            else None
    rec = wait_for(projected, 60, "tags and notes in the W&B stand-in")
    assert rec.tags[0] == "baseline"
    infra = [t for t in rec.tags if t.startswith("infra:")]
    assert infra[0] == "infra:GpuContainedEccError" and "infra:TrainingStalled" in infra
    assert rec.notes.startswith(USER_NOTES)
    assert "Restart the job from its last checkpoint" in rec.notes
    assert "whole synchronous job fails" in rec.notes
    links = re.findall(r"https://grafana\.example/d/[^\s)\]>\"']+", rec.notes)
    assert links, rec.notes
    panels = _dashboard_panels()
    for link in links:
        url = urlparse(html.unescape(link))
        uid = url.path.split("/")[2]
        assert int(parse_qs(url.query)["viewPanel"][0]) in panels[uid], link
    marker_rows = wait_for(
        lambda: [r for r in standin.run(run.entity, run.project, run.run_id).history
                 if "infra/issue" in r], 90, "infra/issue marker rows from the shared-mode writer")
    assert marker_rows


def test_scenario1_summary_written_once_the_run_crashed(cascade, standin):
    run, _ = cascade
    standin.set_state(run.entity, run.project, run.run_id, "crashed")

    def summary_written():
        rec = standin.run(run.entity, run.project, run.run_id)
        return rec if any(k.startswith("infra/") for k in rec.summary) else None

    rec = wait_for(summary_written, 60, "summary keys after the crash")
    assert "GpuContainedEccError" in json.dumps(rec.summary)


def test_scenario1_xid94_is_safe_to_restart_without_draining(cascade, stack, standin):
    """XID 94 needs only an application restart (NVIDIA's catalog): safe while gpu-node-017
    stays schedulable, no exclusion, and the notes say the node can stay in service."""
    run, _ = cascade
    rem = scenarios.restart_verdict(stack, run, "safe")
    assert rem["detail"] == ("XID 94 needs only an application restart: the node can stay in "
                             "service")
    assert rem["exclusion"] == "" and rem["needs"] == "only an application restart"
    assert [h["state"] for h in rem["hosts"]] != []
    assert not rem["hosts"][0]["state"].endswith("+DRAIN")
    wait_for(lambda: "**safe**: XID 94 needs only an application restart" in standin.run(
        run.entity, run.project, run.run_id).notes.replace("\\", ""), 60,
        "the safe verdict in the W&B notes")


def test_scenario5_gpu_reset_turns_the_verdict_safe(stack, standin):
    """XID 95 needs a GPU reset: unsafe with the exact exclusion while the driver's recovery
    action (DCGM field 1523, through the real rules) asks for it; safe once the GPU is reset,
    the node never drained; the W&B notes follow."""
    host = list(stack.cluster.hosts)[67]
    run, before, after = scenarios.gpu_reset(stack, host)
    assert before["exclusion"] == f"sbatch --exclude={host}"
    assert before["advice"].startswith(f"Reset GPU 5 of {host} (nvidia-smi -r -i 5)")
    assert f"GPU 5 of {host} was reset at" in after["detail"] and after["exclusion"] == ""
    assert not after["hosts"][0]["state"].endswith("+DRAIN")
    wait_for(lambda: f"GPU 5 of {host} was reset" in standin.run(
        run.entity, run.project, run.run_id).notes.replace("\\", ""), 90,
        "the reset in the W&B notes")


def test_scenario2_thermal_issue_starts_inside_the_mfu_drop(stack, standin):
    hosts = list(stack.cluster.hosts)[64:66]
    _, view, job, neighbour = scenarios.thermal_slowdown(stack, hosts)
    window = job.drop_window()
    assert window is not None, job.samples
    thermal = [i for i in view["issues"] if i["root_cause"]["category"] == "gpu_thermal"]
    assert thermal, view
    started = _ts(thermal[0]["started_at"])
    assert window[0] - stack.config.interval_seconds <= started <= window[1] + job.period, (
        window, thermal[0]["started_at"])
    # its effect measured on the run's own GPUs, and what it cost
    measured = (view.get("impacts") or {}).get(thermal[0]["key"])
    assert measured is not None and measured["kind"] == "slowdown", view.get("impacts")
    assert "tensor activity on " in measured["text"]
    assert measured["gpus"] == len(scenarios.HALF_A) * len(hosts)
    assert isinstance(view["gpu_hours_lost"], float) and view["gpu_hours_lost"] >= 0
    assert scenarios.run_view(stack, neighbour)["issues"] == []
    tag = f"infra:{thermal[0]['root_cause']['alertname']}"
    wait_for(lambda: tag in standin.run(THERMAL.entity, THERMAL.project, THERMAL.run_id).tags,
             60, f"{tag} on the thermal run in the W&B stand-in")
    # the bridge flushes every second: a tag for the neighbour would come with the thermal
    # run's or within the next three flushes
    stays_true(lambda: not [t for t in standin.run(neighbour.entity, neighbour.project,
                                                   neighbour.run_id).tags
                            if t.startswith("infra:")], 3, "the neighbour run without infra tags")


def test_resolving_the_fault_closes_the_issue(stack):
    host = list(stack.cluster.hosts)[66]  # a host no other scenario touches
    job = scenarios.start_job(stack, LINK, [host], scenarios.GPUS)
    try:
        stack.cluster.inject("ib_down", host, device="mlx5_1")
        opened = wait_for(lambda: [i for i in scenarios.run_view(stack, LINK)["issues"]
                                   if i["root_cause"]["alertname"] == "InfinibandLinkDown"],
                          90, "InfinibandLinkDown issue")
        assert opened[0]["open"]
        stack.cluster.clear(host, kind="ib_down")
        closed = wait_for(lambda: [i for i in scenarios.run_view(stack, LINK)["issues"]
                                   if i["root_cause"]["alertname"] == "InfinibandLinkDown"
                                   and not i["open"]], 90, "the issue to close")
        assert closed[0]["ended_at"]
    finally:
        job.stop()


def test_explain_after_the_fact_reaches_the_same_root_cause(cascade, stack):
    run, live = cascade
    assert stack.prometheus is not None
    out = subprocess.run(
        [str(Path(sys.executable).parent / "wandb-infra-bridge"), "explain", run.path,
         "--prometheus", stack.prometheus.url, "--step", str(stack.config.interval_seconds),
         "--lookback", "1h", "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    assert len(view["placement"]["hosts"]) == 64
    roots = [(i["root_cause"]["alertname"], i["root_cause"]["hostname"], i["root_cause"]["gpu"])
             for i in view["issues"]]
    live_root = live["issues"][0]["root_cause"]
    assert roots[0] == (live_root["alertname"], live_root["hostname"], live_root["gpu"])
    # one story: explain renders the same run view as the page, so the headline is the page's
    assert view["headline"]["title"] == live["headline"]["title"]
    stalled = {c["hostname"] for c in view["issues"][0]["consequences"]
               if c["alertname"] == "TrainingStalled"}
    assert len(stalled) == 64


def test_pipeline_dashboard_reads_the_real_exporter_and_bridge(cascade, stack):
    """Every query of the pipeline dashboard returns data from the stack's own exporter and
    bridge, and every self-metric name the pipeline alerts read is served by them."""
    _run, _view = cascade
    board = json.loads((ROOT / "dashboards" / f"{PIPELINE.uid}.json").read_text())
    exprs = [t["expr"].replace("$__range", "10m") for p in board["panels"] if p["type"] != "row"
             for t in p["targets"]]
    for name in (*selfmetrics.EXPORTER_METRICS, *selfmetrics.BRIDGE_METRICS):
        wait_for(lambda name=name: stack.query(name), 30, f"{name} scraped")
    for expr in exprs:
        assert wait_for(lambda expr=expr: stack.query(expr), 30, expr)
    up = stack.query(f"max by (job) (up and on (instance, job) "
                     f"({selfmetrics.EXPORTER_HOSTS} or {selfmetrics.BRIDGE_QUEUE_RUNS}))")
    assert {r["metric"]["job"] for r in up} == {"wandb-infra-exporter", "wandb-infra-bridge"}
    firing = stack.query('ALERTS{category="pipeline",alertstate="firing"}')
    assert firing == [], firing
