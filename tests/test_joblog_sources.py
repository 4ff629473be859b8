"""The console-log sources against the stand-ins of the real services: W&B's GraphQL
``logLines`` (the wandb SDK's own query) and the Kubernetes API's ``pods/{pod}/log``."""

from __future__ import annotations

import requests

from harness.k8s_standin import K8sStandin
from harness.wandb_standin import WandbStandin
from wandb_infra.bridge.joblog.join import join
from wandb_infra.bridge.joblog.reading import Budget, Verdict
from wandb_infra.bridge.joblog.sources import (
    FileSource,
    KubernetesLogs,
    Pod,
    RunLogs,
    Settings,
    WandbConsole,
    for_run,
    read,
)
from wandb_infra.common.kubeapi import CONNECTION_SECTION, KubeApi

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 4; 79.10 "
       "GiB total capacity)")
ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"


def test_wandb_console_lines_are_read_per_writer_with_their_timestamps():
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "r1")
        wb.add_console("team", "proj", "r1", ["step 10 loss 2.1", OOM], label="node-003",
                       level="error", start=1_700_000_000)
        wb.add_console("team", "proj", "r1", ["step 10 loss 2.1"], label="node-001",
                       start=1_700_000_005)
        reading = read([WandbConsole(wb.url, wb.api_key, "team", "proj", "r1")])
        sent = wb.calls("RunConsoleLogTail")[0]
    assert sent.variables == {"entity": "team", "project": "proj", "runName": "r1",
                              "last": 10_000}
    first = reading.first_error
    assert reading.verdict is Verdict.APPLICATION and first is not None
    assert (first.host, first.gpu, first.line, first.epoch) == ("node-003", 4, 2,
                                                                 1_700_000_001.0)
    assert [s.name.rsplit(" ", 1)[-1] for s in reading.sources] == ["[node-001]", "[node-003]"]


def test_the_wandb_tail_is_the_last_lines_in_order():
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "r1")
        wb.add_console("team", "proj", "r1", [ECC] + [f"step {i}" for i in range(30)])
        tail = read([WandbConsole(wb.url, wb.api_key, "team", "proj", "r1", last=10)],
                    Budget(max_bytes=None, max_lines=None))
        whole = read([WandbConsole(wb.url, wb.api_key, "team", "proj", "r1", last=100)])
    assert tail.first_error is None and tail.sources[0].lines == 10
    assert whole.first_error is not None and whole.first_error.line == 1


def test_a_failing_wandb_is_named_and_the_other_logs_stand(tmp_path):
    log = tmp_path / "slurm-77.out"
    log.write_text(ECC + "\n")
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "r1")
        wb.fail(403, times=None)
        reading = read([WandbConsole(wb.url, wb.api_key, "team", "proj", "r1"),
                        FileSource(str(log))])
        unknown = read([WandbConsole(wb.url, wb.api_key, "team", "proj", "nope")])
    assert reading.sources[0].error == "no console log: W&B returned 403"
    assert reading.verdict is Verdict.INFRASTRUCTURE
    assert "no console log" in unknown.sources[0].error


def _api(k8s: K8sStandin) -> KubeApi:
    cfg = CONNECTION_SECTION.resolve({"api_server": k8s.url, "token": k8s.token}, "test")
    return KubeApi(cfg, "test")


def test_kubernetes_pod_logs_are_read_with_the_previous_container():
    with K8sStandin() as k8s:
        k8s.set_log("ml", "trainer-0", b"step 1\n")
        k8s.set_log("ml", "trainer-1", b"step 1\n" + ECC.encode() + b"\n", previous=True)
        k8s.set_log("ml", "trainer-1", b"restarted\n")
        source = KubernetesLogs(_api(k8s), (Pod("ml", "trainer-0", "gpu-node-016"),
                                            Pod("ml", "trainer-1", "gpu-node-017")))
        reading = read([source], Budget(max_bytes=65536, max_lines=1000))
    first = reading.first_error
    assert first is not None and first.host == "gpu-node-017"
    assert first.source == "ml/trainer-1 (previous)"
    assert len(reading.sources) == 3  # trainer-0 never restarted: one log


def test_a_forbidden_pod_log_is_named():
    with K8sStandin() as k8s:
        k8s.set_log("ml", "trainer-0", ECC.encode())
        k8s.logs_forbidden = True
        reading = read([KubernetesLogs(_api(k8s), (Pod("ml", "trainer-0"),))])
    assert reading.sources[0].error == ("no console log: Kubernetes API answered HTTP 403 for "
                                        "pods/trainer-0/log")


def test_the_config_section_gives_typed_settings():
    settings = Settings.from_config({"max_bytes": 65536, "slurm": {"output": "/l/%j-%N.out"},
                                     "kubernetes": {"enabled": True, "in_cluster": True}})
    assert settings.budget == Budget(65536, 200_000)
    assert settings.slurm_templates == ("/l/%j-%N.out",)
    assert settings.kubernetes is not None and settings.kubernetes["in_cluster"] is True


def test_a_runs_sources_are_the_configured_ones_it_can_use(tmp_path):
    (tmp_path / "77-gpu-node-017.out").write_text(ECC + "\n")
    settings = Settings.from_config({"wandb": {"enabled": True},
                                     "slurm": {"output": str(tmp_path / "%j-%N.out")}})
    run = RunLogs("team", "proj", "r1", slurm_job_id="77", nodes=("gpu-node-017",))
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "r1")
        wb.add_console("team", "proj", "r1", ["step 1"])
        sources = for_run(settings, run, wandb_base_url=wb.url, wandb_api_key=wb.api_key)
        reading = read(sources)
    assert [type(s).__name__ for s in sources] == ["WandbConsole", "SlurmFiles", "Unavailable"]
    assert reading.first_error is not None and reading.first_error.host == "gpu-node-017"
    assert reading.sources[-1].error == ("no console log: not configured "
                                         "(joblog.kubernetes.enabled)")
    unusable = read(for_run(settings, RunLogs("team", "proj", "r1")))
    assert [s.error for s in unusable.sources] == [
        "no console log: no W&B API key (wandb.api_key)",
        "no console log: the run has no Slurm job id",
        "no console log: not configured (joblog.kubernetes.enabled)"]
    assert "no console log could be read" in join(unusable, None).statement


PAGE = """
query RunConsoleLogPage($entity: String!, $project: String!, $runName: String!, $first: Int,
                        $after: String) {
  project(name: $project, entityName: $entity) {
    run(name: $runName) {
      logLineCount
      logLines(first: $first, after: $after, useImprovedPagination: true) {
        edges { node { number timestamp level label line } }
        pageInfo { endCursor hasNextPage }
      }
    }
  }
}"""


def test_the_standin_pages_console_lines_as_the_sdk_reads_them():
    """The wandb SDK's forward paging query (RunConsoleLogPage, the same file as the tail):
    pages in ascending order until hasNextPage is false, 0-based line numbers."""
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "r1")
        wb.add_console("team", "proj", "r1", [f"line {i}" for i in range(5)], level="error")
        seen, after = [], None
        while True:
            body = requests.post(f"{wb.url}/graphql", auth=("api", wb.api_key), timeout=10, json={
                "query": PAGE, "variables": {"entity": "team", "project": "proj",
                                             "runName": "r1", "first": 2, "after": after}}).json()
            run = body["data"]["project"]["run"]
            seen += [e["node"] for e in run["logLines"]["edges"]]
            if not run["logLines"]["pageInfo"]["hasNextPage"]:
                break
            after = run["logLines"]["pageInfo"]["endCursor"]
    assert run["logLineCount"] == 5
    assert [(n["number"], n["line"], n["level"]) for n in seen] == \
        [(i, f"line {i}", "error") for i in range(5)]
