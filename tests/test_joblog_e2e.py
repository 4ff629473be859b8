"""End to end: the job's own log joined with what real Prometheus and Alertmanager saw (the
demo's stack: exporter, rules, Alertmanager, bridge, W&B stand-in serving ``logLines``): in the
live bridge, which reads an ended run's W&B console log and writes the joined statement into the
run's notes and summary, and through ``explain ENTITY/PROJECT/RUN_ID --prometheus URL --log FILE
--json``.

Three runs: the XID 94 cascade (the log names the failing rank on the alert's GPU, the others'
timeouts are consequences), a run with no alert whose log shows a CUDA out-of-memory error
(application), and a run whose log shows an uncorrectable ECC error that telemetry never saw
(infrastructure, from the log). The console lines use the formats PyTorch and NCCL print
(``tests/data/joblog/signatures.json`` has real ones with their sources); ranks, hosts and
times are the scenario's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from demo import scenarios
from demo.stack import Stack, StackConfig
from harness.processes import wait_for
from harness.wandb_standin import WandbStandin

pytestmark = pytest.mark.e2e
BRIDGE = str(Path(sys.executable).parent / "wandb-infra-bridge")
CASCADE = scenarios.RunRef(scenarios.ENTITY, "llm-pretrain", "cascade64")
OOM = scenarios.RunRef(scenarios.ENTITY, "llm-pretrain", "oom8")
SILENT = scenarios.RunRef(scenarios.ENTITY, "llm-pretrain", "ecc8")
ECC = "CUDA error: uncorrectable ECC error encountered"


@pytest.fixture(scope="module")
def standin():
    with WandbStandin() as server:
        for run in (CASCADE, OOM, SILENT):
            server.add_run(run.entity, run.project, run.run_id)
        yield server


@pytest.fixture(scope="module")
def stack(standin, tmp_path_factory):
    config = StackConfig(workdir=tmp_path_factory.mktemp("joblog-e2e"), hosts=12,
                         wandb_base_url=standin.url, wandb_api_key=standin.api_key,
                         markers=False, bridge_sections={"joblog": {"wandb": {"enabled": True}}})
    with Stack(config) as running:
        yield running


def _init(rank: int, host: str, gpu: int) -> str:
    return (f"{host}:{4000 + rank}:{4000 + rank} [{gpu}] NCCL INFO comm 0x{rank:08x} rank {rank} "
            f"nranks 64 cudaDev {gpu} nvmlDev {gpu} busId {0x18000 + gpu:x} - Init COMPLETE")


def _notes_with(standin: WandbStandin, run: scenarios.RunRef, text: str) -> str | None:
    notes = standin.run(run.entity, run.project, run.run_id).notes
    return notes if text in notes else None


def _explain(stack: Stack, run: scenarios.RunRef, log: Path) -> dict:
    assert stack.prometheus is not None
    out = subprocess.run([BRIDGE, "explain", run.path, "--prometheus", stack.prometheus.url,
                          "--step", str(stack.config.interval_seconds), "--lookback", "1h",
                          "--log", str(log), "--json"],
                         capture_output=True, text=True, timeout=180, check=False)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["job_log"]


def test_the_cascades_log_names_the_failing_rank_on_the_alerts_gpu(stack, standin, tmp_path):
    hosts = list(stack.cluster.hosts)[:8]
    scenarios.xid94_cascade(stack, hosts, faulty=1)
    faulty = hosts[1]
    ranks = {(h, g): i * 8 + g for i, h in enumerate(hosts) for g in range(8)}
    failing = ranks[(faulty, 3)]
    lines = [_init(r, h, g) for (h, g), r in ranks.items()]
    lines.append(f"[rank{failing}]:[E303 21:44:35.120 ProcessGroupNCCL.cpp:1515] [PG 0 "
                 f"(default_pg) Rank {failing}] Process group watchdog thread terminated with "
                 f"exception: {ECC}")
    lines += [f"[rank{r}]:[E303 21:54:35.120 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog "
              "caught collective operation timeout: WorkNCCL(SeqNum=88123, OpType=ALLREDUCE, "
              "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600073 milliseconds before "
              "timing out." for r in ranks.values() if r != failing]
    # the live bridge: the run crashes, its console log is read from W&B once, and the notes
    # and summary carry the joined statement
    standin.add_console(CASCADE.entity, CASCADE.project, CASCADE.run_id, lines, level="error")
    standin.set_state(CASCADE.entity, CASCADE.project, CASCADE.run_id, "crashed")
    notes = wait_for(lambda: _notes_with(standin, CASCADE, "Job log: infrastructure"), 120,
                     "the job log in the run's notes")
    assert f"rank {failing} ({faulty} GPU 3) on that GPU failed first" in notes
    summary = wait_for(lambda: standin.run(CASCADE.entity, CASCADE.project,
                                           CASCADE.run_id).summary.get("infra/verdict"), 60,
                       "infra/verdict in the summary")
    assert summary == "infrastructure"
    page = scenarios.run_view(stack, CASCADE)["job_log"]
    assert page["first_error"]["rank"] == failing
    log = tmp_path / "cascade64.out"
    log.write_text("\n".join(lines) + "\n")
    job_log = _explain(stack, CASCADE, log)
    assert job_log["verdict"] == "infrastructure"
    assert job_log["first_error"]["rank"] == failing
    assert (job_log["first_error"]["host"], job_log["first_error"]["gpu"]) == (faulty, 3)
    statement = job_log["statement"]
    assert "on 63 rank(s)" in statement and f"consequences of XID 94 on {faulty} GPU 3" \
        in statement
    assert f"rank {failing} ({faulty} GPU 3) on that GPU failed first" in statement


def test_no_alert_and_an_oom_in_the_log_is_the_applications(stack, tmp_path):
    hosts = list(stack.cluster.hosts)[8:10]
    job = scenarios.start_job(stack, OOM, hosts, scenarios.GPUS)
    job.stop(exit_code=1)
    log = tmp_path / "oom8.out"
    log.write_text(_init(12, hosts[1], 4) + "\n[rank12]: torch.OutOfMemoryError: CUDA out of "
                   "memory. Tried to allocate 2.00 GiB. GPU 4 has a total capacity of 79.10 "
                   "GiB of which 1.06 GiB is free.\n")
    job_log = _explain(stack, OOM, log)
    assert job_log["verdict"] == "application"
    assert job_log["app_error"] == f"torch.OutOfMemoryError on rank 12 ({hosts[1]} GPU 4)"


def test_an_ecc_error_telemetry_never_saw_is_infrastructure_from_the_log(stack, tmp_path):
    hosts = list(stack.cluster.hosts)[10:12]
    job = scenarios.start_job(stack, SILENT, hosts, scenarios.GPUS)
    job.stop(exit_code=1)
    log = tmp_path / "ecc8.out"
    log.write_text(_init(5, hosts[0], 5) + f"\n[rank5]: RuntimeError: {ECC}\n")
    job_log = _explain(stack, SILENT, log)
    assert job_log["verdict"] == "infrastructure"
    assert "infrastructure, seen in the job's log" in job_log["statement"]
    assert "telemetry did not see it" in job_log["statement"]
    assert (job_log["first_error"]["host"], job_log["first_error"]["gpu"]) == (hosts[0], 5)
