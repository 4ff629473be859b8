"""A verdict is final only when two witnesses say the run ended, against a real Prometheus that
scrapes the join metric from a target the test switches on and off, and the W&B stand-in.

Before: the join series' absence alone (asked at the bridge's clock) ended a run for good. An
exporter outage longer than the grace gave a live run a verdict that was never withdrawn, and a
bridge clock running ahead of Prometheus by more than the grace ended every live run."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.bridge_process import BRIDGE_CLI, ROOT, bridge_env, start_bridge
from harness.processes import prom_query, prometheus, scrape_target, wait_for
from harness.wandb_standin import WandbStandin
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.outcome import Outcome
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.prometheus.endings import EndingsPass, EndingsPolicy
from wandb_infra.common.runkey import RunKey

pytestmark = pytest.mark.integration

LIVE, ENDS = RunKey("team", "proj", "live"), RunKey("team", "proj", "ends")
EMOJI = RunKey("team\U0001f600", "proj\U0001f680", "emoji")  # outside the BMP: accepted names
GRACE = 4.0
published = {LIVE: True, ENDS: True, EMOJI: True}


def _text() -> str:
    lines = ["# TYPE wandb_run_node_info gauge"]
    lines += [f'wandb_run_node_info{{wandb_entity="{run.entity}",'
              f'wandb_project="{run.project}",wandb_run_id="{run.run_id}",'
              f'hostname="gpu-{run.run_id}"}} 1' for run, shown in published.items() if shown]
    return "\n".join(lines) + "\n"


@pytest.fixture
def prom(tmp_path) -> Iterator[str]:
    published.update({LIVE: True, ENDS: True, EMOJI: True})
    with scrape_target(_text) as target:
        config = ("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: exporter\n"
                  "    honor_labels: true\n    static_configs:\n"
                  f"      - targets: ['{target}']\n")
        with prometheus(config, tmp_path / "prom") as running:
            wait_for(lambda: prom_query(running.url, "count_over_time(wandb_run_node_info"
                                                     '{wandb_run_id="live"}[1m]) >= 3'),
                     60, "three scrapes of the join")
            yield running.url


def _endings(store: Store, prom: str, wb: WandbStandin | None) -> EndingsPass:
    worker = DeliveryWorker(
        store, client=None if wb is None else WandbClient(wb.url, wb.api_key, timeout=5),
        markers=None, links=GrafanaLinks(""), metrics=BridgeMetrics(),
        prometheus=PrometheusClient(prom),
        policy=DeliveryPolicy(flush_interval=0, node_state_refresh=0,
                              endings=EndingsPolicy(grace=GRACE, interval=0.5, lookback=7200,
                                                    max_run=600, step=1)))
    assert worker.endings is not None
    return worker.endings


def _verdict(store: Store, run: RunKey) -> Any:
    ending = store.ending(run)
    return None if ending is None or ending.outcome is None else Outcome.loads(ending.outcome)


def _passes(endings: EndingsPass, seconds: float, clock: float = 0.0) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        endings.run(time.time() + clock)
        time.sleep(0.5)


def test_an_exporter_outage_gives_a_live_run_no_verdict_and_its_ending_is_withdrawn(
        prom, tmp_path):
    store = Store(tmp_path / "bridge.sqlite")
    with WandbStandin() as wb:
        wb.add_run(*LIVE, state="running")
        wb.add_run(*ENDS, state="running")
        endings = _endings(store, prom, wb)
        published.update({LIVE: False, ENDS: False})  # the exporter is down for 3 x the grace
        _passes(endings, 3 * GRACE)
        assert store.ending(LIVE) is not None  # the join series said so...
        assert _verdict(store, LIVE) is None  # ...but W&B says it runs: no verdict
        wb.set_state(*ENDS, "finished")  # this one really ended
        wait_for(lambda: _passes(endings, 1) or _verdict(store, ENDS), 20, "ENDS judged")
        published[LIVE] = True  # the exporter is back
        wait_for(lambda: _passes(endings, 1) or store.ending(LIVE) is None, 20,
                 "LIVE's ending withdrawn")
        _passes(endings, 2)
        assert _verdict(store, LIVE) is None and store.ending(LIVE) is None
        judged = _verdict(store, ENDS)
        assert judged.how == "join series gone and W&B state finished"
        assert endings.withdrawn == 1


def test_without_wandb_a_one_witness_verdict_is_withdrawn_when_the_run_reappears(
        prom, tmp_path):
    store = Store(tmp_path / "bridge.sqlite")
    endings = _endings(store, prom, None)
    published.update({LIVE: False, EMOJI: False})
    wait_for(lambda: _passes(endings, 1) or _verdict(store, LIVE), 30, "a provisional verdict")
    # a name outside the Basic Multilingual Plane gets its verdict too (before: PromQL refused
    # the JSON surrogate escapes of its placement query, and it never got one)
    wait_for(lambda: _passes(endings, 1) or _verdict(store, EMOJI), 30, "the emoji run's verdict")
    published[LIVE] = True
    wait_for(lambda: _passes(endings, 1) or store.ending(LIVE) is None, 20, "withdrawn")


def test_a_bridge_clock_ahead_of_prometheus_ends_no_live_run(prom, tmp_path):
    store = Store(tmp_path / "bridge.sqlite")
    endings = _endings(store, prom, None)
    _passes(endings, 3, clock=600.0)  # the bridge's clock 10 minutes ahead
    assert store.ending(LIVE) is None and store.ending(ENDS) is None


def test_explain_post_ends_in_one_clear_line_when_the_store_is_held(prom, tmp_path):
    """``explain --post`` on a store a running bridge holds (the documented one-bridge-per-store
    lock): before, a traceback; now one line and exit 1, nothing written."""
    with WandbStandin() as wb:
        wb.add_run(*LIVE)
        env = bridge_env(tmp_path, wandb_url=wb.url, wandb_key=wb.api_key)
        bridge = start_bridge(tmp_path, env)
        try:
            done = subprocess.run(
                [*BRIDGE_CLI, "explain", LIVE.path(), "--prometheus", prom, "--post",
                 "--lookback", "10m", "--step", "1", "--timeout", "5"], cwd=ROOT, env=env,
                capture_output=True, text=True, timeout=120, check=False)
        finally:
            bridge.stop()
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("wandb-infra-bridge explain")]
    assert "cannot post" in line and "store" in line
    assert wb.calls("BridgeUpsertBucket") == []
