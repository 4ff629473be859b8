"""The run's own throughput or MFU in the impact line: the delivery worker reads the
run's W&B history (the stand-in's ``sampledHistory``) around each issue's onset; a run whose
logged mfu fell gets that named, a run logging none of the keys keeps the GPU-signal impact."""

from __future__ import annotations

import json

import pytest
import requests

from harness.bridge_payloads import T0, cascade, notification
from harness.wandb_standin import WandbStandin
from wandb_infra.bridge import config as C
from wandb_infra.bridge.diagnosis.impact import NONE, Impact
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.root_cause import Diagnosis
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.wandb_client import RUN_METRICS, STEP_SAMPLES, WandbClient
from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.runkey import RunKey

NOW = T0.timestamp() + 300


def _log(wb: WandbStandin, run: str, rows: list[dict]) -> None:
    """Append history rows through ``file_stream``, as the wandb SDK does."""
    resp = requests.post(f"{wb.url}/files/team/proj/{run}/file_stream", timeout=5,
                         auth=("api", wb.api_key),
                         json={"files": {"wandb-history.jsonl": {
                             "offset": 0, "content": [json.dumps(r) for r in rows]}}})
    assert resp.status_code == 200, resp.text


class _Flat:
    """The impact reader as the worker sees it: the run's 16 GPUs showed no change."""

    def for_diagnosis(self, _run: RunKey, diagnosis: Diagnosis,
                      _state: str | None = None) -> dict[str, Impact]:
        return {i.key: Impact(NONE, "no change in the run's GPU activity (tensor activity, "
                              "11:50:00 to 12:05:00)", i.root.onset.timestamp(), "", NOW, "now",
                              16, 0.0, 0.0, None, "tensor activity")
                for i in diagnosis.issues}


@pytest.fixture
def wb():
    with WandbStandin() as server:
        for run in ("mfu", "lossonly"):
            server.add_run("team", "proj", run)
        yield server


def _deliver(tmp_path, wb: WandbStandin, run: str,
             policy: DeliveryPolicy | None = None) -> tuple[DeliveryWorker, str]:
    store = Store(tmp_path / "bridge.sqlite")
    worker = DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                            markers=None, links=GrafanaLinks("https://grafana.example"),
                            metrics=BridgeMetrics(),
                            policy=policy or DeliveryPolicy(flush_interval=0),
                            clock=lambda: NOW, seed=1)
    worker.projector.impact = _Flat()  # type: ignore[assignment]
    body = json.dumps(notification(cascade(hosts=2, gpus=1, run=run))).encode()
    store.ingest(parse_notification(body), T0.timestamp() + 60)
    assert worker.run_once() == 1
    return worker, wb.run("team", "proj", run).notes


def _mfu_rows(start: float = -300.0, every: float = 5.0, count: int = 120) -> list[dict]:
    """mfu 0.42 falling to 0.29 (31 %) 20 s before T0, logged every ``every`` seconds."""
    rows = []
    for i in range(count):
        at = T0.timestamp() + start + every * i
        rows.append({"loss": 1.0, "mfu": 0.29 if at >= T0.timestamp() - 20 else 0.42,
                     "_timestamp": at})
    return rows


def test_a_run_whose_logged_mfu_fell_gets_it_named(tmp_path, wb):
    _log(wb, "mfu", _mfu_rows())
    worker, notes = _deliver(tmp_path, wb, "mfu")
    assert "- Impact on this run (measured): Slowdown of 31%: the run's own mfu fell 31% at " \
           "11:59:40, 20 s before the alert" in notes, notes
    assert "the run's own mfu changed then" in notes
    [first, *_] = _metric_reads(wb)
    assert [s["keys"][-1] for s in first] == ["mfu", "throughput", "tokens_per_s",
                                              "samples_per_s"]
    # the issue is open, so the window is read again only after STEP_RETRY: the next
    # projection in between costs no history read
    reads = len(_metric_reads(wb))
    body = json.dumps(notification(cascade(hosts=3, gpus=1, run="mfu"))).encode()
    worker.store.ingest(parse_notification(body), T0.timestamp() + 90)
    assert worker.run_once() == 1
    assert len(_metric_reads(wb)) == reads


def _metric_reads(wb: WandbStandin) -> list[list[dict]]:
    """The specs of each history read asking for a run metric (not the step lookups)."""
    reads = [[json.loads(s) for s in c.variables["specs"]]
             for c in wb.calls("BridgeSampledHistory") if c.variables]
    return [specs for specs in reads if not any(s["keys"][-1] in ("_timestamp", "infra/issue")
                                                for s in specs)]

def test_a_run_logging_none_of_the_keys_keeps_the_gpu_signal_impact(tmp_path, wb):
    _log(wb, "lossonly", [{"loss": 1.0 - i / 200, "_timestamp": T0.timestamp() - 300 + 5 * i}
                          for i in range(120)])
    _, notes = _deliver(tmp_path, wb, "lossonly")
    assert "- Impact on this run (measured): No visible effect: no change in the run's GPU " \
           "activity (tensor activity" in notes, notes
    assert "own" not in notes


def test_the_configured_keys_are_the_ones_read(tmp_path, wb):
    _log(wb, "mfu", _mfu_rows())
    _, notes = _deliver(tmp_path, wb, "mfu", DeliveryPolicy(flush_interval=0,
                                                            run_metrics=("tokens_per_s",)))
    assert "No visible effect" in notes and "own mfu" not in notes
    reads = len(_metric_reads(wb))
    (tmp_path / "off").mkdir()
    _, off = _deliver(tmp_path / "off", wb, "lossonly", DeliveryPolicy(flush_interval=0,
                                                                       run_metrics=()))
    assert "No visible effect" in off and len(_metric_reads(wb)) == reads

def test_a_long_history_is_narrowed_around_the_window(wb):
    rows = _mfu_rows(start=-3 * STEP_SAMPLES, every=1.0, count=3 * STEP_SAMPLES + 300)
    _log(wb, "mfu", rows)
    client = WandbClient(wb.url, wb.api_key, timeout=5)
    lo, hi = T0.timestamp() - 600, T0.timestamp() + 200
    got = client.run_metrics("team", "proj", "mfu", ("mfu",), {"issue": (lo, hi)})["issue"]
    assert got.name == "mfu" and len(got.points) == 801  # every row of the window, none thinned
    [*_, [last]] = _metric_reads(wb)
    assert last["maxStep"] - last["minStep"] < STEP_SAMPLES


@pytest.mark.parametrize("value", ["mfu", ["mfu", 3], ["_step"], [""], [" mfu"]])
def test_the_run_metrics_option_is_validated(value):
    raw = {s: dict(v) if isinstance(v, dict) else v for s, v in C.DEFAULTS.items()}
    assert C.build_config(raw, {}, insecure_no_auth=True).policy.run_metrics == RUN_METRICS
    raw["wandb"]["run_metrics"] = value
    with pytest.raises(ConfigError, match=r"wandb\.run_metrics: must be a list of history keys"):
        C.build_config(raw, {}, insecure_no_auth=True)
