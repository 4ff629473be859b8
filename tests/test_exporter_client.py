"""The training-side helper against a running exporter, and the prolog/epilog without Slurm."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from wandb.sdk.wandb_run import Run

from harness.exporter_process import metric_samples, running_exporter
from harness.processes import env_without_proxies, free_port, stays_true, wait_for
from wandb_infra.common import labels
from wandb_infra.exporter.client import (
    build_payload,
    deregister,
    keep_registered,
    register,
    visible_gpus,
)

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "slurm"
RUN = SimpleNamespace(entity="team", project="llm", id="abc123", name="run-name", group="grp")


@pytest.fixture(scope="module")
def exporter(tmp_path_factory):
    token = tmp_path_factory.mktemp("tok") / "token"
    token.write_text("helper-token-123\n")
    with running_exporter({"auth": {"token_file": str(token)}},
                          tmp_path_factory.mktemp("exporter")) as url:
        yield url, str(token)


@pytest.mark.parametrize(("env", "gpus"), [
    ({"SLURM_JOB_GPUS": "4,5", "CUDA_VISIBLE_DEVICES": "0,1"}, [4, 5]),
    ({"SLURM_STEP_GPUS": "6", "SLURM_JOB_GPUS": "4,5,6"}, [6]),
    ({"CUDA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}, ["GPU-aaa", "GPU-bbb"]),
    ({"CUDA_VISIBLE_DEVICES": ""}, []),
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, []),
    ({}, []),
])
def test_visible_gpus(env, gpus):
    assert visible_gpus(env) == gpus


def test_payload_from_env_without_run():
    env = {"WANDB_ENTITY": "e", "WANDB_PROJECT": "p", "WANDB_RUN_ID": "r", "SLURM_JOB_ID": "9",
           "SLURMD_NODENAME": "gpu01", "SLURM_JOB_GPUS": "1"}
    assert build_payload(None, env, ttl=30) == {
        "entity": "e", "project": "p", "run_id": "r", "hostname": "gpu01", "gpus": [1],
        "slurm_job_id": "9", "ttl_seconds": 30}


@pytest.mark.integration
def test_register_and_deregister(exporter):
    url, token_file = exporter
    env = {"WANDB_INFRA_EXPORTER_URL": url, "WANDB_INFRA_EXPORTER_TOKEN_FILE": token_file,
           "WANDB_INFRA_HOSTNAME": "gpu11", "CUDA_VISIBLE_DEVICES": "2,3", "SLURM_JOB_ID": "77"}
    assert register(RUN, environ=env) is True
    nodes = metric_samples(url, labels.NODE_INFO)
    assert nodes == [{"wandb_entity": "team", "wandb_project": "llm", "wandb_run_id": "abc123",
                      "wandb_run_name": "run-name", "wandb_run_group": "grp",
                      "hostname": "gpu11", "source": "registrations", "slurm_job_id": "77"}]
    assert sorted(s["gpu"] for s in metric_samples(url, labels.GPU_INFO)) == ["2", "3"]
    assert deregister(RUN, environ=env) is True
    assert metric_samples(url, labels.NODE_INFO) == []


@pytest.mark.integration
def test_never_raises_and_returns_quickly(exporter):
    url, token_file = exporter
    dead = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    assert register(RUN, url=dead, timeout=1, environ={}) is False
    assert time.monotonic() - start < 5
    assert register(RUN, url=url, environ={}) is False  # no token: 401
    bad = SimpleNamespace(entity="team", project="llm", id="bad id", name=None, group=None)
    assert register(bad, url=url, environ={"WANDB_INFRA_EXPORTER_TOKEN_FILE": token_file}) \
        is False
    assert register(None, url=url, environ={}) is False  # no identity at all
    assert register(RUN, url="not a url", environ={}) is False


@pytest.mark.integration
def test_heartbeat_keeps_registration_alive(exporter):
    url, token_file = exporter
    env = {"WANDB_INFRA_EXPORTER_TOKEN_FILE": token_file, "WANDB_INFRA_HOSTNAME": "gpu12"}
    beat = keep_registered(RUN, interval=0.4, url=url, environ=env)
    try:
        wait_for(lambda: beat.ok and metric_samples(url, labels.NODE_INFO), 10,
                 "the first registration")
        # TTL is 1.2 s: over 3 s the registration is alive only thanks to the beats
        stays_true(lambda: metric_samples(url, labels.NODE_INFO), 3,
                   "the registration kept alive by the heartbeat", interval=0.3)
        assert beat.ok
    finally:
        beat.stop()
    assert metric_samples(url, labels.NODE_INFO) == []


def _slurm_script(name, url, token_file, **env):
    full = {**env_without_proxies(), "WANDB_INFRA_EXPORTER_URL": url,
            "WANDB_INFRA_EXPORTER_TOKEN_FILE": token_file,
            "WANDB_INFRA_EXPORTER_ENV_FILE": "/nonexistent", "SLURMD_NODENAME": "gpu21",
            "SLURM_JOB_ID": "314", "SLURM_JOB_USER": "alice", **env}
    return subprocess.run([str(DEPLOY / name)], env=full, capture_output=True, text=True,
                          timeout=30, check=False)


@pytest.mark.integration
def test_prolog_epilog_with_prolog_environment(exporter):
    """The scripts with the variables slurmd gives a Prolog (the real-Slurm run is in
    test_exporter_slurm.py); they always exit 0."""
    url, token_file = exporter
    proc = _slurm_script("prolog.sh", url, token_file,
                         SLURM_JOB_COMMENT="ckpt every 1h; wandb:team/llm/slurm42",
                         SLURM_JOB_GPUS="0,3")
    assert proc.returncode == 0, proc.stderr
    gpus = metric_samples(url, labels.GPU_INFO)
    assert sorted((s["hostname"], s["gpu"], s["wandb_run_id"]) for s in gpus) == [
        ("gpu21", "0", "slurm42"), ("gpu21", "3", "slurm42")]
    assert metric_samples(url, labels.NODE_INFO)[0]["slurm_job_id"] == "314"
    proc = _slurm_script("epilog.sh", url, token_file,
                         SLURM_JOB_COMMENT="ckpt every 1h; wandb:team/llm/slurm42")
    assert proc.returncode == 0
    assert metric_samples(url, labels.NODE_INFO) == []


@pytest.mark.integration
def test_prolog_never_fails_the_job(exporter, tmp_path):
    url, token_file = exporter
    dead = f"http://127.0.0.1:{free_port()}"
    for name in ("prolog.sh", "epilog.sh"):
        proc = _slurm_script(name, dead, token_file, SLURM_JOB_COMMENT="wandb:t/p/r",
                             WANDB_INFRA_EXPORTER_TIMEOUT="1")
        assert proc.returncode == 0
        assert "failed" in proc.stderr or proc.stderr == ""
        proc = _slurm_script(name, url, str(tmp_path / "missing-token"),
                             SLURM_JOB_COMMENT="wandb:t/p/r")
        assert proc.returncode == 0
    proc = _slurm_script("prolog.sh", url, token_file, SLURM_JOB_COMMENT="no run here")
    assert proc.returncode == 0
    proc = _slurm_script("prolog.sh", url, token_file,
                         SLURM_JOB_COMMENT='wandb:t/p/r"injected', SLURM_JOB_GPUS="0;rm -rf")
    assert proc.returncode == 0
    nodes = metric_samples(url, labels.NODE_INFO)
    assert [(n["wandb_run_id"], n["hostname"]) for n in nodes] == [("r", "gpu21")]
    assert metric_samples(url, labels.GPU_INFO) == []
    _slurm_script("epilog.sh", url, token_file, SLURM_JOB_COMMENT="wandb:t/p/r")


@pytest.mark.integration
def test_reads_the_attributes_a_real_wandb_run_has():
    for attribute in ("entity", "project", "id", "name", "group"):
        assert isinstance(getattr(Run, attribute, None), property), attribute
