"""The files source and scheduler commands against FIFOs, devices, floods and hung children, and
the options that bound them. Polls that could hang or eat memory on a
regression run in a child process with a time limit and an address-space limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import yaml

from harness.processes import wait_for
from tests.inprocess import Result, run_main
from wandb_infra.common.commands import SourceError, run_command
from wandb_infra.common.configfile import ConfigError
from wandb_infra.exporter import cli, config
from wandb_infra.exporter.pushed import series
from wandb_infra.exporter.sources.files import RegistrationFilesSource
from wandb_infra.exporter.sources.nodestate import SlurmNodeSource
from wandb_infra.exporter.sources.slurm import SlurmSource

REG = {"entity": "ent", "project": "proj", "run_id": "run1", "hostname": "gpu01"}
CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from wandb_infra.common.commands import SourceError
from wandb_infra.exporter.sources.files import RegistrationFilesSource
from wandb_infra.exporter.sources.slurm import SlurmSource
kind, cfg = sys.argv[1], json.loads(sys.argv[2])
source = RegistrationFilesSource(cfg, 180000) if kind == "files" else SlurmSource(cfg)
try:
    result = source.poll()
    out = {"placements": len(result.placements), "problems": result.problems}
except SourceError as exc:
    out = {"error": str(exc)}
# VmHWM is this image's own peak; ru_maxrss would start from the spawning pytest worker's peak
# (Linux keeps the larger of the two across fork and exec), so it grew with the suite, not us
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
out["peak_rss_mb"] = int(hwm.split()[1]) / 1024
print(json.dumps(out))
"""


def _poll_in_child(kind: str, cfg: dict, timeout: float = 20) -> dict:
    """One poll in a fresh interpreter limited to 1 GiB of address space and ``timeout``."""
    proc = subprocess.run([sys.executable, "-c", CHILD, kind, json.dumps(cfg)],
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


# -- the files source --------------------------------------------------------------------------

@pytest.mark.integration
def test_a_fifo_or_a_device_is_skipped_not_read(tmp_path):
    """A FIFO hung the poller forever (reporting up) and a link to /dev/zero was read without
    end; both are now named as problems while the good file still counts."""
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    (tmp_path / "good.json").write_text(json.dumps(REG))
    (tmp_path / "link.json").symlink_to(tmp_path / "good.json")  # a ConfigMap-style link is fine
    started = time.monotonic()
    out = _poll_in_child("files", {"directory": str(tmp_path)})
    assert time.monotonic() - started < 10
    assert out["placements"] == 2
    assert sorted(out["problems"]) == ["fifo.json: not a regular file",
                                       "zero.json: not a regular file"]


def test_a_file_past_max_file_bytes_is_skipped(tmp_path):
    (tmp_path / "big.json").write_text(json.dumps([REG] * 40))
    (tmp_path / "small.json").write_text(json.dumps({**REG, "run_id": "small"}))
    result = RegistrationFilesSource({"directory": str(tmp_path), "max_file_bytes": 1024},
                                     180_000).poll()
    assert [p.run.run_id for p in result.placements] == ["small"]
    assert result.problems == ["big.json: larger than 1024 bytes (max_file_bytes)"]


def _one_mib_of_series(path: Path, first: int) -> int:
    """Registrations with 64 GPUs each, as many as fit in 1 MiB; returns their series."""
    rows, size = [], 2
    for i in range(first, first + 100_000):
        row = json.dumps({**REG, "run_id": f"r{i}", "gpus": list(range(64))})
        if size + len(row) + 2 > 1 << 20:
            break
        rows.append(row)
        size += len(row) + 2
    path.write_text("[" + ", ".join(rows) + "]")
    return len(rows) * 65


def test_files_together_stay_within_the_http_paths_series_cap(tmp_path):
    """Two 1 MiB files used to publish 2.2x registrations.max_series; the files source now
    takes its cap from registrations.max_series and skips registrations past it."""
    written = _one_mib_of_series(tmp_path / "a.json", 0) + _one_mib_of_series(
        tmp_path / "b.json", 100_000)
    cfg = config.load(None, environ={})
    cfg["sources"]["files"] = {"enabled": True, "directory": str(tmp_path)}
    [source] = cli.build_sources(cfg, [])
    result = source.poll()
    published = sum(map(series, result.placements))
    assert written > 2 * 180_000 and 180_000 - 65 < published <= 180_000, (written, published)
    skipped = (written - published) // 65
    assert result.problems == [f"{skipped} registration(s) skipped: the files would publish "
                               "more than 180000 series (max_series)"]


# -- scheduler commands ------------------------------------------------------------------------

FLOOD = ["sh", "-c", "head -c 200000000 /dev/zero | tr '\\0' ' '"]


@pytest.mark.integration
def test_200_mb_of_squeue_output_is_refused_within_a_bounded_memory():
    """200 MB of output peaked at several times that in RSS; now the command is killed at
    max_output_bytes (64 MiB) with a source error naming the option."""
    out = _poll_in_child("slurm", {"command": FLOOD, "timeout_seconds": 15})
    assert "max_output_bytes" in out["error"] and "sh -c head" in out["error"]
    assert out["peak_rss_mb"] < 200, out
    small = _poll_in_child("slurm", {"command": FLOOD, "max_output_bytes": 1 << 20})
    assert f"more than {1 << 20} bytes" in small["error"], small


@pytest.mark.integration
def test_a_child_holding_the_pipe_cannot_outlast_the_timeout(tmp_path):
    """``subprocess.run`` waited for a wrapper's background child after the timeout (20 s
    here); the command's whole process group is now killed at the deadline."""
    pid_file = tmp_path / "pid"
    command = ["sh", "-c", f"sleep 20 & echo $! > {pid_file}; echo '{{\"jobs\": []}}'"]
    source = SlurmSource({"command": command, "timeout_seconds": 1})
    started = time.monotonic()
    with pytest.raises(SourceError, match="timed out after 1 s"):
        source.poll()
    assert time.monotonic() - started < 3
    pid = int(pid_file.read_text())

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    wait_for(gone, 5, "the background sleep killed with its group")


@pytest.mark.integration
def test_node_state_and_other_runners_are_bounded_too():
    printer = ["sh", "-c", "head -c 5000 /dev/zero"]
    node = SlurmNodeSource({"command": printer, "max_output_bytes": 1000}, str, 300)
    with pytest.raises(SourceError, match="more than 1000 bytes"):
        node.poll()
    # the bridge's remediation passes its own runner: its output is checked afterwards
    with pytest.raises(SourceError, match="more than 10 bytes"):
        run_command(printer, 5, partial(subprocess.run), max_bytes=10)
    assert run_command(["echo", "ok"], 5, max_bytes=10) == "ok\n"


# -- the options -------------------------------------------------------------------------------

def _check(tmp_path: Path, config: dict) -> Result:
    """``wandb-infra-exporter --config FILE --check-config`` with only ``PATH`` set."""
    path = tmp_path / "exporter.yaml"
    path.write_text(yaml.safe_dump({"listen": "127.0.0.1:9842", **config}))
    return run_main(cli.main, ["--config", str(path), "--check-config"],
                    env={"PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize(("config", "message"), [
    ({"auth": {"host_tokens": [{"token": "t" * 20, "hosts": ["*.rack-b.example.com"]}]}},
     "'*.rack-b.example.com' can never match"),
    ({"auth": {"host_tokens": [{"token": "t" * 20, "hosts": ["GPU01"]}]}},
     "'GPU01' can never match"),
    ({"registrations": {"max_series_per_token": 0}},
     "registrations.max_series_per_token: must be an integer > 0, not 0"),
    ({"registrations": {"max_series": "lots"}},
     "registrations.max_series: must be an integer > 0, not 'lots'"),
    ({"sources": {"slurm": {"enabled": True, "max_output_bytes": "64M"}}},
     "sources.slurm.max_output_bytes: must be an integer > 0, not '64M'"),
    ({"node_state": {"slurm": {"enabled": True, "max_output_bytes": True}}},
     "node_state.slurm.max_output_bytes: must be an integer > 0, not True"),
    ({"sources": {"files": {"enabled": True, "directory": "/tmp", "max_file_bytes": 1.5}}},
     "sources.files.max_file_bytes: must be an integer > 0, not 1.5"),
    ({"sources": {"files": {"enabled": True, "directory": "/tmp", "max_series": -1}}},
     "sources.files.max_series: must be an integer > 0 or unset, not -1"),
])
def test_bad_bounds_are_one_line_errors(tmp_path, config, message):
    proc = _check(tmp_path, config)
    assert proc.returncode == 2, proc.stdout
    [line] = proc.stderr.strip().splitlines()
    assert message in line


@pytest.mark.parametrize("config", [
    {"auth": {"host_tokens": [{"token": "t" * 20, "hosts": ["gpu-b*", "10.1.2.*"]}]}},
    {"hostnames": {"strip_domain": False},
     "auth": {"host_tokens": [{"token": "t" * 20, "hosts": ["*.rack-b.example.com"]}]}},
    {"registrations": {"max_series_per_token": 64},
     "sources": {"slurm": {"enabled": True, "max_output_bytes": 1 << 30},
                 "files": {"enabled": True, "directory": "/tmp", "max_file_bytes": 65536,
                           "max_series": 1000}}},
])
def test_good_bounds_are_accepted(tmp_path, config):
    proc = _check(tmp_path, config)
    assert proc.returncode == 0, proc.stderr


def test_help_explains_the_bounds():
    out = run_main(cli.main, ["--help"]).stdout
    for text in ("max_series_per_token", "max_output_bytes", "max_file_bytes",
                 "canonical host key", "Sec-Fetch-*", "application/json", "cost <= 12"):
        assert text in out, text


def test_bcrypt_cost_above_the_bound_is_refused(tmp_path):
    import bcrypt  # noqa: PLC0415 - only this test hashes

    from wandb_infra.exporter import webconfig  # noqa: PLC0415

    path = tmp_path / "web.yml"
    costly = bcrypt.hashpw(b"x", bcrypt.gensalt(rounds=13)).decode()
    path.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": costly}}))
    with pytest.raises(ConfigError, match="bcrypt cost 13, above 12"):
        webconfig.load(str(path))
    path.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": "$2y$10$short"}}))
    with pytest.raises(ConfigError, match="not a bcrypt hash"):
        webconfig.load(str(path))
