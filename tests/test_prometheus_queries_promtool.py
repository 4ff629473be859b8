"""The bridge's coverage queries under promtool's expression tests: what each returns for a
host's exporters at given times, checked by Prometheus' own engine without a running stack.

``targets_query`` (bridge/prometheus/endings.py) says when each exporter of a host was seen: one
failed scrape is no gap, two in a row are, and a target gone from discovery is absent.
``gpus_query`` says which GPUs reported. Queries are evaluated between scrapes, as the bridge's
range queries are (their grid starts when the run was first seen): a window then holds the same
scrapes whether Prometheus reads it closed on the left (2.x) or open (3.x).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from wandb_infra.bridge.prometheus.endings import gpus_query, targets_query
from wandb_infra.catalog import series as S

pytestmark = pytest.mark.integration

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
STEP = 30  # the scrape interval and the query step
HOST = "gpu-node-001"
# the target map the rules record: which host each exporter target reports
TARGETS = [
    {"series": f'{S.TARGET_HOSTS}{{instance="{HOST}:9400",job="dcgm",hostname="{HOST}",'
               f'{S.TARGET_LABEL}="dcgm_exporter"}}', "values": "1x40"},
    {"series": f'{S.TARGET_HOSTS}{{instance="{HOST}:9100",job="node",hostname="{HOST}",'
               f'{S.TARGET_LABEL}="node_exporter"}}', "values": "1x40"},
]
# scrapes every 30 s from 0 ("1x9" is ten values): dcgm-exporter fails once at 5m, then twice in
# a row at 10m30s and 11m; node_exporter never fails
UP = [
    {"series": f'up{{instance="{HOST}:9400",job="dcgm"}}',
     "values": "1x9 0 1x9 0 0 1x18"},
    {"series": f'up{{instance="{HOST}:9100",job="node"}}', "values": "1x40"},
]


def _expect(exporter: str, value: int) -> dict:
    return {"labels": f'{{hostname="{HOST}",{S.TARGET_LABEL}="{exporter}"}}', "value": value}


def _run(tmp_path: Path, tests: list[dict]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "queries.test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": f"{STEP}s",
                                    "tests": tests}, sort_keys=False))
    return subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True,
                          timeout=120, check=False)


def test_one_failed_scrape_is_no_gap_two_in_a_row_are(tmp_path):
    query = targets_query([HOST], STEP)
    cases = [
        # healthy; the single failure (5m) seen from either side; the first of the two (10m30s)
        ("4m15s", 1), ("5m15s", 1), ("5m45s", 1), ("10m45s", 1),
        # the two failures in a row: no successful scrape in the last two intervals
        ("11m15s", 0),
        ("11m45s", 1),
    ]
    tests = [{"interval": f"{STEP}s", "input_series": [*TARGETS, *UP],
              "promql_expr_test": [
                  {"expr": query, "eval_time": at,
                   "exp_samples": [_expect("dcgm_exporter", value), _expect("node_exporter", 1)]}
                  for at, value in cases]}]
    result = _run(tmp_path, tests)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_target_gone_from_discovery_is_absent_and_gpus_are_listed(tmp_path):
    gone = [{"series": f'up{{instance="{HOST}:9400",job="dcgm"}}', "values": "1x9 _x10 1x20"},
            UP[1]]
    present = [{"series": f'{S.GPU_PRESENT}{{hostname="{HOST}",gpu="{g}"}}', "values": "1x40"}
               for g in (0, 1)]
    tests = [{"interval": f"{STEP}s", "input_series": [*TARGETS, *gone, *present],
              "promql_expr_test": [
                  {"expr": targets_query([HOST], STEP), "eval_time": "8m15s",
                   "exp_samples": [_expect("node_exporter", 1)]},
                  {"expr": gpus_query([HOST]), "eval_time": "8m15s",
                   "exp_samples": [{"labels": f'{{hostname="{HOST}",gpu="{g}"}}', "value": 1}
                                   for g in (0, 1)]}]}]
    result = _run(tmp_path, tests)
    assert result.returncode == 0, result.stdout + result.stderr

