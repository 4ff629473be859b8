"""End to end: real Prometheus + Alertmanager + exporter + bridge + the W&B stand-in on loopback.

One stack (the same one ``make demo`` runs, from the example configs in deploy/) serves every test
in this module. Its scenarios play at once, each on its own hosts, as jobs share a real cluster:
scenario 1 (XID 94 cascade on 64 hosts x 8 GPUs, with the job's console log in W&B), scenario 2
(thermal slowdown with a neighbour run on the same hosts), scenario 5 (XID 95 and a GPU reset), a
link fault that resolves, and two runs that end with only their job log to tell (an
out-of-memory error; an ECC error telemetry never saw). The tests then read what each produced,
and ``explain`` after the fact.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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
OOM = scenarios.RunRef(scenarios.ENTITY, "llm-pretrain", "oom8")
SILENT = scenarios.RunRef(scenarios.ENTITY, "llm-pretrain", "ecc8")
USER_NOTES = "My own notes: lr 3e-4, <b>keep</b> this *exactly*.\n"
BRIDGE = str(Path(sys.executable).parent / "wandb-infra-bridge")
ECC = "CUDA error: uncorrectable ECC error encountered"
# The cascade's hosts, its faulty host (the scenario's default: index 16) and each rank's place:
# the console log the job streamed to W&B names its ranks by host and GPU.
CASCADE_HOSTS = [f"gpu-node-{i:03d}" for i in range(1, 65)]
FAULTY = CASCADE_HOSTS[16]
RANKS = {(h, g): i * 8 + g for i, h in enumerate(CASCADE_HOSTS) for g in range(8)}
FAILING = RANKS[(FAULTY, 3)]


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _dashboard_panels() -> dict[str, set[int]]:
    out = {}
    for path in (ROOT / "dashboards").glob("*.json"):
        dash = json.loads(path.read_text())
        out[dash["uid"]] = {p["id"] for p in dash["panels"]}
    return out


def _init(rank: int, host: str, gpu: int) -> str:
    """NCCL's init line: where a rank runs."""
    return (f"{host}:{4000 + rank}:{4000 + rank} [{gpu}] NCCL INFO comm 0x{rank:08x} rank {rank} "
            f"nranks {len(RANKS)} cudaDev {gpu} nvmlDev {gpu} busId {0x18000 + gpu:x} - Init "
            "COMPLETE")


def _cascade_log() -> list[str]:
    """The cascade job's console: every rank's init, the failing rank's ECC error, then every
    other rank's watchdog timeout."""
    lines = [_init(r, h, g) for (h, g), r in RANKS.items()]
    lines.append(f"[rank{FAILING}]:[E303 21:44:35.120 ProcessGroupNCCL.cpp:1515] [PG 0 "
                 f"(default_pg) Rank {FAILING}] Process group watchdog thread terminated with "
                 f"exception: {ECC}")
    lines += [f"[rank{r}]:[E303 21:54:35.120 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog "
              "caught collective operation timeout: WorkNCCL(SeqNum=88123, OpType=ALLREDUCE, "
              "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600073 milliseconds before "
              "timing out." for r in RANKS.values() if r != FAILING]
    return lines


@pytest.fixture(scope="module")
def standin():
    with WandbStandin() as server:
        for run in (CASCADE, THERMAL, NEIGHBOUR, LINK, RESET, OOM, SILENT):
            server.add_run(run.entity, run.project, run.run_id, tags=["baseline"],
                           notes=USER_NOTES)
        # read by the bridge once the run has ended
        server.add_console(CASCADE.entity, CASCADE.project, CASCADE.run_id, _cascade_log(),
                           level="error")
        yield server


@pytest.fixture(scope="module")
def stack(standin, tmp_path_factory):
    config = StackConfig(workdir=tmp_path_factory.mktemp("e2e"), hosts=72,
                         wandb_base_url=standin.url, wandb_api_key=standin.api_key,
                         markers=True, grafana_url="https://grafana.example",
                         bridge_sections={"joblog": {"wandb": {"enabled": True}}})
    with Stack(config) as running:
        assert list(running.cluster.hosts)[:64] == CASCADE_HOSTS
        yield running


def _link_resolves(stack: Stack, host: str) -> tuple[list[dict], list[dict]]:
    """An InfiniBand link goes down under a run and comes back: the issue opens, then closes."""
    job = scenarios.start_job(stack, LINK, [host], scenarios.GPUS)
    try:
        stack.cluster.inject("ib_down", host, device="mlx5_1")
        opened = wait_for(lambda: [i for i in scenarios.run_view(stack, LINK)["issues"]
                                   if i["root_cause"]["alertname"] == "InfinibandLinkDown"],
                          180, "InfinibandLinkDown issue")
        stack.cluster.clear(host, kind="ib_down")
        closed = wait_for(lambda: [i for i in scenarios.run_view(stack, LINK)["issues"]
                                   if i["root_cause"]["alertname"] == "InfinibandLinkDown"
                                   and not i["open"]], 180, "the issue to close")
    finally:
        job.stop()
    return opened, closed


def _ends_without_alert(stack: Stack, run: scenarios.RunRef, hosts: list[str]) -> list[str]:
    """A job that runs and fails with no fault in telemetry."""
    scenarios.start_job(stack, run, hosts, scenarios.GPUS).stop(exit_code=1)
    return hosts


@pytest.fixture(scope="module")
def played(stack) -> Iterator[dict[str, Future]]:
    """Every scenario at once, each on hosts no other touches: the module waits for the slowest
    scenario, not for their sum. A scenario's failure is raised by the test reading it."""
    hosts = list(stack.cluster.hosts)
    with ThreadPoolExecutor(max_workers=6, thread_name_prefix="scenario") as pool:
        yield {
            "cascade": pool.submit(scenarios.xid94_cascade, stack, CASCADE_HOSTS),
            "thermal": pool.submit(scenarios.thermal_slowdown, stack, hosts[64:66]),
            "link": pool.submit(_link_resolves, stack, hosts[66]),
            "reset": pool.submit(scenarios.gpu_reset, stack, hosts[67]),
            "oom": pool.submit(_ends_without_alert, stack, OOM, hosts[68:70]),
            "silent": pool.submit(_ends_without_alert, stack, SILENT, hosts[70:72]),
        }


@pytest.fixture(scope="module")
def cascade(played):
    return played["cascade"].result()


def _explain(stack: Stack, run: scenarios.RunRef, *more: str) -> dict:
    """``explain --json`` of a run after the fact, through the stack's Prometheus."""
    assert stack.prometheus is not None
    out = subprocess.run([BRIDGE, "explain", run.path, "--prometheus", stack.prometheus.url,
                          "--step", str(stack.config.interval_seconds), "--lookback", "1h",
                          "--json", *more], capture_output=True, text=True, timeout=180,
                         check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


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


def test_scenario1_summary_and_job_log_written_once_the_run_crashed(cascade, stack, standin):
    """Once the run crashed, the bridge reads its console log from W&B once: the notes and the
    summary say the failing rank ran on the alert's GPU, and the page shows the same reading."""
    run, _ = cascade
    standin.set_state(run.entity, run.project, run.run_id, "crashed")

    def summary_written():
        rec = standin.run(run.entity, run.project, run.run_id)
        return rec if rec.summary.get("infra/verdict") else None

    rec = wait_for(summary_written, 120, "the verdict in the summary after the crash")
    assert "GpuContainedEccError" in json.dumps(rec.summary)
    assert rec.summary["infra/verdict"] == "infrastructure"

    def job_log_in_notes() -> str | None:
        notes = standin.run(run.entity, run.project, run.run_id).notes
        return notes if "Job log: infrastructure" in notes else None

    notes = wait_for(job_log_in_notes, 60, "the job log in the run's notes")
    assert f"rank {FAILING} ({FAULTY} GPU 3) on that GPU failed first" in notes
    page = scenarios.run_view(stack, run)["job_log"]
    assert page["first_error"]["rank"] == FAILING


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


def test_scenario5_gpu_reset_turns_the_verdict_safe(played, stack, standin):
    """XID 95 needs a GPU reset: unsafe with the exact exclusion while the driver's recovery
    action (DCGM field 1523, through the real rules) asks for it; safe once the GPU is reset,
    the node never drained; the W&B notes follow."""
    host = list(stack.cluster.hosts)[67]
    run, before, after = played["reset"].result()
    assert before["exclusion"] == f"sbatch --exclude={host}"
    assert before["advice"].startswith(f"Reset GPU 5 of {host} (nvidia-smi -r -i 5)")
    assert f"GPU 5 of {host} was reset at" in after["detail"] and after["exclusion"] == ""
    assert not after["hosts"][0]["state"].endswith("+DRAIN")
    wait_for(lambda: f"GPU 5 of {host} was reset" in standin.run(
        run.entity, run.project, run.run_id).notes.replace("\\", ""), 90,
        "the reset in the W&B notes")


def test_scenario2_thermal_issue_starts_inside_the_mfu_drop(played, stack, standin):
    hosts = list(stack.cluster.hosts)[64:66]
    _, view, job, neighbour = played["thermal"].result()
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


def test_resolving_the_fault_closes_the_issue(played):
    opened, closed = played["link"].result()
    assert opened[0]["open"]
    assert closed[0]["ended_at"]


def test_explain_after_the_fact_reaches_the_same_root_cause(cascade, stack, tmp_path):
    run, live = cascade
    log = tmp_path / "cascade64.out"
    log.write_text("\n".join(_cascade_log()) + "\n")
    view = _explain(stack, run, "--log", str(log))
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
    # the job log read from a file joins the same telemetry
    job_log = view["job_log"]
    assert job_log["verdict"] == "infrastructure"
    assert job_log["first_error"]["rank"] == FAILING
    assert (job_log["first_error"]["host"], job_log["first_error"]["gpu"]) == (FAULTY, 3)
    statement = job_log["statement"]
    assert f"on {len(RANKS) - 1} rank(s)" in statement
    assert f"consequences of XID 94 on {FAULTY} GPU 3" in statement
    assert f"rank {FAILING} ({FAULTY} GPU 3) on that GPU failed first" in statement


def test_no_alert_and_an_oom_in_the_log_is_the_applications(played, stack, tmp_path):
    hosts = played["oom"].result()
    log = tmp_path / "oom8.out"
    log.write_text(_init(12, hosts[1], 4) + "\n[rank12]: torch.OutOfMemoryError: CUDA out of "
                   "memory. Tried to allocate 2.00 GiB. GPU 4 has a total capacity of 79.10 "
                   "GiB of which 1.06 GiB is free.\n")
    job_log = _explain(stack, OOM, "--log", str(log))["job_log"]
    assert job_log["verdict"] == "application"
    assert job_log["app_error"] == f"torch.OutOfMemoryError on rank 12 ({hosts[1]} GPU 4)"


def test_an_ecc_error_telemetry_never_saw_is_infrastructure_from_the_log(played, stack,
                                                                          tmp_path):
    hosts = played["silent"].result()
    log = tmp_path / "ecc8.out"
    log.write_text(_init(5, hosts[0], 5) + f"\n[rank5]: RuntimeError: {ECC}\n")
    job_log = _explain(stack, SILENT, "--log", str(log))["job_log"]
    assert job_log["verdict"] == "infrastructure"
    assert "infrastructure, seen in the job's log" in job_log["statement"]
    assert "telemetry did not see it" in job_log["statement"]
    assert (job_log["first_error"]["host"], job_log["first_error"]["gpu"]) == (hosts[0], 5)


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
