"""bridge/projection/markers.py: the marker writer, with the real ``wandb`` SDK against the W&B
stand-in (harness/wandb_standin.py, which merges config by top-level key as a server may). The
writer leaves the trainer's config (its ``_wandb`` metric definitions and writer environments)
and state alone, places a marker on the run's own step metric where the run logs one, and no
history key it writes is a summary key the bridge writes."""

from __future__ import annotations

import base64
import gzip
import json

import pytest
import requests
import wandb

from harness.bridge_payloads import T0, alert, notification
from harness.clock import ManualClock
from harness.wandb_standin import WandbStandin
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.markers import (
    HistoryOnlyProxy,
    RunAxis,
    SdkMarkerWriter,
    without_config,
)
from wandb_infra.bridge.projection.wandb_client import STEP_METRICS, WandbClient
from wandb_infra.catalog.vocabulary import MARKER_ALERT, MARKER_ISSUE, MARKER_KEYS
from wandb_infra.common.runkey import RunKey

RUN = RunKey("team", "proj", "r1")
# What a trainer's SDK keeps under _wandb: its define_metric axes ("m") and its writers'
# environments ("e", which the exporter's W&B source reads to place the run).
TRAINER_CONFIG = {"lr": {"value": 0.1}, "_wandb": {"value": {
    "m": [{"1": "trainer/global_step", "6": [3]}], "e": {"w1": {"host": "gpu01"}},
    "cli_version": "0.19.0"}}}


def test_only_the_upsert_bucket_config_is_removed():
    upsert = {"query": "mutation UpsertBucket($config: JSONString) { upsertBucket(input: "
                       "{config: $config}) { bucket { id } } }",
              "variables": {"name": "r1", "config": '{"_wandb": {}}'}}
    body, stripped = without_config(json.dumps(upsert).encode())
    assert stripped and json.loads(body)["variables"] == {"name": "r1"}
    viewer = json.dumps({"query": "query Viewer { viewer { id } }", "variables": {}}).encode()
    assert without_config(viewer) == (viewer, False)
    assert without_config(b"not json") == (b"not json", False)


@pytest.fixture
def wb():
    with WandbStandin() as server:
        server.add_run("team", "proj", "r1", config=TRAINER_CONFIG, tags=["mine"],
                       notes="My notes.", summary={"loss": 0.5})
        yield server
    wandb.teardown()


def _log(wb, rows: list[dict]) -> None:
    """Append the trainer's history rows through file_stream, as its SDK does."""
    resp = requests.post(f"{wb.url}/files/team/proj/r1/file_stream", timeout=5,
                         auth=("api", wb.api_key), json={"files": {"wandb-history.jsonl": {
                             "offset": 0, "content": [json.dumps(r) for r in rows]}}})
    assert resp.status_code == 200, resp.text


@pytest.mark.integration
def test_the_sdk_session_leaves_the_trainers_config_and_state_alone(wb, tmp_path):
    writer = SdkMarkerWriter(wb.url, wb.api_key, tmp_path / "markers")
    writer.write(RUN, [{MARKER_ISSUE: 1, MARKER_ALERT: "GpuXidError",
                        "_timestamp": T0.timestamp()}])
    run = wb.run(*RUN)
    assert run.config == TRAINER_CONFIG
    assert (run.state, run.tags, run.notes, run.summary) == (
        "running", ["mine"], "My notes.", {"loss": 0.5})
    assert [(r[MARKER_ISSUE], r["_timestamp"]) for r in run.history] == [(1, T0.timestamp())]
    upserts = wb.calls(operation="UpsertBucket")
    assert upserts and not [c for c in upserts if (c.variables or {}).get("config")]


@pytest.mark.integration
def test_a_marker_carries_the_runs_own_step_metric_at_its_time(wb, tmp_path):
    """The trainer logs trainer/global_step every 10 s (steps 100, 110, ...): a marker at
    +25 s carries 120, the value the run had then, so charts against that metric place it."""
    start = T0.timestamp()
    _log(wb, [{"loss": 1.0, "trainer/global_step": 100 + 10 * i, "_timestamp": start + 10 * i}
              for i in range(6)])
    client = WandbClient(wb.url, wb.api_key, timeout=5)
    axis = RunAxis(client, STEP_METRICS)
    assert axis(RUN, start + 25) == {"trainer/global_step": 120}
    assert RunAxis(client, ["global_step"])(RUN, start + 25) == {}, "a key the run never logs"
    writer = SdkMarkerWriter(wb.url, wb.api_key, tmp_path / "markers", axis=axis)
    writer.write(RUN, [{MARKER_ISSUE: 1, "_timestamp": start + 25}])
    (marker,) = [r for r in wb.run(*RUN).history if MARKER_ISSUE in r]
    assert marker["trainer/global_step"] == 120 and marker["_timestamp"] == start + 25


@pytest.mark.integration
def test_no_history_key_is_a_summary_key_the_bridge_writes(wb, tmp_path):
    """An issue on a run that then ended: the bridge writes its marker row and, once the run
    ended, its summary entries, and the two sets of names are disjoint."""
    clock = ManualClock(1_800_000_000.0)
    store = Store(tmp_path / "bridge.sqlite")
    worker = DeliveryWorker(
        store, client=WandbClient(wb.url, wb.api_key, timeout=5),
        markers=SdkMarkerWriter(wb.url, wb.api_key, tmp_path / "markers"),
        links=GrafanaLinks(""), metrics=BridgeMetrics(),
        policy=DeliveryPolicy(flush_interval=0, marker_settle=60), clock=clock, seed=1)
    store.ingest(parse_notification(json.dumps(notification([alert(
        "GpuXidError", category="gpu_hardware", host="h1", gpu="2", run="r1",
        start=T0)])).encode()))
    worker.run_once()
    clock.now += 61
    worker.run_once()
    wb.set_state(*RUN, "finished")
    clock.now += 400  # past wandb.state_check_interval_seconds: the end is seen
    worker.run_once()
    run = wb.run(*RUN)
    history = {k for row in run.history for k in row if not k.startswith("_")}
    summary = {k for k in run.summary if k.startswith("infra/")}
    assert MARKER_ISSUE in history and "infra/root_cause" in summary, (history, summary)
    assert history <= set(MARKER_KEYS)
    assert not history & summary


@pytest.mark.integration
def test_a_gzipped_upsert_loses_its_config_too(wb):
    """The proxy reads a gzipped body too (and forwards it plain, without the header)."""
    upsert = {"query": "mutation UpsertBucket($name: String, $project: String, $entity: String,"
                       " $config: JSONString) { upsertBucket(input: {name: $name, modelName: "
                       "$project, entityName: $entity, config: $config}) { bucket { id } } }",
              "operationName": "UpsertBucket",
              "variables": {"name": "r1", "project": "proj", "entity": "team",
                            "config": json.dumps({"_wandb": {"value": {"m": []}}})}}
    key = base64.b64encode(f"api:{wb.api_key}".encode()).decode()
    proxy = HistoryOnlyProxy(wb.url).start()
    try:
        status, _, content = proxy.forward(
            "POST", "/graphql", {"Content-Encoding": "gzip", "Authorization": f"Basic {key}",
                                 "Content-Type": "application/json"},
            gzip.compress(json.dumps(upsert).encode()))
    finally:
        proxy.stop()
    assert status == 200, content
    assert proxy.stripped == 1
    assert wb.run(*RUN).config == TRAINER_CONFIG
