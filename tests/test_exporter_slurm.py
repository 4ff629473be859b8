"""The exporter against a REAL single-node Slurm 22.05 (tests/slurm_cluster.py).

Jobs submitted with ``--comment wandb:e/p/<run>`` and ``--gres=gpu:1`` must appear with the node
and the GPU index Slurm gave them, through squeue --json and through scontrol, in /metrics and in a
real Prometheus scraping the exporter; cancelled, they must go. The shipped prolog/epilog run as the
cluster's real Prolog/Epilog against a second exporter's registration API.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.exporter_process import metric_samples, metric_value, running_exporter
from harness.processes import free_port, prom_query, prometheus, wait_for
from tests.slurm_cluster import shipped_hook, slurm_cluster, unavailable_reason
from wandb_infra.common import labels

pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(unavailable_reason() is not None,
                                 reason=unavailable_reason() or "")]



@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Slurm whose Prolog/Epilog are the shipped scripts, pointed at a registration exporter."""
    base = tmp_path_factory.mktemp("slurm")
    reg_port = free_port()
    prolog = shipped_hook(base / "prolog", "prolog.sh", reg_port)
    epilog = shipped_hook(base / "epilog", "epilog.sh", reg_port)
    with running_exporter({}, base / "registrations", port=reg_port) as reg_url, \
            slurm_cluster(base / "cluster", gpus=2, prolog=prolog, epilog=epilog) as slurm:
        yield slurm, reg_url, base


def runs_in(url: str, name: str) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for sample in metric_samples(url, name):
        out.setdefault(sample[labels.RUN_ID], []).append(sample)
    return out


def submit(slurm, workdir: Path, *args: str) -> str:
    return slurm.submit("--chdir", str(workdir), "-o", "/dev/null", "-e", "/dev/null", *args,
                        "--wrap", "sleep 300")


@pytest.mark.parametrize("mode", ["squeue_json", "scontrol"])
def test_jobs_appear_and_go(cluster, mode, tmp_path):
    slurm, reg_url, _ = cluster
    config = {"registrations": {"enabled": False},
              "sources": {"slurm": {"enabled": True, "mode": mode, "interval_seconds": 0.5}}}
    with running_exporter(config, tmp_path / "exporter", env=slurm.env()) as url:
        job_a = submit(slurm, tmp_path, "--comment", f"wandb:ent/proj/a-{mode}", "--gres=gpu:1")
        job_b = submit(slurm, tmp_path, "--comment", f"note wandb:ent/proj/b-{mode} x",
                       "--gres=gpu:1")
        plain = submit(slurm, tmp_path, "--comment", "no run")
        for job in (job_a, job_b, plain):
            slurm.wait_state(job, {"RUNNING"})
        gpus = wait_for(lambda: (r := runs_in(url, labels.GPU_INFO)).get(f"a-{mode}")
                          and r.get(f"b-{mode}") and r)
        nodes = runs_in(url, labels.NODE_INFO)
        assert set(nodes) == {f"a-{mode}", f"b-{mode}"}
        node_a = nodes[f"a-{mode}"][0]
        assert node_a == {"wandb_entity": "ent", "wandb_project": "proj",
                          "wandb_run_id": f"a-{mode}", "hostname": slurm.node,
                          "source": "slurm", "slurm_job_id": job_a}
        index_a = [s["gpu"] for s in gpus[f"a-{mode}"]]
        index_b = [s["gpu"] for s in gpus[f"b-{mode}"]]
        assert len(index_a) == 1 and len(index_b) == 1
        assert sorted(index_a + index_b) == ["0", "1"]
        assert all(s["hostname"] == slurm.node for s in gpus[f"a-{mode}"])

        # The prolog saw the same job from inside slurmd: same host and GPU, by another path.
        registered = wait_for(lambda: runs_in(reg_url, labels.GPU_INFO).get(f"a-{mode}"))
        assert [(s["hostname"], s["gpu"], s["source"]) for s in registered] == \
            [(slurm.node, index_a[0], "registrations")]
        reg_node = runs_in(reg_url, labels.NODE_INFO)[f"a-{mode}"][0]
        assert reg_node["slurm_job_id"] == job_a

        target = url.removeprefix("http://")
        prom_cfg = (f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: exporter\n"
                    f"    static_configs:\n      - targets: ['{target}']\n")
        with prometheus(prom_cfg, tmp_path / "prom") as prom:
            query = f'wandb_run_gpu_info{{wandb_run_id="a-{mode}"}}'
            result = wait_for(lambda: prom_query(prom.url, query))
            assert [(r["metric"]["hostname"], r["metric"]["gpu"]) for r in result] == \
                [(slurm.node, index_a[0])]
            slurm.run("scancel", job_a)
            wait_for(lambda: f"a-{mode}" not in runs_in(url, labels.NODE_INFO))
            wait_for(lambda: not prom_query(prom.url, query))
        assert f"b-{mode}" in runs_in(url, labels.NODE_INFO)
        wait_for(lambda: f"a-{mode}" not in runs_in(reg_url, labels.NODE_INFO))
        slurm.run("scancel", job_b, plain)
        wait_for(lambda: not runs_in(url, labels.NODE_INFO))
        wait_for(lambda: not runs_in(reg_url, labels.NODE_INFO))


def test_slurm_outage_keeps_mapping_and_reports_down(cluster, tmp_path):
    """squeue failing (controller unreachable) keeps the runs for the grace period, up=0."""
    slurm, _, _ = cluster
    flag = tmp_path / "broken"
    squeue = tmp_path / "squeue"
    squeue.write_text(f"#!/bin/bash\n[ -e {flag} ] && {{ echo 'slurm_load_jobs error: "
                      f"Unable to contact slurm controller' >&2; exit 1; }}\nexec squeue \"$@\"\n")
    squeue.chmod(0o755)
    config = {"grace_seconds": 4, "registrations": {"enabled": False},
              "sources": {"slurm": {"enabled": True, "interval_seconds": 0.5,
                                    "command": [str(squeue), "--json"]}}}
    with running_exporter(config, tmp_path / "exporter", env=slurm.env()) as url:
        job = submit(slurm, tmp_path, "--comment", "wandb:ent/proj/outage", "--gres=gpu:1")
        slurm.wait_state(job, {"RUNNING"})
        wait_for(lambda: "outage" in runs_in(url, labels.NODE_INFO))
        flag.touch()
        wait_for(lambda: metric_value(url, "wandb_infra_exporter_source_up",
                                        source="slurm") == 0.0)
        assert "outage" in runs_in(url, labels.NODE_INFO)
        wait_for(lambda: "outage" not in runs_in(url, labels.NODE_INFO), timeout=15)
        flag.unlink()
        wait_for(lambda: "outage" in runs_in(url, labels.NODE_INFO))
        slurm.run("scancel", job)

