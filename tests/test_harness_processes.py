"""The suite leaves nothing running: a test that fails still stops what it started, and a process
that outlives its test fails the run, is named with its ports, and is stopped
(tests/conftest.py, ``pytest_sessionfinish``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from harness import processes
from tests.slurm_cluster import slurm_cluster
from tests.slurm_cluster import unavailable_reason as slurm_unavailable

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.integration

INNER = '''
import socket
import subprocess
import sys

from harness import processes

LISTENER = ("import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); "
            "s.listen(); time.sleep(600)")


def test_a_failing_stack_test(tmp_path):
    config = "global: {{scrape_interval: 1s}}\\n"
    with processes.prometheus(config, tmp_path) as prometheus:
        processes.wait_http(prometheus.url + "/-/ready")
        raise AssertionError("deliberately failing with Prometheus running")


def test_a_leak():
    if {leak}:
        subprocess.Popen([sys.executable, "-c", LISTENER], start_new_session=True)
        processes.wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", {port})) == 0, 10,
                           "the leaked listener")
'''


def _inner(tmp_path: Path, leak: bool) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run the inner suite in its own pytest; returns its result and its processes' mark. With
    ``leak`` only the leaking test runs (it passes), so a failed run is the leak check's doing."""
    port = processes.free_port()
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER.format(port=port, leak=leak)))
    probe = uuid.uuid4().hex
    env = {k: v for k, v in processes.env_without_proxies().items()
           if not k.startswith(("PYTEST_", "WANDB_INFRA_TEST_SESSION"))}
    env["LEAK_PROBE"] = probe
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py"),
         *(["-k", "test_a_leak"] if leak else [])],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    return result, probe


def test_a_failing_stack_test_leaves_nothing_and_the_suite_says_so(tmp_path):
    result, probe = _inner(tmp_path, leak=False)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "deliberately failing with Prometheus running" in out
    assert "no process started by the suite is left running" in out, out
    assert processes.marked("LEAK_PROBE", probe) == []


def test_a_process_outliving_its_test_fails_the_run_and_is_stopped(tmp_path):
    result, probe = _inner(tmp_path, leak=True)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "1 process(es) started by the suite outlived their tests (now stopped)" in out, out
    leaked = next(line for line in out.splitlines() if "LISTENER" in line or "socket" in line)
    assert "listening on" in leaked and "no port" not in leaked, leaked
    assert processes.marked("LEAK_PROBE", probe) == []


SPAWNER = '''
import os, signal, subprocess, sys, threading, time

from harness import sweep

mark = ("WANDB_INFRA_SWEEP_TEST", sys.argv[1])
os.environ[mark[0]] = mark[1]
received = []
signal.signal(signal.SIGTERM, lambda signum, _frame: received.append(signum))


def spawn():
    while True:
        subprocess.Popen(["sleep", "60"])


threading.Thread(target=spawn, daemon=True).start()
print("spawning", flush=True)
while not received:
    time.sleep(0.05)
sweep.become(mark, 128 + received[0])
'''


def test_the_sweep_outruns_a_thread_that_keeps_starting_processes(tmp_path):
    """A command whose thread starts process after process when the signal comes (the wandb SDK
    starting its service mid-scenario, made relentless): becoming ``harness.sweep`` ends that
    thread before the sweep, so nothing it started outlives the command. A sweep from inside
    the command, with the thread still running, leaves what it started after the last round."""
    script = tmp_path / "spawner.py"
    script.write_text(SPAWNER)
    probe = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, str(script), probe], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**processes.env_without_proxies(), "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"spawning\n"
        processes.wait_for(lambda: len(processes.descendants(proc.pid)) >= 20, 30, "spawns")
        proc.terminate()
        assert proc.wait(timeout=30) == 128 + 15
        assert processes.marked("WANDB_INFRA_SWEEP_TEST", probe) == []
    finally:
        processes.terminate([proc.pid, *processes.marked("WANDB_INFRA_SWEEP_TEST", probe)])


@pytest.mark.slurm
@pytest.mark.skipif(slurm_unavailable() is not None, reason=slurm_unavailable() or "")
def test_a_slurm_job_that_escapes_scancel_is_stopped_with_the_cluster(tmp_path):
    """A job's process that left its job (daemonised: proctrack/linuxproc follows parents, so
    scancel misses it) survives an empty queue; the cluster's teardown still stops it."""
    started = tmp_path / "started"
    with slurm_cluster(tmp_path / "cluster", gpus=1) as slurm:
        conf = slurm.env()["SLURM_CONF"]
        job = slurm.submit("--chdir", str(tmp_path), "-o", "/dev/null", "--wrap",
                           f"setsid -f sleep 3031; touch {started}; sleep 300")
        processes.wait_for(started.exists, 60, "the job's script")
        slurm.run("scancel", job)
        slurm.wait_state(job, {""})
        escaped = [pid for pid in processes.marked("SLURM_CONF", conf)
                   if Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x003031\x00"]
        assert escaped, "the daemonised process should outlive scancel"
    assert not [pid for pid in escaped if processes.alive(pid)]
    assert processes.marked("SLURM_CONF", conf) == []
