"""``make demo`` stopped with SIGTERM (``kill``, a CI timeout) or Ctrl-C stops every service it
started: nothing is left running from its work directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.processes import env_without_proxies, wait_for

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.e2e


def _started_from(workdir: Path) -> list[int]:
    """Pids of processes whose command line or working directory is under ``workdir``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if str(workdir) in cmdline or cwd.startswith(str(workdir)):
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_everything_the_demo_started(tmp_path, signum):
    workdir = tmp_path / "demo"
    log = (tmp_path / "demo.log").open("wb")
    demo = subprocess.Popen([sys.executable, "-m", "demo", "--workdir", str(workdir)], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT, env=env_without_proxies())
    try:
        # the demo prints the services' addresses once every one answered its readiness check
        wait_for(lambda: "  Prometheus   http" in (tmp_path / "demo.log").read_text()
                 or demo.poll() is not None, 120, "the demo's stack to be up")
        assert demo.poll() is None, (tmp_path / "demo.log").read_text()
        services = [p for p in _started_from(workdir) if p != demo.pid]
        assert len(services) >= 4, services  # exporter, bridge, Alertmanager, Prometheus
        demo.send_signal(signum)
        demo.wait(timeout=60)
        left = wait_for(lambda: not _started_from(workdir) or None, 30,
                        "every service to stop") if _started_from(workdir) else True
        assert left
    finally:
        if demo.poll() is None:
            demo.kill()
        log.close()
