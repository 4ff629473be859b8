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
