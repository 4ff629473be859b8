"""The store's disk: a real tiny filesystem (tmpfs with size=) that fills up or goes read-only,
and retention keeping the store bounded in every delivery mode.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import requests

from harness.bridge_payloads import T0, TOKEN, alert, make_context, notification, serve
from harness.bridge_process import bridge_env, start_bridge
from harness.clock import ManualClock
from harness.wandb_standin import WandbStandin
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.wandb_client import WandbClient

AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
DAY = 86400.0


@contextlib.contextmanager
def tiny_fs(where: Path, size: str = "2m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (root only); skips the test if mount fails."""
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root/CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(directory: Path) -> Path:
    """Write a file until the filesystem reports ENOSPC."""
    filler = directory / "filler"
    with filler.open("wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass
    return filler


def _post(url: str, body: dict) -> requests.Response:
    return requests.post(url + "/alertmanager", data=json.dumps(body), headers=AUTH, timeout=10)


def _big(run: str, n: int = 50) -> dict:
    return notification([alert("NodeDown", category="node", host=f"{run}-{i}", run=run,
                               annotations={"description": "x" * 2000}) for i in range(n)])


def _ready(url: str) -> int:
    return requests.get(url + "/readyz", timeout=10).status_code


@pytest.mark.integration
def test_full_filesystem_answers_503_then_recovers_by_itself(tmp_path: Path):
    with tiny_fs(tmp_path / "mnt") as mnt:
        ctx = make_context(tmp_path, store=Store(mnt / "bridge.sqlite",
                                                 min_free_bytes=256 * 1024))
        with serve(ctx) as running:
            assert _post(running.url, _big("before", 5)).status_code == 200
            assert _ready(running.url) == 200
            filler = _fill(mnt)
            resp = _post(running.url, _big("during"))
            assert resp.status_code == 503 and resp.headers.get("Retry-After")
            assert _ready(running.url) == 503
            assert ctx.store.alert_count() == 5, "a refused notification stores nothing"
            metrics = requests.get(running.url + "/metrics", timeout=10).text
            assert "wandb_infra_bridge_store_writable 0.0" in metrics
            filler.unlink()
            assert _ready(running.url) == 200
            resp = _post(running.url, _big("during"))
            assert resp.status_code == 200 and resp.json()["new"] == 50
            assert ctx.store.alert_count() == 55


@pytest.mark.integration
def test_read_only_store_answers_503_then_recovers_by_itself(tmp_path: Path):
    """The bridge process (re)started on a store whose filesystem is read-only (a tmpfs cannot
    go read-only while a process holds files open for writing, so the remount happens while the
    bridge is stopped): it serves, answers 503, is not ready, and heals when the disk is back."""
    with tiny_fs(tmp_path / "mnt", "8m") as mnt:
        env = bridge_env(tmp_path, STORE__PATH=str(mnt / "bridge.sqlite"),
                         STORE__MIN_FREE_BYTES="65536")
        bridge = start_bridge(tmp_path, env)
        try:
            assert bridge.post(_big("before", 5)).status_code == 200
        finally:
            assert bridge.stop() == 0
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        bridge = start_bridge(tmp_path, env, port=bridge.port)
        try:
            resp = bridge.post(_big("during"))
            assert resp.status_code == 503 and resp.headers.get("Retry-After")
            assert _ready(bridge.url) == 503
            assert requests.get(bridge.url + "/runs", headers=AUTH, timeout=10).status_code == 503
            subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True)
            assert _ready(bridge.url) == 200
            assert bridge.post(_big("during")).json()["new"] == 50
            assert {r: row["alerts"] for r, row in bridge.runs().items()} == {
                "before": 5, "during": 50}
        finally:
            assert bridge.stop() == 0
        assert "store not writable at start" in bridge.log.read_text()


def _resolved_day(store: Store, day: int, run: str, n: int = 40) -> None:
    start = T0 + timedelta(days=day)
    body = notification([alert("NodeDown", category="node", host=f"d{day}h{i}", run=run,
                               start=start, end=start + timedelta(minutes=10))
                         for i in range(n)])
    store.ingest(parse_notification(json.dumps(body).encode()),
                 start.timestamp())


@pytest.mark.parametrize("mode", ["no-wandb", "delivered", "parked"])
def test_retention_bounds_the_store(tmp_path: Path, mode: str):
    """Ten days of resolved alerts with two days of retention: at most three days stay, whether
    the runs were delivered to W&B, parked (unknown in W&B) or W&B is not configured."""
    clock = ManualClock(T0.timestamp())
    with WandbStandin() as wb:
        store = Store(tmp_path / "bridge.sqlite")
        client = None if mode == "no-wandb" else WandbClient(wb.url, wb.api_key, timeout=5)
        worker = DeliveryWorker(store, client=client, markers=None,
                                links=GrafanaLinks(""), metrics=BridgeMetrics(),
                                policy=DeliveryPolicy(flush_interval=0, retention=2 * DAY),
                                clock=clock, seed=1)
        pages = []
        for day in range(10):
            run = f"day{day}"
            if mode == "delivered":
                wb.add_run("team", "proj", run)
            _resolved_day(store, day, run)
            clock.now = (T0 + timedelta(days=day, hours=2)).timestamp()
            worker.run_once()
            pages.append(store._conn().execute("PRAGMA page_count").fetchone()[0])
            assert store.alert_count() <= 3 * 40, (day, store.alert_count())
        assert store.alert_count() >= 40, "the recent days are kept"
        assert pages[-1] <= 2 * max(pages[:4]), pages


def test_retention_never_drops_what_w_and_b_has_not_received(tmp_path: Path):
    clock = ManualClock(T0.timestamp())
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "late")
        wb.fail(503, times=None)
        store = Store(tmp_path / "bridge.sqlite")
        worker = DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                                markers=None, links=GrafanaLinks(""), metrics=BridgeMetrics(),
                                policy=DeliveryPolicy(flush_interval=0, retention=DAY,
                                                      backoff_max=60),
                                clock=clock, seed=1)
        _resolved_day(store, 0, "late")
        for day in range(1, 6):
            clock.now = (T0 + timedelta(days=day)).timestamp()
            worker.run_once()
        assert store.alert_count() == 40
        wb.clear_faults()
        clock.now += DAY
        worker.run_once()
        assert wb.run("team", "proj", "late").tags == ["infra:NodeDown"]
