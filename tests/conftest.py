"""Shared fixtures: loopback only, no proxies."""

from __future__ import annotations

import os

for _var in [v for v in os.environ if "proxy" in v.lower()]:
    os.environ.pop(_var, None)
os.environ["NO_PROXY"] = "127.0.0.1,localhost"
