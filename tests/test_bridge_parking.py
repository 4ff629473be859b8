"""Nothing one client sends stops the bridge.

Poison that got past the door (a store written by an older version, or a bug in rendering) parks
its own run with the reason, in /runs and /metrics, while every other run keeps being delivered;
the door itself now refuses the inputs that used to become poison.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime

import pytest
import requests
from prometheus_client import generate_latest

from harness.bridge_payloads import TOKEN, alert, make_context, notification, serve
from harness.clock import ManualClock
from harness.processes import wait_for
from harness.wandb_standin import WandbStandin
from tests.test_bridge_delivery import ingest, make_worker
from wandb_infra.bridge.ingest.payload import Alert, Notification
from wandb_infra.bridge.runs import service
from wandb_infra.common.runkey import RunKey

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def wb():
    with WandbStandin() as server:
        for run_id in ("good", "poison", "late"):
            server.add_run("team", "proj", run_id)
        yield server


def _stored_as_is(store, raw: dict, starts_at: datetime, ends_at: datetime | None) -> None:
    """Store an alert without the door's checks (as an older bridge did)."""
    item = Alert(raw["fingerprint"], raw["status"], starts_at, ends_at, raw["labels"],
                 raw["annotations"])
    store.ingest(Notification("r", raw["status"], [item], "{}", 0))


def _poison_year_0999(store) -> None:
    """The row an older bridge wrote for startsAt 0999-...: an unpadded year it cannot read."""
    raw = alert("NodeDown", category="node", host="h9", run="poison")
    _stored_as_is(store, raw, datetime(2026, 1, 1, tzinfo=UTC), None)
    with sqlite3.connect(store.path) as conn:
        conn.execute("UPDATE alerts SET starts_at='999-01-01T00:00:00.000000Z' WHERE run_id=?",
                     ("poison",))


def _metric(worker, name: str) -> float:
    text = generate_latest(worker.metrics.registry).decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name))


@pytest.mark.parametrize("poison", ["panel_id", "year_9999", "year_0999"])
def test_poison_run_is_parked_with_its_reason_and_others_are_delivered(tmp_path, wb, poison):
    clock = ManualClock(1_800_000_000.0)
    store, worker = make_worker(tmp_path, wb, clock=clock)
    if poison == "panel_id":
        raw = alert("NodeDown", category="node", host="h9", run="poison",
                    annotations={"summary": "s", "panel_id": "\u00b2"})
        _stored_as_is(store, raw, datetime(2026, 1, 1, tzinfo=UTC), None)
    elif poison == "year_9999":
        raw = alert("NodeDown", category="node", host="h9", run="poison")
        raw["status"] = "resolved"
        end = datetime(9999, 12, 31, 23, 59, tzinfo=UTC)
        _stored_as_is(store, raw, datetime(9999, 12, 31, 23, 0, tzinfo=UTC), end)
    else:
        _poison_year_0999(store)
    clock.now += 1
    ingest(store, [alert("NodeDown", category="node", host="h1", run="good")], clock.now)

    assert worker.run_once() == 2  # the poison run is handled (parked), the good one delivered
    assert wb.run("team", "proj", "good").tags == ["infra:NodeDown"]
    [parked] = store.parked()
    assert parked.run == RunKey("team", "proj", "poison")
    assert parked.parked.startswith("internal error: ")
    assert _metric(worker, "wandb_infra_bridge_parked_runs") == 1
    assert _metric(worker, "wandb_infra_bridge_delivery_errors_total{") == 1

    # Later runs keep flowing; the parked one is not retried and does not age the backlog.
    clock.now += 120  # within the state-check interval: only "late" is due
    ingest(store, [alert("NodeDown", category="node", host="h2", run="late")], clock.now)
    assert worker.run_once() == 1
    assert wb.run("team", "proj", "late").tags == ["infra:NodeDown"]
    assert _metric(worker, "wandb_infra_bridge_oldest_undelivered_seconds") == 0
    assert _metric(worker, "wandb_infra_bridge_queue_runs") == 0


def test_the_delivery_thread_keeps_delivering_behind_a_poison_run(tmp_path, wb):
    clock = ManualClock(1_800_000_000.0)
    store, worker = make_worker(tmp_path, wb, clock=clock)
    raw = alert("NodeDown", category="node", host="h9", run="poison",
                annotations={"summary": "s", "panel_id": "\u00b2"})
    _stored_as_is(store, raw, datetime(2026, 1, 1, tzinfo=UTC), None)  # oldest: due first
    worker.start()
    try:
        for n, run_id in enumerate(("good", "late"), start=1):
            clock.now += 1
            ingest(store, [alert("NodeDown", category="node", host=f"h{n}", run=run_id)],
                   clock.now)
            worker.wake()
            wait_for(lambda r=run_id: wb.run("team", "proj", r).tags == ["infra:NodeDown"], 10,
                     what=f"{run_id} delivered")
    finally:
        worker.stop()
    with serve(make_context(tmp_path / "pages", store=store)) as running:
        rows = requests.get(running.url + "/runs?format=json", headers=AUTH, timeout=10).json()
    poison = next(r for r in rows["runs"] if r["run_id"] == "poison")
    assert poison["wandb"]["state"] == "parked"
    assert poison["wandb"]["reason"].startswith("internal error: ValueError")


def test_oldest_undelivered_ignores_parked_runs(tmp_path, wb):
    clock = ManualClock(1_800_000_000.0)
    store, worker = make_worker(tmp_path, wb, clock=clock)
    ingest(store, [alert("NodeDown", category="node", host="h1", run="ghost")], clock.now)
    worker.run_once()  # not found in W&B: parked
    assert len(store.parked()) == 1
    clock.now += 240  # before the parked run's first retry (5 minutes)
    worker.run_once()
    assert _metric(worker, "wandb_infra_bridge_queue_runs") == 0
    assert _metric(worker, "wandb_infra_bridge_oldest_undelivered_seconds") == 0
    assert store.queue_stats(clock.now).oldest_pending_age == 0


def test_runs_pages_show_an_unreadable_run_instead_of_failing(tmp_path):
    ctx = make_context(tmp_path)
    _poison_year_0999(ctx.store)
    with serve(ctx) as running:
        good = notification([alert("NodeDown", category="node", host="h1", run="good")])
        assert requests.post(running.url + "/alertmanager", json=good, headers=AUTH,
                             timeout=10).status_code == 200
        resp = requests.get(running.url + "/runs?format=json", headers=AUTH, timeout=10)
        assert resp.status_code == 200
        rows = {r["run_id"]: r for r in resp.json()["runs"]}
        assert rows["good"]["issues"] == 1
        assert rows["poison"]["error"].startswith("ValueError")
        assert requests.get(running.url + "/runs", headers=AUTH, timeout=10).status_code == 200
        for fmt in ("?format=json", ""):
            resp = requests.get(running.url + "/runs/team/proj/poison" + fmt, headers=AUTH,
                                timeout=10)
            assert resp.status_code == 200
        assert "ValueError" in resp.text or "No issues" in resp.text


def _with(field: str, value: object, where: str = "alert") -> dict:
    body = notification([alert("NodeDown", category="node", host="h1", run="door")])
    item = body["alerts"][0]
    if where == "labels":
        item["labels"][field] = value
    elif where == "annotations":
        item["annotations"][field] = value
    else:
        item[field] = value
    return body


RESOLVED = {"status": "resolved", "startsAt": "2026-01-01T00:00:00Z"}
REFUSED = {
    "startsAt year 0999": _with("startsAt", "0999-06-01T00:00:00Z"),
    "startsAt year 9999": _with("startsAt", "9999-12-31T23:00:00Z"),
    "startsAt year 1999": _with("startsAt", "1999-12-31T23:59:59Z"),
    "endsAt year 9999": _with("endsAt", "9999-12-31T23:00:00Z"),
    "endsAt before startsAt": _with("status", "resolved"),
    "resolved with zero endsAt": _with("status", "resolved"),
    "panel_id superscript two": _with("panel_id", "\u00b2", "annotations"),
    "panel_id arabic digit": _with("panel_id", "\u0663", "annotations"),
    "panel_id -1": _with("panel_id", "-1", "annotations"),
    "fingerprint with newline": _with("fingerprint", "aa17\n"),
    "run id with newline": _with("wandb_run_id", "door\n", "labels"),
    "run id with slash": _with("wandb_run_id", "a/b", "labels"),
    "entity with newline": _with("wandb_entity", "team\n", "labels"),
    "startsAt with trailing newline": _with("startsAt", "2026-01-01T00:00:00Z\n"),
}
REFUSED["endsAt year 9999"]["alerts"][0]["status"] = "resolved"
REFUSED["endsAt before startsAt"]["alerts"][0].update(RESOLVED, endsAt="2025-01-01T00:00:00Z")


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    with serve(make_context(tmp_path_factory.mktemp("door"))) as running:
        yield running


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_door_refuses_what_used_to_become_poison(door, case):
    before = door.ctx.store.alert_count()
    resp = requests.post(door.url + "/alertmanager", data=json.dumps(REFUSED[case]),
                         headers={**AUTH, "Content-Type": "application/json"}, timeout=10)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]
    assert door.ctx.store.alert_count() == before


@pytest.mark.parametrize("ends_at", ["0001-01-01T00:00:00Z", "0001-01-01T00:00:00.000000000Z",
                                     "2026-11-29T13:00:00.000000001Z", None])
def test_door_accepts_real_alertmanager_end_times(door, ends_at):
    body = _with("endsAt", ends_at)
    body["alerts"][0]["annotations"]["panel_id"] = "20"
    if ends_at is None:
        del body["alerts"][0]["endsAt"]
    resp = requests.post(door.url + "/alertmanager", json=body, headers=AUTH, timeout=10)
    assert resp.status_code == 200, resp.text


def test_runs_are_paginated_and_diagnosed_only_when_they_changed(tmp_path, monkeypatch):
    calls: list[int] = []
    real = service.diagnose

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(service, "diagnose", counted)
    ctx = make_context(tmp_path)
    with serve(ctx) as running:
        def post(alerts: list[dict]) -> None:
            assert requests.post(running.url + "/alertmanager", json=notification(alerts),
                                 headers=AUTH, timeout=10).status_code == 200

        def page(query: str) -> dict:
            resp = requests.get(running.url + "/runs?format=json&" + query, headers=AUTH,
                                timeout=10)
            assert resp.status_code == 200, resp.text
            return resp.json()
        post([alert("NodeDown", category="node", host=f"h{i}", run=f"r{i}") for i in range(7)]
             + [alert("NodeDown", category="node", host="idle")])
        seen, offset = [], 0
        while offset is not None:
            body = page(f"limit=3&offset={offset}")
            assert body["unattributed_alerts"] == 1
            seen += [r["run_id"] for r in body["runs"]]
            offset = body.get("next_offset")
        assert sorted(seen) == [f"r{i}" for i in range(7)]
        assert len(calls) == 7
        assert len(page("")["runs"]) == 7 and len(calls) == 7  # nothing changed: no diagnosis
        post([alert("GpuXidError", category="gpu_hardware", host="h3", run="r3")])
        rows = {r["run_id"]: r for r in page("")["runs"]}
        assert len(calls) == 8 and rows["r3"]["alerts"] == 2 and rows["r0"]["alerts"] == 1
        for query in ("limit=0", "limit=501", "offset=-1", "limit=x"):
            resp = requests.get(running.url + "/runs?" + query, headers=AUTH, timeout=10)
            assert resp.status_code == 400, query
