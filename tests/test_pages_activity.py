"""The activity plot's PromQL against a real Prometheus: the run's GPUs from the join
metrics, both dcgm-exporter host-label spellings, other GPUs and hosts left out, utilisation
scaled from percent; and the incident window."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiohttp import web

from harness.bridge_payloads import serve_app
from harness.processes import PROMETHEUS, prom_query, prometheus, wait_for
from wandb_infra.bridge.diagnosis.root_cause import AlertFact, Issue, diagnose
from wandb_infra.bridge.prometheus import activity
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.common.runkey import RunKey

RUN = RunKey("team", "proj", "act1")
JOIN = 'wandb_entity="team",wandb_project="proj",wandb_run_id="act1"'
# (host label, host, gpu, tensor activity, utilisation %); the run holds GPUs 0-1 of hostA and
# GPU 0 of hostB (an older dcgm-exporter: "Hostname"); GPU 7 and hostC are someone else's.
DCGM = [("hostname", "hostA", "0", 0.6, 90), ("hostname", "hostA", "1", 0.2, 70),
        ("Hostname", "hostB", "0", 0.4, 50), ("Hostname", "hostB", "7", 1.0, 100),
        ("hostname", "hostC", "0", 1.0, 100)]
EXPOSITION = "\n".join(
    [f'wandb_run_node_info{{{JOIN},hostname="{h}"}} 1' for h in ("hostA", "hostB")]
    + [f'wandb_run_gpu_info{{{JOIN},hostname="{h}",gpu="{g}"}} 1'
       for h, g in (("hostA", "0"), ("hostA", "1"), ("hostB", "0"))]
    + [f'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{k}="{h}",gpu="{g}"}} {v}' for k, h, g, v, _ in DCGM]
    + [f'DCGM_FI_DEV_GPU_UTIL{{{k}="{h}",gpu="{g}"}} {u}' for k, h, g, _, u in DCGM]) + "\n"

pytestmark = pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="needs prometheus")


async def _metrics(_request: web.Request) -> web.Response:
    return web.Response(text=EXPOSITION, content_type="text/plain")


@pytest.mark.integration
def test_activity_averages_the_runs_gpus_in_real_prometheus(tmp_path):
    app = web.Application()
    app.router.add_get("/metrics", _metrics)
    with serve_app(app) as target:
        config = ("global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: fake\n"
                  f"    static_configs: [{{targets: ['{target.removeprefix('http://')}']}}]\n")
        with prometheus(config, tmp_path / "prom") as prom:
            wait_for(lambda: prom_query(prom.url, "count_over_time(wandb_run_gpu_info[1m]) >= 4"),
                     60, "four scrapes of the join metrics", 0.5)
            now = time.time()
            issues = [_issue(datetime.fromtimestamp(now - 140, UTC), None, [0])]
            found = activity.read(PrometheusClient(prom.url, 5.0), RUN, issues, now)
            missing = activity.read(PrometheusClient(prom.url, 5.0),
                                    RunKey("team", "proj", "nope"), issues, now)
    assert found.note == "" and found.read_at == now
    series = {name: [v for _, v in points] for name, points in found.series}
    assert series["tensor activity"] and all(abs(v - 0.4) < 1e-9
                                             for v in series["tensor activity"])
    assert all(abs(v - 0.7) < 1e-9 for v in series["GPU utilisation"])
    assert found.gpus == 3
    assert missing.note.startswith("No GPU activity plot: no wandb_run_node_info series")
    assert activity.Activity.from_dict(found.as_dict()) == found  # as stored


def _issue(start: datetime, end: datetime | None, onsets: list[int]) -> Issue:
    facts = [AlertFact(f"f{n}", "GpuXidError" if n == 0 else "TrainingStalled",
                       start + timedelta(seconds=at), end, "critical", "gpu_hardware", f"h{n}")
             for n, at in enumerate(onsets)]
    return diagnose(facts).issues[0]


def test_window_pads_a_resolved_issue_and_caps_an_old_open_one():
    start_at = datetime(2027, 1, 15, 8, tzinfo=UTC)
    issue_start = start_at.timestamp()
    resolved = _issue(start_at, start_at + timedelta(minutes=20), [0])
    start, end = activity.window([resolved], now=issue_start + 2 * 86400)
    assert (start, end) == (issue_start - 300, issue_start + 1200 + 300)
    still = _issue(start_at, None, [0, 60])
    start, end = activity.window([still], now=issue_start + 7 * 86400)
    assert end == issue_start + 60 + activity.OPEN_TAIL + (60 + activity.OPEN_TAIL) * 0.25
    start, end = activity.window([still], now=issue_start + 90)
    assert end == issue_start + 90  # never past now
