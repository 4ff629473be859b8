"""A store written by an older bridge (schema version 0 or 2) keeps working after an upgrade: it
is rewritten once into the clustered alerts table, with every alert, the outbox and what was
written to each run kept (its text marker ids become typed marks), and duplicates and
resolutions still recognised against the migrated alerts; alerts gain their confirmation."""

from __future__ import annotations

import json
import sqlite3
from datetime import timedelta
from pathlib import Path

from harness.bridge_payloads import T0, alert, notification
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.schema import ALERTS_TABLE, SCHEMA_VERSION, Mark
from wandb_infra.bridge.ingest.store import Store, iso
from wandb_infra.common.runkey import RunKey

# The schema every store had before version 1, as the bridge created it (do not edit: it is the
# format of stores already on disk).
SCHEMA_V0 = """
CREATE TABLE alerts (
    fingerprint TEXT NOT NULL, starts_at TEXT NOT NULL, entity TEXT NOT NULL,
    project TEXT NOT NULL, run_id TEXT NOT NULL, alertname TEXT NOT NULL, status TEXT NOT NULL,
    ends_at TEXT, severity TEXT NOT NULL, category TEXT NOT NULL, hostname TEXT NOT NULL,
    gpu TEXT NOT NULL, labels TEXT NOT NULL, annotations TEXT NOT NULL,
    received_at REAL NOT NULL, updated_at REAL NOT NULL, lookup_done INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (fingerprint, starts_at, entity, project, run_id)
);
CREATE INDEX alerts_by_run ON alerts (entity, project, run_id);
CREATE TABLE outbox (
    entity TEXT NOT NULL, project TEXT NOT NULL, run_id TEXT NOT NULL,
    dirty_seq INTEGER NOT NULL DEFAULT 0, delivered_seq INTEGER NOT NULL DEFAULT 0,
    pending_since REAL, attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt REAL NOT NULL DEFAULT 0, last_flush REAL NOT NULL DEFAULT 0, parked TEXT,
    last_error TEXT, storage_id TEXT, run_state TEXT, summary_seq INTEGER NOT NULL DEFAULT 0,
    next_state_check REAL, delivered_at REAL, PRIMARY KEY (entity, project, run_id)
);
CREATE TABLE markers (
    entity TEXT NOT NULL, project TEXT NOT NULL, run_id TEXT NOT NULL, marker TEXT NOT NULL,
    written_at REAL NOT NULL, PRIMARY KEY (entity, project, run_id, marker)
);
CREATE TABLE probe (id INTEGER PRIMARY KEY, at REAL NOT NULL, pad BLOB);
"""

XID = alert("GpuXidError", category="gpu_hardware", host="h1", gpu="0", run="r1")
STALL = alert("TrainingStalled", category="workload", host="h2", run="r1",
              start=T0 + timedelta(seconds=30), severity="warning")
LOOSE = alert("NodeDown", category="node", host="h3")  # no run labels: unattributed
RUN = RunKey("team", "proj", "r1")
# Marker ids as schema versions up to 2 wrote them, and the typed marks they become.
MARKERS = ("tag|infra:GpuXidError", "seen|990.500|k1|GpuXidError", "start:k1", "end:k1",
           "alert:k1", "remediation|1100.000|new", "remediation|900.000|old")
MARKS = [Mark("seen", "k1", 990.5, "GpuXidError"), Mark("alert", "k1", 1000.0),
         Mark("end", "k1", 1000.0), Mark("start", "k1", 1000.0),
         Mark("tag", "infra:GpuXidError", 1000.0), Mark("restart", "", 1100.0, "new")]


def _old_row(raw: dict, run: RunKey, hostname: str, gpu: str) -> tuple:
    labels = raw["labels"]
    start = iso(parse_notification(json.dumps(notification([raw])).encode()).alerts[0].starts_at)
    return (raw["fingerprint"], start, *run, labels["alertname"], raw["status"], None,
            labels["severity"], labels["category"], hostname, gpu,
            json.dumps(labels, sort_keys=True), json.dumps(raw["annotations"], sort_keys=True),
            1000.0, 1000.0, 0)


def _old_store(path: Path) -> None:
    """A version-0 store: three alerts (one unattributed), an outbox row and a marker."""
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA_V0)
    conn.executemany("INSERT INTO alerts VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                     [_old_row(XID, RUN, "h1", "0"), _old_row(STALL, RUN, "h2", ""),
                      _old_row(LOOSE, RunKey(), "h3", "")])
    conn.execute("INSERT INTO outbox (entity, project, run_id, dirty_seq, delivered_seq) "
                 "VALUES ('team', 'proj', 'r1', 3, 3)")
    conn.executemany("INSERT INTO markers VALUES ('team', 'proj', 'r1', ?, 1000.0)",
                     [(m,) for m in MARKERS])
    conn.commit()
    conn.close()


def test_a_version_0_store_is_migrated_and_keeps_working(tmp_path):
    path = tmp_path / "bridge.sqlite"
    _old_store(path)
    store = Store(path)
    facts = {f.alertname: f for f in store.facts(RUN)}
    assert set(facts) == {"GpuXidError", "TrainingStalled"}
    assert (facts["GpuXidError"].severity, facts["GpuXidError"].category) == ("critical",
                                                                             "gpu_hardware")
    assert (facts["GpuXidError"].hostname, facts["GpuXidError"].gpu) == ("h1", "0")
    assert facts["GpuXidError"].labels == XID["labels"]
    assert facts["TrainingStalled"].starts_at == T0 + timedelta(seconds=30)
    assert store.unattributed_count() == 1 and store.alert_count() == 3
    assert [e.run for e in store.run_index(10)] == [RUN]
    outbox = store.outbox(RUN)
    assert outbox is not None and (outbox.dirty_seq, outbox.delivered_seq) == (3, 3)
    assert store.marks(RUN) == MARKS

    # The same alerts again are duplicates; a resolution closes the migrated firing alert.
    again = store.ingest(parse_notification(json.dumps(notification([XID, STALL])).encode()))
    assert (again.new, again.duplicates) == (0, 2)
    ended = alert("GpuXidError", category="gpu_hardware", host="h1", gpu="0", run="r1",
                  end=T0 + timedelta(minutes=5))
    closed = store.ingest(parse_notification(json.dumps(notification([ended])).encode()))
    assert closed.resolved == 1 and closed.runs == (RUN,)
    assert {f.alertname: f.ends_at for f in store.facts(RUN)}["GpuXidError"] == \
        T0 + timedelta(minutes=5)
    store.close()

    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        tables = dict(conn.execute("SELECT name, sql FROM sqlite_master").fetchall())
    assert "alerts_by_run" not in tables and "alerts_v0" not in tables
    assert "WITHOUT ROWID" in tables["alerts"]
    assert "severity" not in tables["alerts"]


def test_a_migrated_store_is_opened_again_unchanged(tmp_path):
    path = tmp_path / "bridge.sqlite"
    _old_store(path)
    Store(path).close()
    with sqlite3.connect(path) as conn:
        before = conn.execute("SELECT * FROM alerts ORDER BY fingerprint").fetchall()
    store = Store(path)
    assert store.alert_count() == 3
    store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT * FROM alerts ORDER BY fingerprint").fetchall() == before


def test_a_version_2_store_gets_typed_marks_and_alert_confirmations(tmp_path):
    path = tmp_path / "bridge.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute(ALERTS_TABLE.replace("    confirmation TEXT,\n", ""))
        conn.execute("CREATE TABLE markers (entity TEXT NOT NULL, project TEXT NOT NULL, "
                     "run_id TEXT NOT NULL, marker TEXT NOT NULL, written_at REAL NOT NULL, "
                     "PRIMARY KEY (entity, project, run_id, marker))")
        conn.executemany("INSERT INTO markers VALUES ('team', 'proj', 'r1', ?, 1000.0)",
                         [(m,) for m in MARKERS])
        conn.execute("PRAGMA user_version=2")
    store = Store(path)
    assert store.marks(RUN) == MARKS
    store.ingest(parse_notification(json.dumps(notification([XID, STALL])).encode()))
    xid, stall = sorted(store.facts(RUN), key=lambda f: f.starts_at)
    assert store.confirmations(RUN) == {}
    store.record_confirmations(RUN, [(xid, ""), (stall, "not raised")])
    assert store.confirmations(RUN) == {(xid.fingerprint, xid.starts_at): "",
                                        (stall.fingerprint, stall.starts_at): "not raised"}
    store.add_marks(RUN, [Mark("restart", "", 1050.0, "older"), Mark("tag", "infra:x", 1.0)])
    assert store.marks(RUN)[-1] == Mark("restart", "", 1100.0, "new")  # the latest stays
    store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert not conn.execute("SELECT 1 FROM sqlite_master WHERE name='markers'").fetchone()
