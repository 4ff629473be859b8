"""Registrations survive a restart of the real exporter process: a Slurm prolog registers a run
once for 7 days, and neither a SIGTERM restart nor a kill -9 a second after the POST loses it;
what expired while the exporter was down stays gone, and the state file is read back within the
store's bounds. Before: the registrations lived in memory only, and a restart forgot them all
(the runs vanished from the join metrics for the rest of their lives)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import requests

from harness.exporter_process import metric_samples, running_exporter
from harness.processes import free_port, wait_for

pytestmark = pytest.mark.integration

TOKEN = "registrations-token-0123"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def _register(url: str, run_id: str, host: str, ttl: float, **extra: object) -> None:
    body = {"entity": "team", "project": "proj", "run_id": run_id, "hostname": host,
            "ttl_seconds": ttl, **extra}
    assert requests.post(url + "/v1/runs", json=body, headers=HEADERS, timeout=10).status_code \
        == 201


def _runs(url: str) -> set[tuple[str, str]]:
    return {(s["wandb_run_id"], s["hostname"])
            for s in metric_samples(url, "wandb_run_node_info")}


def test_registrations_survive_sigterm_and_kill_9_and_expire_by_their_ttl(tmp_path):
    port, workdir = free_port(), tmp_path / "exporter"
    config = {"auth": {"token": TOKEN}}
    with running_exporter(config, workdir, port=port) as url:
        _register(url, "week", "gpu01", 7 * 86400, gpus=[0, "GPU-abc"], slurm_job_id="42",
                  run_name="my run")
        _register(url, "short", "gpu02", 12)
        short_ends = time.time() + 12
    with running_exporter(config, workdir, port=port) as url:  # after a SIGTERM
        assert _runs(url) == {("week", "gpu01"), ("short", "gpu02")}
        (gpu_info,) = [s for s in metric_samples(url, "wandb_run_gpu_info")
                       if s.get("gpu") == "0"]
        assert gpu_info["wandb_run_id"] == "week"
        (node,) = [s for s in metric_samples(url, "wandb_run_node_info")
                   if s["wandb_run_id"] == "week"]
        assert node["slurm_job_id"] == "42" and node["wandb_run_name"] == "my run"
        _register(url, "late", "gpu03", 7 * 86400)
        time.sleep(2.5)  # more than a save interval
        pid = _exporter_pid(workdir)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not Path(f"/proc/{pid}/cmdline").read_bytes(), 10, "the kill")
    time.sleep(max(0.0, short_ends - time.time()) + 0.5)  # "short" expired meanwhile
    with running_exporter(config, workdir, port=port) as url:
        assert _runs(url) == {("week", "gpu01"), ("late", "gpu03")}


def _exporter_pid(workdir: Path) -> int:
    """The exporter process started in ``workdir`` (found through /proc: its cwd)."""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.readlink(proc / "cwd") == str(workdir) and \
                    b"wandb-infra-exporter" in (proc / "cmdline").read_bytes():
                return int(proc.name)
        except OSError:
            continue
    raise AssertionError(f"no exporter running in {workdir}")


def test_the_state_file_is_restored_within_the_bounds_and_bad_lines_are_skipped(tmp_path):
    workdir = tmp_path / "exporter"
    workdir.mkdir()
    state = workdir / "registrations.json"
    future = time.time() + 3600
    lines = [{"format": 1}]
    lines += [{"entity": "team", "project": "proj", "run_id": f"r{i}", "hostname": f"gpu{i:02d}",
               "gpus": [], "source": "registrations", "expires": future} for i in range(5)]
    lines += [{"entity": "team", "project": "proj", "run_id": "bad id", "hostname": "gpu99",
               "source": "registrations", "expires": future},
              {"entity": "team", "project": "proj", "run_id": "old", "hostname": "gpu98",
               "source": "registrations", "expires": time.time() - 1}]
    state.write_text("\n".join(json.dumps(line) for line in lines) + "\nnot json\n")
    config = {"auth": {"token": TOKEN}, "registrations": {"max_entries": 3,
                                                          "state_file": str(state)}}
    with running_exporter(config, workdir) as url:
        assert _runs(url) == {("r0", "gpu00"), ("r1", "gpu01"), ("r2", "gpu02")}
        log = (workdir / "exporter.log").read_text()
        restored = next(json.loads(line) for line in log.splitlines()
                        if "registrations restored" in line)
        assert (restored["restored"], restored["expired"], restored["invalid"],
                restored["over_bounds"]) == ("3", "1", "2", "2")
        wait_for(lambda: state.read_text().count("\n") == 4, 10, "the bounded set saved")
