"""Ended-run verdicts against a real Prometheus: the demo simulator's exporters and join metrics
through the shipped rules (scaled 60 times faster), three runs ending at once: one clean, one
with a GPU fault (its alerts rebuilt from ALERTS and stored, as Alertmanager would deliver them),
one with a host whose dcgm-exporter left discovery half-way. The delivery worker finds each by
its join series vanishing and writes the verdict to the W&B stand-in."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.simulator.scrape import prometheus_config, target_groups
from demo.stack import scale_rules
from harness.processes import prom_query, prometheus, wait_for
from harness.simulator_process import RemoteCluster, simulator
from harness.wandb_standin import WandbStandin
from wandb_infra.bridge import explain_cli
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.outcome import Outcome
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.prometheus.endings import EndingsPolicy
from wandb_infra.bridge.prometheus.history import as_notification, explain
from wandb_infra.catalog import series
from wandb_infra.common.runkey import RunKey

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
RULE_FILES = sorted((ROOT / "alert_rules").glob("*.rules.yml"))
HOSTS = ("gpu-node-001", "gpu-node-002", "gpu-node-003", "gpu-node-004")
CLEAN, FAULTY, BLIND = (RunKey("team", "proj", name) for name in ("clean", "faulty", "blind"))
USER_NOTES = "my own notes: lr 3e-4, try warmup next\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[tuple[RemoteCluster, str, Path, str]]:
    assert RULE_FILES, "alert_rules/ has no rule files: run make generate"
    workdir = tmp_path_factory.mktemp("endings-prom")
    with simulator(workdir / "sim", len(HOSTS)) as sim:
        cluster, address = sim.cluster, sim.address
        rules = []
        for path in RULE_FILES:
            rules.append(workdir / path.name)
            # 60 times faster, but no alert fires before 20 s: a blind window shorter than
            # that raises no NodeDown, as one shorter than its 2 minutes in production
            rules[-1].write_text(scale_rules(path.read_text(), 1 / 60, minimum_seconds=20))
        sd = workdir / "sd"
        config = prometheus_config(address, cluster.hosts, interval="2s",
                                   rule_files=[str(p) for p in rules], file_sd_dir=sd,
                                   runs_job="runs")
        with prometheus(config, workdir) as prom:
            for expr in (f"count({series.GPU_PRESENT}) == {8 * len(HOSTS)}",
                         f"count({series.TARGET_HOSTS}) == {2 * len(HOSTS)}"):
                wait_for(lambda e=expr: prom_query(prom.url, e), 120, expr, 0.5)
            yield cluster, prom.url, sd, address


def _judged(store: Store, run: RunKey) -> Outcome | None:
    ending = store.ending(run)
    return None if ending is None or ending.outcome is None else Outcome.loads(ending.outcome)


def test_clean_faulty_and_blind_runs_get_their_verdicts_in_wandb(world, tmp_path, capsys):
    cluster, url, sd, address = world
    cluster.assign_run(*CLEAN, [HOSTS[0]])
    cluster.assign_run(*FAULTY, [HOSTS[1]])
    cluster.assign_run(*BLIND, [HOSTS[2], HOSTS[3]])
    started = time.time()
    for run in (CLEAN, FAULTY, BLIND):
        wait_for(lambda r=run: prom_query(url, f'wandb_run_node_info{{wandb_run_id="{r.run_id}"}}'),
                 30, f"{run.run_id} published", 0.5)
    time.sleep(6)
    # half-way: gpu-node-004's dcgm-exporter leaves discovery (node_exporter stays)
    (sd / "dcgm.json").write_text(json.dumps(target_groups(address, HOSTS[:3], "dcgm")))
    cluster.inject("xid", HOSTS[1], gpu=3, code=94)
    store = Store(tmp_path / "bridge.sqlite")

    def faulty_alerts() -> list | None:
        found = explain(PrometheusClient(url), FAULTY, started - 60, time.time(),
                        min_step=2.0)
        return found.alerts or None

    alerts = wait_for(faulty_alerts, 90, "an alert on the faulty run in ALERTS", 1.0)
    store.ingest(as_notification(alerts))  # what Alertmanager would have delivered
    wait_for(lambda: not prom_query(url, f'up{{instance="{HOSTS[3]}:9400"}}'), 30,
             "gpu-node-004's dcgm target gone", 0.5)
    time.sleep(4)
    for run in (CLEAN, FAULTY, BLIND):
        cluster.end_run(*run)
    (sd / "dcgm.json").write_text(json.dumps(target_groups(address, HOSTS, "dcgm")))
    cluster.clear(HOSTS[1], gpu=3, kind="xid")

    with WandbStandin() as wb:
        for run, state in ((CLEAN, "crashed"), (FAULTY, "crashed"), (BLIND, "failed")):
            wb.add_run(*run, state=state, notes=USER_NOTES, tags=["baseline"])
        worker = DeliveryWorker(
            store, client=WandbClient(wb.url, wb.api_key, timeout=10), markers=None,
            links=GrafanaLinks(""), metrics=BridgeMetrics(),
            prometheus=PrometheusClient(url),
            policy=DeliveryPolicy(flush_interval=0.0, node_state_refresh=0,
                                  endings=EndingsPolicy(grace=6, interval=1, lookback=600,
                                                        max_run=900, step=2)))

        def all_written() -> bool | None:
            worker.run_once()
            return all(wb.run(*r).summary.get("infra/verdict") for r in (CLEAN, FAULTY, BLIND)
                       ) or None

        wait_for(all_written, 90, "verdicts written to W&B", 1.0)
        records = {r: wb.run(*r) for r in (CLEAN, FAULTY, BLIND)}
        upserts = len(wb.calls("BridgeUpsertBucket"))

    clean, faulty, blind = (_judged(store, r) for r in (CLEAN, FAULTY, BLIND))
    assert clean is not None and clean.verdict == "clear", clean
    assert clean.coverage is not None and clean.coverage.hosts == (HOSTS[0],)
    assert clean.text.startswith("no GPU, node or link fault on its 1 host and 8 GPUs on ")
    assert "likely an application problem" in clean.text
    assert faulty is not None and faulty.verdict == "infrastructure", faulty
    assert "GpuContainedEccError" in faulty.text
    assert blind is not None and blind.verdict == "incomplete", blind
    assert blind.coverage is not None and blind.coverage.hosts == HOSTS[2:]
    assert [b.host for b in blind.coverage.blind] == [HOSTS[3]]
    assert blind.coverage.blind[0].what == "GPU telemetry"
    assert f"no GPU telemetry from {HOSTS[3]} from " in blind.text
    assert blind.text.endswith("a fault there would not have been seen")

    for run, want in ((CLEAN, "clear"), (FAULTY, "infrastructure"), (BLIND, "incomplete")):
        rec = records[run]
        assert rec.summary["infra/verdict"] == want
        assert rec.summary["infra/coverage"].startswith("seen through: dcgm-exporter and "
                                                        "node_exporter of ")
        assert rec.notes.startswith(USER_NOTES)  # the user's words kept byte for byte
        assert f"**Verdict: {want}**" in rec.notes
        assert "baseline" in rec.tags
    assert "infra:GpuContainedEccError" in records[FAULTY].tags
    assert records[CLEAN].tags == ["baseline"]  # nothing added to a clear run's tags
    assert records[FAULTY].notes.count("Seen through") >= 2  # the verdict and the issue
    assert upserts <= 6  # one projection per run (plus at most one re-check each)

    # explain, for a bridge installed after the runs ended, gives the same verdicts
    capsys.readouterr()
    for run, judged in ((CLEAN, clean), (BLIND, blind)):
        view = _explain(run, url, capsys)
        assert view["verdict"]["verdict"] == judged.verdict
        assert [b[0] for b in view["verdict"]["coverage"]["blind"]] == \
            [b.host for b in judged.coverage.blind]


def _explain(run: RunKey, url: str, capsys) -> dict:
    """``explain --json``'s view, with the grace the worker above uses (6 s); the text explain
    prints without ``--json`` says the same verdict and issues."""
    capsys.readouterr()
    args = argparse.Namespace(run=run.path(), prometheus=url, start=None, end=None,
                              lookback="1h", step=2.0, grafana_url="", json=True, post=False,
                              config=None, timeout=10.0, grace=6.0, log=None)
    assert explain_cli.run(args) == 0
    view = json.loads(capsys.readouterr().out)
    args.json = False
    assert explain_cli.run(args) == 0
    text, verdict = capsys.readouterr().out, view["verdict"]
    assert (f"Verdict: {verdict['verdict']}: " if verdict else "Verdict: none yet: ") in text
    assert f"Run {run.path()}: {len(view['issues'])} infrastructure issue(s)" in text
    return view


def test_explain_gives_a_running_run_no_ended_run_verdict(world, capsys):
    """A run whose join series are still published has not ended: no clear, incomplete or
    infrastructure verdict, but its issues and placement as usual."""
    cluster, url, _sd, _address = world
    running = RunKey("team", "proj", "still-running")
    cluster.assign_run(*running, [HOSTS[0]])
    try:
        wait_for(lambda: prom_query(url, f'wandb_run_node_info{{wandb_run_id="{running.run_id}"}}'),
                 30, f"{running.run_id} published", 0.5)
        time.sleep(4)
        view = _explain(running, url, capsys)
        assert view["verdict"] is None
        assert "still running" in view["running"]
        assert view["placement"]["hosts"] == [HOSTS[0]]
    finally:
        cluster.end_run(*running)
