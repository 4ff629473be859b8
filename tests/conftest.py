"""Shared fixtures: loopback only, no proxies; test layers."""

from __future__ import annotations

import os

import pytest

# A module that starts real binaries marks itself integration (or slurm / e2e); everything else
# is the unit layer (``make test-fast``, ``pytest -m unit``).
LAYERS = ("integration", "slurm", "e2e")

for _var in [v for v in os.environ if "proxy" in v.lower()]:
    os.environ.pop(_var, None)
os.environ["NO_PROXY"] = "127.0.0.1,localhost"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test outside the integration layers as ``unit``."""
    for item in items:
        if not any(item.get_closest_marker(layer) for layer in LAYERS):
            item.add_marker(pytest.mark.unit)
