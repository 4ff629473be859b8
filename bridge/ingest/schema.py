"""The store's tables, and how a store written by an older bridge is brought up to date.

``prepare`` runs once per connection's first use, in one transaction: it creates what is
missing and migrates older stores (see ``SCHEMA_VERSION``), so a crash mid-way leaves the old
store as it was. ``store.py`` reads and writes; this module only shapes the file.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime

# Alerts are clustered by run, then start time, then fingerprint (WITHOUT ROWID: the primary key is
# the table, one b-tree written per alert). A notification's alerts land next to each other at
# the end of their run's range, so a commit writes few pages; keyed by fingerprint first (a
# hash), they landed all over the table and a 1,536-alert commit dirtied most of it. The same
# order answers every per-run read (facts, /runs) without a second index. The alert's name,
# severity and category are read from its labels (they were copies in columns of their own).
ALERTS_TABLE = """
CREATE TABLE IF NOT EXISTS alerts (
    fingerprint TEXT NOT NULL,
    starts_at TEXT NOT NULL,
    entity TEXT NOT NULL,
    project TEXT NOT NULL,
    run_id TEXT NOT NULL,
    status TEXT NOT NULL,
    ends_at TEXT,
    hostname TEXT NOT NULL,
    gpu TEXT NOT NULL,
    labels TEXT NOT NULL,
    annotations TEXT NOT NULL,
    received_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    lookup_done INTEGER NOT NULL DEFAULT 0,
    confirmation TEXT,
    PRIMARY KEY (entity, project, run_id, starts_at, fingerprint)
) WITHOUT ROWID
"""
OTHER_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS outbox (
    entity TEXT NOT NULL,
    project TEXT NOT NULL,
    run_id TEXT NOT NULL,
    dirty_seq INTEGER NOT NULL DEFAULT 0,
    delivered_seq INTEGER NOT NULL DEFAULT 0,
    pending_since REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt REAL NOT NULL DEFAULT 0,
    last_flush REAL NOT NULL DEFAULT 0,
    parked TEXT,
    last_error TEXT,
    storage_id TEXT,
    run_state TEXT,
    summary_seq INTEGER NOT NULL DEFAULT 0,
    next_state_check REAL,
    delivered_at REAL,
    PRIMARY KEY (entity, project, run_id)
)""",
    # What the bridge wrote to each run in W&B (or saw first), so nothing is written twice:
    # projection/plan.py names the kinds; one row per kind and key.
    """CREATE TABLE IF NOT EXISTS marks (
    entity TEXT NOT NULL,
    project TEXT NOT NULL,
    run_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    at REAL NOT NULL,
    name TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (entity, project, run_id, kind, key)
)""",
    "CREATE TABLE IF NOT EXISTS probe (id INTEGER PRIMARY KEY, at REAL NOT NULL, pad BLOB)",
)
# Schema version 2: ended runs and their verdicts (prometheus/endings.py, diagnosis/outcome.py),
# with or without alerts; and the time up to which Prometheus was searched for ended runs.
ENDINGS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS endings (
    entity TEXT NOT NULL,
    project TEXT NOT NULL,
    run_id TEXT NOT NULL,
    ended_at REAL NOT NULL,
    found_at REAL NOT NULL,
    how TEXT NOT NULL,
    verdict TEXT,
    outcome TEXT,
    judged_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt REAL NOT NULL DEFAULT 0,
    last_error TEXT,
    PRIMARY KEY (entity, project, run_id)
)""",
    "CREATE INDEX IF NOT EXISTS alerts_firing ON alerts (entity, project, run_id) "
    "WHERE status = 'firing'",
    "CREATE INDEX IF NOT EXISTS endings_pending ON endings (next_attempt) WHERE verdict IS NULL",
    "CREATE INDEX IF NOT EXISTS endings_by_verdict ON endings (verdict, ended_at)",
    "CREATE TABLE IF NOT EXISTS scans (name TEXT PRIMARY KEY, scanned_to REAL NOT NULL)",
)
# Each run's GPU-hours lost as last measured (diagnosis/impact.py), so the per-project gauge and
# /runs survive a restart. Added within version 2: an older bridge ignores the table.
COSTS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS gpu_hours (
    entity TEXT NOT NULL,
    project TEXT NOT NULL,
    run_id TEXT NOT NULL,
    hours REAL NOT NULL,
    measured_at REAL NOT NULL,
    PRIMARY KEY (entity, project, run_id)
)""",
    # Slow evidence about a run the worker computed (measured impacts), as JSON by kind, with
    # when it was computed: pages read it and never compute it themselves.
    """CREATE TABLE IF NOT EXISTS evidence (
    entity TEXT NOT NULL,
    project TEXT NOT NULL,
    run_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    computed_at REAL NOT NULL,
    PRIMARY KEY (entity, project, run_id, kind)
)""",
)
# What said each ended run ended (the join series gone, its W&B state): a verdict is final only
# with two witnesses, and withdrawn when the join series come back. Added within version 2: an
# older bridge ignores the table, and endings without rows here are re-checked.
WITNESS_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS ending_witnesses (
    entity TEXT NOT NULL,
    project TEXT NOT NULL,
    run_id TEXT NOT NULL,
    how TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (entity, project, run_id, how)
)""",
)
# PRAGMA user_version: 0 is a store written before the clustered alerts table (a rowid table
# keyed by fingerprint first, plus an alerts_by_run index, with alertname, severity and category
# columns); it is rewritten once when opened. 1 has no endings tables; they are added. 2 has no
# alerts.confirmation column (added) and keeps its marks as text ids in ``markers``
# ("tag|<tag>", "seen|<epoch>|<issue>|<alertname>", "start:<issue>", "remediation|<epoch>|<sig>"),
# moved into ``marks`` once.
SCHEMA_VERSION = 3

ALERT_COLUMNS = ("fingerprint, starts_at, entity, project, run_id, status, ends_at, hostname, "
                  "gpu, labels, annotations")


class StorePart:
    """A part of ``Store`` kept in its own module; ``Store`` provides these two."""

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError  # Store's write transaction

    def _read(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        raise NotImplementedError  # Store's read


class StoreError(RuntimeError):
    """The store could not read or write (disk full, read-only, corrupt): retry later."""


class StoreTooNew(StoreError):
    """The store was written by a newer bridge: refusing to use it (the message says so)."""


def prepare(conn: sqlite3.Connection) -> None:
    """Create the tables, or bring an older store up to ``SCHEMA_VERSION``, in one transaction
    (a crash mid-way leaves the old store as it was)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreTooNew(f"store {conn.execute('PRAGMA database_list').fetchone()[2]} has "
                              f"schema version {version}, written by a newer bridge; this bridge "
                              f"knows versions up to {SCHEMA_VERSION} and will not use it "
                              "(upgrade the bridge, or point store.path at a new file)")
        if version < 1:
            old = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND "
                               "name='alerts'").fetchone()
            if old:
                conn.execute("ALTER TABLE alerts RENAME TO alerts_v0")
            conn.execute(ALERTS_TABLE)
            if old:
                conn.execute(f"INSERT OR IGNORE INTO alerts ({ALERT_COLUMNS}, received_at, "  # noqa: S608 - constant column list
                             f"updated_at, lookup_done) SELECT {ALERT_COLUMNS}, received_at, "
                             "updated_at, lookup_done FROM alerts_v0")
                conn.execute("DROP TABLE alerts_v0")
        for statement in (*OTHER_SCHEMA, *ENDINGS_SCHEMA, *COSTS_SCHEMA, *WITNESS_SCHEMA):
            conn.execute(statement)
        if 1 <= version < 3:
            conn.execute("ALTER TABLE alerts ADD COLUMN confirmation TEXT")
        if version < 3 and conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND "
                                        "name='markers'").fetchone():
            conn.executemany(ADD_MARK, [(*row[:3], *_old_mark(row[3], row[4])) for row in
                                         conn.execute("SELECT * FROM markers")])
            conn.execute("DROP TABLE markers")
        if version < SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


@dataclass(frozen=True)
class Mark:
    """Something the bridge wrote to a run in W&B, or saw of it first: ``kind`` (its meaning is
    the projection's), ``key`` (a tag, an issue key), when, and a name where the kind has one."""

    kind: str
    key: str
    at: float
    name: str = ""


# The row of each kind is written once; the one ``restart`` row (key "") is the latest.
ADD_MARK = ("INSERT INTO marks (entity, project, run_id, kind, key, at, name) "
             "VALUES (?,?,?,?,?,?,?) ON CONFLICT (entity, project, run_id, kind, key) DO "
             "UPDATE SET at=excluded.at, name=excluded.name WHERE kind='restart' AND "
             "excluded.at >= marks.at")


def _old_mark(marker: str, written_at: float) -> tuple[str, str, float, str]:
    """(kind, key, at, name) of a schema-2 marker id."""
    kind, sep, rest = marker.partition("|")
    if not sep:
        kind, _, rest = marker.partition(":")
        return kind, rest, written_at, ""
    if kind == "seen":
        at, key, name = rest.split("|", 2)
        return kind, key, float(at), name
    if kind == "remediation":
        at, sig = rest.split("|", 1)
        return "restart", "", float(at), sig
    return kind, rest, written_at, ""


def iso(value: datetime) -> str:
    """Fixed-width UTC text so SQLite orders timestamps correctly (the year zero-padded: glibc's
    ``%Y`` writes years before 1000 with fewer digits, which ``from_iso`` cannot read back)."""
    utc = value.astimezone(UTC)
    return f"{utc.year:04d}" + utc.strftime("-%m-%dT%H:%M:%S.%fZ")


def from_iso(value: str) -> datetime:
    """Inverse of ``iso``."""
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
