"""Shared fixtures: loopback only, no proxies; test layers."""

from __future__ import annotations

import os

import pytest

# A test that starts a real binary, a subprocess or the wandb SDK is marked integration (or
# slurm / e2e) on itself, its class or its module (tests/test_layers.py checks it); every other
# test is the in-process unit layer (``make test-fast``, ``pytest -m unit``).
LAYERS = ("integration", "slurm", "e2e")
# Test files whose tests share nothing costly (no module fixture): their tests are spread over
# both workers one by one. Every other file keeps all its tests on one worker, so a module
# fixture such as a running stack is started once (``--dist loadgroup``, one group per file).
SPREAD = frozenset({"tests.test_rules"})
# The longest work goes out first, so the two workers finish together instead of one running a
# long file alone at the end: xdist hands out groups in collection order (``make test`` passes
# ``--no-loadscope-reorder``; by default it would hand out the groups with most tests first, and
# every one-test group, such as each promtool run, last). Measured with ``pytest -n 2 --dist
# loadgroup --durations=80``; a name that no longer exists only loses its place.
FIRST = ("host_alerts.test.yml", "gpu_alerts_hostname.test.yml", "real_telemetry.test.yml",
         "tests.test_e2e", "tests.test_impact_prometheus", "tests.test_dashboards_prometheus",
         "tests.test_e2e_victoriametrics", "tests.test_host_faults_e2e",
         "tests.test_host_faults_upstream", "tests.test_rules", "tests.test_packaging")

for _var in [v for v in os.environ if "proxy" in v.lower()]:
    os.environ.pop(_var, None)
os.environ["NO_PROXY"] = "127.0.0.1,localhost"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test outside the integration layers as ``unit``, and keep each file's tests
    on one worker unless the file is in ``SPREAD``."""
    for item in items:
        if not any(item.get_closest_marker(layer) for layer in LAYERS):
            item.add_marker(pytest.mark.unit)
        module = getattr(getattr(item, "module", None), "__name__", item.nodeid)
        if module not in SPREAD:
            item.add_marker(pytest.mark.xdist_group(module))
    items.sort(key=_start_rank)  # stable: file order within a rank


def _start_rank(item: pytest.Item) -> int:
    """The item's place in ``FIRST`` (its suite for a promtool run, else its module), or after
    all of them."""
    module = getattr(getattr(item, "module", None), "__name__", "")
    for rank, name in enumerate(FIRST):
        if name == module or (name.endswith(".yml") and f"[{name}-" in item.nodeid):
            return rank
    return len(FIRST)
