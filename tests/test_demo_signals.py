"""``make demo`` stops on the first Ctrl-C (SIGINT) or ``kill`` (SIGTERM) within 10 s, in every
phase (start-up, each scenario), and stops every process it started: the services, and what the
wandb SDK started for the demo's training jobs."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harness import processes

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.e2e

# (phase, the demo's arguments, the line after which the signal is sent, what runs by then)
PHASES = {
    # mid start-up: the simulator and exporter are up, the rest are starting
    "start-up": ([], "starting simulator", 1),
    "scenario 1": (["--scenario", "1"], "scenario 1:", 4),
    "scenario 2": (["--scenario", "2"], "scenario 2:", 4),
    "scenario 5": (["--scenario", "5"], "scenario 5:", 4),
}
CASES = [("start-up", signal.SIGINT), ("start-up", signal.SIGTERM),
         ("scenario 1", signal.SIGINT), ("scenario 2", signal.SIGTERM),
         ("scenario 5", signal.SIGINT), ("scenario 5", signal.SIGTERM)]


@pytest.mark.parametrize(("phase", "signum"), CASES, ids=[f"{p}-{s.name}" for p, s in CASES])
def test_a_signal_stops_the_demo_and_everything_it_started(tmp_path, phase, signum):
    args, line, services = PHASES[phase]
    probe = uuid.uuid4().hex
    log_path = tmp_path / "demo.log"
    with log_path.open("wb") as log:
        demo = subprocess.Popen(
            [sys.executable, "-m", "demo", "--workdir", str(tmp_path / "demo"), *args], cwd=ROOT,
            stdout=log, stderr=subprocess.STDOUT,
            env={**processes.env_without_proxies(), "DEMO_SIGNAL_PROBE": probe})
    try:
        processes.wait_for(lambda: line in log_path.read_text() or demo.poll() is not None, 180,
                           f"the demo to print {line!r}")
        processes.wait_for(lambda: len(processes.descendants(demo.pid)) >= services
                           or demo.poll() is not None, 60, f"{services} service(s) running")
        assert demo.poll() is None, log_path.read_text()
        demo.send_signal(signum)
        returncode = demo.wait(timeout=10)
        assert returncode == 128 + signum, log_path.read_text()
        assert processes.marked("DEMO_SIGNAL_PROBE", probe) == [], log_path.read_text()
    finally:
        processes.terminate([demo.pid, *processes.marked("DEMO_SIGNAL_PROBE", probe)])
