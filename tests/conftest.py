"""Shared fixtures: loopback only, no proxies; test layers."""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import processes

# A test that starts a real binary, a subprocess or the wandb SDK is marked integration (or
# slurm / e2e) on itself, its class or its module (tests/test_layers.py checks it); every other
# test is the in-process unit layer (``make test-fast``, ``pytest -m unit``).
LAYERS = ("integration", "slurm", "e2e")
# A test that uses a module-scoped fixture (a running stack, a Prometheus) stays on the worker
# that started it, with every other test of its file using one (``--dist loadgroup``, one group
# per file); every other test goes to whichever worker is free, so a file of independent slow
# tests (each demo signal, each promtool suite) runs on several workers at once.
SHARED_SCOPES = frozenset({"module", "class", "package"})
# The longest work goes out first, so the workers finish together instead of one running a
# long file alone at the end: xdist hands out groups in collection order (``make test`` passes
# ``--no-loadscope-reorder``; by default it would hand out the groups with most tests first, and
# every one-test group, such as each promtool run, last). Measured with ``pytest -n 4 --dist
# loadgroup --junitxml`` (each file's or suite's summed time); a name that no longer exists
# only loses its place.
FIRST = ("tests.test_e2e", "tests.test_impact_prometheus", "tests.test_dashboards_prometheus",
         "tests.test_packaging", "tests.test_prometheus_endings", "tests.test_host_faults_e2e",
         "tests.test_host_faults_upstream", "tests.test_e2e_victoriametrics",
         "tests.test_verdict_prometheus", "real_telemetry.test.yml", "host_alerts.test.yml",
         "down_long.test.yml", "tests.test_endings_prometheus", "gpu_alerts_hostname.test.yml",
         "tests.test_deploy_kubernetes", "tests.test_deploy_slurm", "tests.test_mixin",
         "tests.test_pages_browser", "tests.test_demo_signals",
         "tests.test_node_exporter_upstream", "gpu_alerts_Hostname.test.yml")

for _var in [v for v in os.environ if "proxy" in v.lower()]:
    os.environ.pop(_var, None)
os.environ["NO_PROXY"] = "127.0.0.1,localhost"

# Every process the suite starts inherits this variable (xdist workers too, as they start after
# this file is read), so the session's end finds whatever outlived its test, however it was
# started and wherever it was reparented. A new value per run: a pytest run inside a test (which
# drops PYTEST_XDIST_WORKER) marks only its own processes.
SESSION_MARK = "WANDB_INFRA_TEST_SESSION"
if "PYTEST_XDIST_WORKER" not in os.environ:
    os.environ[SESSION_MARK] = uuid.uuid4().hex


@pytest.fixture(scope="session", autouse=True)
def _wandb_service_stops() -> Iterator[None]:
    """The wandb SDK keeps one service process (wandb-core) per process that called
    ``wandb.init``, stopped only at that process's exit; an xdist worker does not run exit
    handlers, so the service would outlive the suite. Stop it with the session."""
    yield
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()


@pytest.hookimpl(hookwrapper=True)
def pytest_sessionfinish(session: pytest.Session) -> Iterator[None]:
    """Fail the run if a process the suite started is still alive at its end, naming each with
    the ports it listens on, and stop them all, so a failed or timed-out test leaks nothing into
    the next run. Checked once, in the process that started the session, after every other
    sessionfinish (xdist's stops the workers, which carry the mark themselves)."""
    yield
    if "PYTEST_XDIST_WORKER" in os.environ:
        return
    mark = os.environ[SESSION_MARK]
    # a process stopped by the last teardown may still be on its way out
    left = processes.marked(SESSION_MARK, mark)
    with contextlib.suppress(TimeoutError):
        processes.wait_for(lambda: not processes.marked(SESSION_MARK, mark), 2, "", 0.1)
        left = []
    left = [pid for pid in left if processes.alive(pid)]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if not left:
        if reporter is not None:
            reporter.write_line("no process started by the suite is left running")
        return
    lines = [f"  pid {pid}: {_cmdline(pid)[:200]} (listening on "
             f"{', '.join(map(str, processes.listening_ports(pid))) or 'no port'})"
             for pid in left]
    processes.terminate(left)
    message = (f"{len(left)} process(es) started by the suite outlived their tests "
               f"(now stopped):\n" + "\n".join(lines))
    if reporter is not None:
        reporter.write_line(message, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace").strip()
    except OSError:
        return "?"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test outside the integration layers as ``unit``, and keep the tests that share
    a module fixture on one worker."""
    for item in items:
        if not any(item.get_closest_marker(layer) for layer in LAYERS):
            item.add_marker(pytest.mark.unit)
        if _shares_a_fixture(item):
            module = getattr(getattr(item, "module", None), "__name__", item.nodeid)
            item.add_marker(pytest.mark.xdist_group(module))
    items.sort(key=_start_rank)  # stable: file order within a rank


def _shares_a_fixture(item: pytest.Item) -> bool:
    """True when the test uses a fixture set up once for several tests of its file."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return True
    return any((defs := info.name2fixturedefs.get(name)) and defs[-1].scope in SHARED_SCOPES
               for name in info.names_closure)


def _start_rank(item: pytest.Item) -> int:
    """The item's place in ``FIRST`` (its suite for a promtool run, else its module), or after
    all of them."""
    module = getattr(getattr(item, "module", None), "__name__", "")
    for rank, name in enumerate(FIRST):
        if name == module or (name.endswith(".yml") and f"[{name}]" in item.nodeid):
            return rank
    return len(FIRST)
