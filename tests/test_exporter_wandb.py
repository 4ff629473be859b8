"""The W&B source against the shared W&B stand-in (harness/wandb_standin.py)."""

from __future__ import annotations

import pytest

from harness.exporter_process import metric_samples, metric_value, running_exporter
from harness.processes import wait_for
from harness.wandb_standin import WandbStandin
from wandb_infra.common import labels
from wandb_infra.common.commands import SourceError
from wandb_infra.common.configfile import ConfigError
from wandb_infra.exporter.model import Gpu
from wandb_infra.exporter.sources.wandb_runs import WandbRunsSource


def wire_config(*envs, lr=0.1):
    """A run config as the SDK stores it: every key wrapped in {"value": ...}."""
    writers = {f"writer{i}": env for i, env in enumerate(envs)}
    return {"lr": {"value": lr}, "_wandb": {"value": {"cli_version": "0.31.0", "e": writers}}}


def env(host, n_gpus=0, **slurm):
    out = {"host": host, "gpu_nvidia": [{"name": "NVIDIA H100", "uuid": f"GPU-{host}-{i}"}
                                        for i in range(n_gpus)]}
    if slurm:
        out["slurm"] = slurm
    return out


@pytest.fixture
def standin():
    with WandbStandin() as server:
        yield server


def source(server, **extra):
    cfg = {"base_url": server.url, "api_key": server.api_key, "projects": ["team/llm"],
           "page_size": 2, "timeout_seconds": 5, **extra}
    return WandbRunsSource(cfg)


def test_running_runs_placed_on_hosts_and_gpus(standin):
    standin.add_run("team", "llm", "single", config=wire_config(env("gpu01", 2)),
                    display_name="small", group="sweep-1")
    standin.add_run("team", "llm", "multi", config=wire_config(
        env("gpu02.cluster", 4, job_id="99", job_nodelist="gpu[02-04]", job_gpus="2,3")))
    standin.add_run("team", "llm", "sharedmode", config=wire_config(env("gpu05", 1),
                                                                   env("gpu06", 1)))
    standin.add_run("team", "llm", "finished", state="finished", config=wire_config(env("x", 1)))
    standin.add_run("team", "llm", "nohost", config={"lr": {"value": 1}})
    standin.add_run("team", "other", "elsewhere", config=wire_config(env("gpu09", 1)))
    result = source(standin).poll()
    got = {(p.run.path(), p.host): p for p in result.placements}
    assert set(got) == {("team/llm/single", "gpu01"), ("team/llm/multi", "gpu02.cluster"),
                        ("team/llm/multi", "gpu03"), ("team/llm/multi", "gpu04"),
                        ("team/llm/sharedmode", "gpu05"), ("team/llm/sharedmode", "gpu06")}
    single = got[("team/llm/single", "gpu01")]
    assert single.gpus == (Gpu("0", "GPU-gpu01-0"), Gpu("1", "GPU-gpu01-1"))
    assert single.run_name == "small" and dict(single.extra) == {"wandb_run_group": "sweep-1"}
    multi = got[("team/llm/multi", "gpu02.cluster")]
    assert multi.gpus == (Gpu("2", "GPU-gpu02.cluster-2"), Gpu("3", "GPU-gpu02.cluster-3"))
    assert dict(multi.extra)["slurm_job_id"] == "99"
    assert got[("team/llm/multi", "gpu03")].gpus == ()
    assert result.problems == []
    # the four running runs of team/llm come in two pages of two
    calls = standin.calls(path_prefix="/graphql")
    assert len(calls) == 2
    assert calls[0].variables["after"] is None and calls[1].variables["after"]


def test_errors_become_source_errors(standin):
    standin.add_run("team", "llm", "r1", config=wire_config(env("gpu01", 1)))
    standin.fail(500, times=1)
    with pytest.raises(SourceError, match="HTTP 500"):
        source(standin).poll()
    wrong = WandbRunsSource({"base_url": standin.url, "api_key": "local-" + "x" * 40,
                             "projects": ["team/llm"]})
    with pytest.raises(SourceError, match="HTTP 401"):
        wrong.poll()
    with pytest.raises(SourceError, match="not found"):
        source(standin, projects=["team/missing"]).poll()
    with pytest.raises(ConfigError):
        WandbRunsSource({"api_key": "k", "projects": ["no-slash"]})
    with pytest.raises(ConfigError):
        WandbRunsSource({"projects": ["a/b"]})


@pytest.mark.integration
def test_exporter_publishes_wandb_runs_and_survives_outage(standin, tmp_path):
    standin.add_run("team", "llm", "live", config=wire_config(env("gpu01.example.com", 2)),
                    display_name="live-run")
    key_file = tmp_path / "key"
    key_file.write_text(standin.api_key + "\n")
    config = {"grace_seconds": 600, "log_level": "debug",
              "sources": {"wandb": {"enabled": True, "base_url": standin.url,
                                    "api_key_file": str(key_file), "projects": ["team/llm"],
                                    "interval_seconds": 0.3, "timeout_seconds": 2}}}
    with running_exporter(config, tmp_path / "exporter") as url:
        gpus = wait_for(lambda: metric_samples(url, labels.GPU_INFO), 20, "the run's GPUs")
        assert sorted((g["hostname"], g["gpu"], g["gpu_uuid"], g["source"]) for g in gpus) == [
            ("gpu01", "0", "GPU-gpu01.example.com-0", "wandb"),
            ("gpu01", "1", "GPU-gpu01.example.com-1", "wandb")]
        assert metric_samples(url, labels.NODE_INFO)[0]["wandb_run_name"] == "live-run"
        standin.fail(503, times=None)
        wait_for(lambda: metric_value(url, "wandb_infra_exporter_source_up",
                                      source="wandb") == 0.0, 20, "source_up 0 during the outage")
        assert len(metric_samples(url, labels.GPU_INFO)) == 2
    log = (tmp_path / "exporter" / "exporter.log").read_text()
    assert "source failed" in log
    assert standin.api_key not in log
