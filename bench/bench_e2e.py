"""Fault injection to W&B write, end to end, with the demo's intervals, split by stage.

The stack is the demo's (simulator, exporter, real Prometheus with the shipped rules, real
Alertmanager, bridge) writing to the W&B stand-in. For several injected XID 94 faults (no ``for``),
each on its own run, it measures:

* Prometheus: injection -> the alert's ``startsAt`` (scrape + rule evaluation + ``for``);
* Alertmanager: ``startsAt`` -> the bridge durably stored the alert (group wait, dispatch);
* bridge: stored -> the stand-in received the tag/notes mutation (diagnosis, W&B calls).

The baseline of the total is what the configuration alone costs (scrape + evaluation interval +
group wait); the bridge's baseline is one GraphQL round trip to the stand-in, measured in the same
run. Target: the bridge's share under one second.
"""

from __future__ import annotations

import sqlite3
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

import requests

from bench.common import Result, median_seconds
from demo import scenarios
from demo.stack import Stack, StackConfig
from harness.processes import wait_for
from harness.wandb_standin import WandbStandin
from wandb_infra.catalog.alerts import duration_seconds

ROOT = Path(__file__).resolve().parent.parent

REPEATS = 5


def _received_at(store: Path, run_id: str, alertname: str) -> float | None:
    with sqlite3.connect(store) as conn:
        row = conn.execute("SELECT min(received_at) FROM alerts WHERE run_id = ? AND "
                           "alertname = ?", (run_id, alertname)).fetchone()
    return row[0] if row and row[0] else None


def _tagged_at(standin: WandbStandin, since: float, storage_id: str) -> float | None:
    """Monotonic time the stand-in received the bridge's tag write (its clock is monotonic)."""
    for call in standin.calls("BridgeUpsertBucket", since=since):
        variables = call.variables or {}
        if variables.get("id") == storage_id and any(
                t == "infra:GpuContainedEccError" for t in variables.get("tags") or []):
            return call.at
    return None


def _graphql_round_trip(standin: WandbStandin) -> float:
    body = {"query": "query Viewer { viewer { id entity } }", "operationName": "Viewer"}
    return median_seconds(lambda: requests.post(standin.url + "/graphql", json=body, timeout=10,
                                                auth=("api", standin.api_key)), repeat=9)


def _measure_one(stack: Stack, standin: WandbStandin, host: str, index: int) -> dict[str, float]:
    """Inject one XID 94 on a fresh run and time each stage until the W&B tag write."""
    run = scenarios.RunRef("bench", "e2e", f"latency{index}")
    record = standin.add_run(run.entity, run.project, run.run_id)
    job = scenarios.start_job(stack, run, [host], [0, 1])
    try:
        injected, injected_mono = time.time(), time.monotonic()
        stack.cluster.inject("xid", host, gpu=1, code=94)
        store = stack.workdir / "bridge.sqlite"
        tagged_mono = wait_for(lambda: _tagged_at(standin, injected_mono, record.storage_id), 120,
                               "the W&B tag write", 0.05)
        tagged = injected + (tagged_mono - injected_mono)
        received = wait_for(lambda: _received_at(store, run.run_id, "GpuContainedEccError"),
                            10, "the stored alert")
        root = stack.bridge_json(f"/runs/{run.path}")["issues"][0]["root_cause"]
        fired = datetime.fromisoformat(root["starts_at"].replace("Z", "+00:00")).timestamp()
    finally:
        job.stop()
    return {"prometheus": fired - injected, "alertmanager": received - fired,
            "bridge": tagged - received, "total": tagged - injected}


def run() -> list[Result]:
    """Inject ``REPEATS`` faults on separate runs and report median stage latencies."""
    stages: dict[str, list[float]] = {"prometheus": [], "alertmanager": [], "bridge": [],
                                      "total": []}
    with WandbStandin() as standin, tempfile.TemporaryDirectory() as tmp:
        config = StackConfig(workdir=Path(tmp), hosts=REPEATS, wandb_base_url=standin.url,
                             wandb_api_key=standin.api_key, markers=False)
        configured = (2 * config.interval_seconds + duration_seconds(config.group_wait))
        with Stack(config) as stack:
            for index, host in enumerate(stack.cluster.hosts):
                for stage, value in _measure_one(stack, standin, host, index).items():
                    stages[stage].append(value)
        round_trip = _graphql_round_trip(standin)
    med = {k: statistics.median(v) for k, v in stages.items()}
    note = f"median of {REPEATS} XID 94 faults; demo intervals 2s scrape/eval, 2s group_wait"
    return [
        Result("e2e: fault -> W&B write, total", med["total"], "s", configured, None, note=note),
        Result("e2e: Prometheus share (scrape + eval + for)", med["prometheus"], "s",
               2 * config.interval_seconds, None, note=note),
        Result("e2e: Alertmanager share (send + group wait)", med["alertmanager"], "s",
               duration_seconds(config.group_wait), None, note=note),
        Result("e2e: bridge share (stored -> W&B write)", med["bridge"], "s", round_trip, 1.0,
               note="baseline: one GraphQL round trip to the stand-in"),
    ]


if __name__ == "__main__":
    for result in run():
        print(result.as_dict())
