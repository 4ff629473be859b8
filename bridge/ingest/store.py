"""The bridge's durable state in SQLite (WAL, synchronous=FULL): the connection per thread, the
alerts and their retention; the outbox (``outbox.py``) and the per-run state (``runstate.py``)
are parts of ``Store``.

A notification is acknowledged only after ``ingest`` committed it. Alerts are keyed by
(fingerprint, startsAt, run), so Alertmanager repeats and HA duplicates change nothing, and a
``resolved`` alert only closes an alert. Any SQLite failure (disk full, read-only, locked too
long) raises ``StoreError``; the webhook turns it into a 503 so Alertmanager retries.
"""

from __future__ import annotations

import fcntl
import json
import logging
import operator
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from itertools import chain, islice
from pathlib import Path

import orjson

from wandb_infra.bridge.diagnosis.root_cause import AlertFact
from wandb_infra.bridge.ingest import identity
from wandb_infra.bridge.ingest.identity import Identity
from wandb_infra.bridge.ingest.outbox import Outbox
from wandb_infra.bridge.ingest.payload import Notification
from wandb_infra.bridge.ingest.runstate import RunState
from wandb_infra.bridge.ingest.schema import (
    ALERT_COLUMNS,
    StoreError,
    StoreTooNew,
    from_iso,
    iso,
    prepare,
)
from wandb_infra.common.logsetup import log_fields
from wandb_infra.common.runkey import RunKey

log = logging.getLogger(__name__)

# Alerts are inserted INSERT_ROWS at a time by one statement whose rows share the run and the
# time (bound once, as ?1-?4): a third less binding and stepping than one row per execution.
INSERT_ROWS = 100
_ROW_FIELDS = 8  # starts_at, fingerprint, status, ends_at, hostname, gpu, labels, annotations


@lru_cache(maxsize=INSERT_ROWS)
def _insert(rows: int) -> str:
    """The INSERT of ``rows`` alerts of one run (columns in primary-key order)."""
    values = ",".join(
        "(?1,?2,?3," + ",".join(f"?{5 + k * _ROW_FIELDS + f}" for f in range(_ROW_FIELDS))
        + ",?4,?4)" for k in range(rows))
    return ("INSERT OR IGNORE INTO alerts (entity, project, run_id, starts_at, fingerprint, "
            "status, ends_at, hostname, gpu, labels, annotations, received_at, updated_at) "
            "VALUES " + values)


# Alertmanager's life cycle (its alert store merges an alert into the stored one of its
# fingerprint when their intervals overlap, and replaces it otherwise:
# github.com/prometheus/alertmanager, provider/mem/mem.go Put): a resolve names a fingerprint
# from its startsAt to its endsAt, so it closes every firing row of that fingerprint starting
# within that span (an HA Prometheus pair's two startsAt values are one alert) and none
# starting after it (a later firing).
_RESOLVE = ("UPDATE alerts SET status='resolved', ends_at=?, updated_at=? WHERE entity=? AND "
            "project=? AND run_id=? AND starts_at BETWEEN ? AND ? AND fingerprint=? AND "
            "status='firing'")
# The same alert firing again after it was resolved (a resolve Alertmanager was sent by anyone
# through its open API, then Prometheus' next re-send merged it back): it is open again.
_REOPEN = ("UPDATE alerts SET status='firing', ends_at=NULL, updated_at=? WHERE entity=? AND "
           "project=? AND run_id=? AND starts_at=? AND fingerprint=? AND status='resolved'")
_RUN = operator.attrgetter("run")
_STARTS_AT = operator.attrgetter("starts_at")


def _sorted_json(value: dict[str, str]) -> str:
    """Labels or annotations as canonical JSON text (sorted keys), with orjson: a tenth of the
    stdlib encoder's time, and encoding dominated a storm's durable write."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


class StoreLocked(RuntimeError):
    """Another bridge process holds the store (one store, one active bridge)."""


def lock(path: str | Path) -> object | None:
    """Take the exclusive lock of the store at ``path`` (``flock`` on ``<store>.lock``, held by
    the returned open file); ``StoreLocked`` names the holder's pid. A lock file that cannot be
    created (read-only disk) is logged and the bridge runs unlocked, answering 503 anyway."""
    lock_path = Path(str(path) + ".lock")
    handle = None
    with suppress(OSError):
        lock_path.parent.mkdir(parents=True, exist_ok=True)
    for mode in ("a+", "r"):  # a read-only disk still lets an existing lock file be locked
        try:
            handle = lock_path.open(mode, encoding="utf-8")
            break
        except OSError as exc:
            error = exc
    if handle is None:
        log.warning("cannot create the store lock; running without it",
                    extra=log_fields(lock=str(lock_path), error=str(error)))
        return None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        with suppress(OSError):
            handle.seek(0)
        holder = handle.read(20).strip() or "unknown"
        handle.close()
        raise StoreLocked(f"another bridge (pid {holder}) is using the store {path} (lock "
                          f"{lock_path}); one store, one active bridge: refusing to start") \
            from exc
    with suppress(OSError):
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
    return handle


@dataclass(frozen=True)
class IngestResult:
    """What one notification changed."""

    received: int
    new: int
    resolved: int
    duplicates: int
    runs: tuple[RunKey, ...]


@dataclass(frozen=True)
class RunIndexEntry:
    """One attributed run as /runs lists it; ``version`` changes whenever its alerts do."""

    run: RunKey
    alerts: int
    firing: int
    version: tuple[int, int, float]


def _fact(row: sqlite3.Row) -> AlertFact:
    labels = json.loads(row["labels"])
    return AlertFact(
        fingerprint=row["fingerprint"], alertname=labels.get("alertname", ""),
        starts_at=from_iso(row["starts_at"]),
        ends_at=from_iso(row["ends_at"]) if row["ends_at"] else None,
        severity=labels.get("severity", ""), category=labels.get("category", ""),
        hostname=row["hostname"], gpu=row["gpu"], labels=labels,
        annotations=json.loads(row["annotations"]),
    )


class Store(Outbox, RunState):
    """One SQLite file; a connection per thread (the webhook's and the worker's)."""

    def __init__(self, path: str | Path, min_free_bytes: int = 0) -> None:
        self.path = str(path)
        self.min_free_bytes = min_free_bytes
        self._local = threading.local()
        self._heal_lock = threading.Lock()
        self._generation = 0  # bumped when the files were lost: every thread reconnects
        self._schema_ready = False
        self.lock_handle: object | None = None  # ``lock``'s file, held by the service
        # A read-only or full disk, or a state directory not creatable yet, is not fatal: every
        # use retries opening, answering 503 until the disk is back. A newer bridge's store is.
        try:
            self._conn()
        except StoreTooNew:
            raise
        except StoreError:
            pass

    def _files(self) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
        """(device, inode) of the database and WAL files at the store's path (None: absent)."""
        out: list[tuple[int, int] | None] = []
        for name in (self.path, self.path + "-wal"):
            try:
                out.append(((st := os.stat(name)).st_dev, st.st_ino))  # one stat
            except OSError:
                out.append(None)
        return out[0], out[1]

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "generation", 0) != self._generation:
            self._abandon(conn)  # its files were lost and healed by another thread
            conn = None
        if conn is None:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                conn = sqlite3.connect(self.path, timeout=10, isolation_level=None,
                                       check_same_thread=True)
            except (OSError, sqlite3.Error) as exc:
                raise StoreError(f"cannot open store {self.path}: {exc}") from exc
            try:
                conn.row_factory = sqlite3.Row
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute("PRAGMA foreign_keys=ON")
                if not self._schema_ready:
                    prepare(conn)
                    self._schema_ready = True
            except StoreTooNew:
                conn.close()
                raise
            except sqlite3.Error as exc:
                conn.close()
                raise StoreError(f"cannot open store {self.path}: {exc}") from exc
            self._local.conn = conn
            self._local.generation = self._generation
            self._local.files = self._files()
        return conn

    def _abandon(self, conn: sqlite3.Connection) -> None:
        """Drop this thread's connection to lost files."""
        self._local.conn = None
        with suppress(sqlite3.Error):
            conn.close()

    def _check_files(self, conn: sqlite3.Connection) -> None:
        """Raise ``StoreError`` (after healing) when the database or WAL file this thread's
        connection writes to is no longer the one at the store's path: vanished or replaced,
        a commit would land in a file lost at the next restart."""
        db, wal = self._files()
        want_db, want_wal = self._local.files
        if want_wal is None and wal is not None and db == want_db:
            self._local.files = (want_db, wal)  # the WAL appeared with the first write
            want_wal = wal
        if db == want_db and wal == want_wal:
            return
        what = ("database file " + ("vanished" if db is None else "was replaced")
                if db != want_db else "WAL file " + ("vanished" if wal is None
                                                     else "was replaced"))
        healed = self._heal(conn, db != want_db, db is None)
        raise StoreError(f"store {what} under the running bridge; {healed}; retry")

    def _heal(self, conn: sqlite3.Connection, db_lost: bool, db_gone: bool) -> str:
        """Save what this connection still sees, then make every thread reconnect. A lost WAL's
        frames are checkpointed into the database through the connection's open descriptor
        (nothing acknowledged is lost). A lost database is copied out with the backup API: back
        to its path when it vanished, next to the replacement when it was replaced."""
        with self._heal_lock:
            if getattr(self._local, "generation", 0) != self._generation:
                self._abandon(conn)
                return "already healed by another thread"
            result = "reopened"
            try:
                busy, _frames, done = conn.execute("PRAGMA wal_checkpoint(FULL)").fetchone()
                result = f"{done} WAL frame(s) checkpointed" if not busy else \
                    "checkpoint busy"
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                if db_lost:
                    target = self.path if db_gone else \
                        f"{self.path}.replaced-{time.strftime('%Y%m%dT%H%M%S')}"
                    copy = sqlite3.connect(target + ".tmp")
                    try:
                        conn.backup(copy)
                    finally:
                        copy.close()
                    os.replace(target + ".tmp", target)
                    result += f"; the bridge's copy saved to {target}"
            except (sqlite3.Error, OSError) as exc:
                result = f"could not save the lost file's content: {exc}"
            log.error("store file lost under the running bridge; healing", extra=log_fields(
                store=self.path, action=result))
            self._generation += 1
            self._schema_ready = False  # a replacement is checked (version) and prepared
            # The new connection opens before the old one closes, so closing it is never the
            # "last connection" that deletes the WAL at the path (now the new connection's).
            self._local.conn = None
            with suppress(StoreError):
                self._conn()
            with suppress(sqlite3.Error):
                conn.close()
            return result

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        self._check_files(conn)
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield conn
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise StoreError(f"store write failed: {exc}") from exc
        # Checked again after the commit: one that went into a lost file is not acknowledged
        # (the caller answers 503; its retry is a duplicate).
        self._check_files(conn)

    def _read(self, sql: str, params: tuple = ()) -> list[sqlite3.Row]:
        try:
            return self._conn().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"store read failed: {exc}") from exc

    def close(self) -> None:
        """Close this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def probe(self) -> None:
        """Prove the store can grow right now (readiness); raises ``StoreError``.

        Checks the filesystem keeps ``min_free_bytes`` free, then writes and deletes a padded
        row in one transaction, so a full disk (or a page limit) fails here the same way a
        notification would."""
        self._conn()  # creates the state directory once it can be
        if self.min_free_bytes:
            try:
                stat = os.statvfs(os.path.dirname(os.path.abspath(self.path)))
            except OSError as exc:
                raise StoreError(f"cannot stat the store's filesystem: {exc}") from exc
            free = stat.f_bavail * stat.f_frsize
            if free < self.min_free_bytes:
                raise StoreError(f"only {free} bytes free on the store's filesystem "
                                 f"(need {self.min_free_bytes})")
        with self._tx() as conn:
            conn.execute("INSERT OR REPLACE INTO probe (id, at, pad) VALUES (1, ?, "
                         "zeroblob(65536))", (time.time(),))
            conn.execute("DELETE FROM probe WHERE id = 1")

    # ingest ---------------------------------------------------------------------------------
    def ingest(self, notification: Notification, now: float | None = None, *,
               identities: Sequence[Identity] | None = None) -> IngestResult:
        """Store a notification in one durable transaction; returns what changed.
        ``identities`` are the alerts' identities when the caller already read them."""
        now = time.time() if now is None else now
        alerts = notification.alerts
        if identities is None:
            identities = identity.read_all(alerts)
        # Alerts grouped by run and written from a generator, so rows are built a chunk at a
        # time; a run changed when its inserts or resolutions changed a row. Inserts go first,
        # so a resolution in the same body closes an alert inserted firing.
        runs = list(map(_RUN, identities))
        by_run: Mapping[RunKey, Sequence[int]]
        if len(set(runs)) <= 1:  # the usual notification: one run
            by_run = {runs[0]: range(len(runs))} if runs else {}
        else:
            groups: dict[RunKey, list[int]] = {}
            for index, run in enumerate(runs):
                groups.setdefault(run, []).append(index)
            by_run = groups
        texts = {start: iso(start) for start in set(map(_STARTS_AT, alerts))}
        resolving = any(alert.status == "resolved" for alert in alerts)

        def rows(indices: Sequence[int]) -> Iterator[tuple]:
            for i in indices:
                alert, ident = alerts[i], identities[i]
                yield (texts[alert.starts_at], alert.fingerprint, alert.status,
                       iso(alert.ends_at) if alert.ends_at else None, ident.hostname, ident.gpu,
                       _sorted_json(alert.labels), _sorted_json(alert.annotations))

        def inserts(conn: sqlite3.Connection, run: RunKey, indices: Sequence[int]) -> int:
            """Insert the run's alerts, INSERT_ROWS at a time; returns how many were new."""
            added, pending = 0, rows(indices)
            while chunk := list(islice(pending, INSERT_ROWS)):
                added += conn.execute(_insert(len(chunk)),
                                      (*run, now, *chain.from_iterable(chunk))).rowcount
            return added

        def resolutions(run: RunKey, indices: Sequence[int]) -> Iterator[tuple]:
            for i in indices:
                alert = alerts[i]
                if alert.status == "resolved" and alert.ends_at is not None:
                    ends = iso(alert.ends_at)
                    yield (ends, now, *run, texts[alert.starts_at], ends, alert.fingerprint)

        # an alert both firing and resolved in one body is resolved (never reopened)
        closing = {(a.fingerprint, a.starts_at) for a in alerts if a.status == "resolved"} \
            if resolving else set()

        def reopenings(run: RunKey, indices: Sequence[int]) -> Iterator[tuple]:
            for i in indices:
                alert = alerts[i]
                if alert.status == "firing" and (alert.fingerprint, alert.starts_at) \
                        not in closing:
                    yield (now, *run, texts[alert.starts_at], alert.fingerprint)

        new = resolved = 0
        changed: list[RunKey] = []
        with self._tx() as conn:
            for run, indices in by_run.items():
                added = inserts(conn, run, indices)
                # only where a firing alert was already stored (a re-send): nothing to reopen
                # in a notification whose alerts were all new
                reopened = conn.executemany(_REOPEN, reopenings(run, indices)).rowcount \
                    if added < len(indices) else 0
                closed = conn.executemany(_RESOLVE, resolutions(run, indices)).rowcount \
                    if resolving else 0
                new += added
                resolved += max(closed, 0)
                if added or closed > 0 or reopened > 0:
                    changed.append(run)
            for run in changed:
                self._bump(conn, run, now)
        received = len(alerts)
        # one resolve may close several rows (an HA pair's two startsAt values)
        return IngestResult(received, new, resolved, max(0, received - new - resolved),
                            tuple(sorted(changed)))

    # reads ----------------------------------------------------------------------------------
    def facts(self, run: RunKey) -> list[AlertFact]:
        """Every stored alert of one run (or the unattributed ones for the empty key)."""
        rows = self._read(
            f"SELECT {ALERT_COLUMNS} FROM alerts WHERE entity=? AND project=? AND run_id=? "  # noqa: S608 - constant column list
            "ORDER BY starts_at, fingerprint", (run.entity, run.project, run.run_id))
        return [_fact(r) for r in rows]

    def runs(self, limit: int = 500) -> list[tuple[RunKey, int, int, str]]:
        """(run, alerts, firing, last start) for the most recently active runs."""
        rows = self._read(
            "SELECT entity, project, run_id, COUNT(*) AS n, "
            "SUM(status='firing') AS firing, MAX(starts_at) AS last FROM alerts "
            "GROUP BY entity, project, run_id ORDER BY last DESC LIMIT ?", (limit,))
        return [(RunKey(r["entity"], r["project"], r["run_id"]), r["n"], r["firing"] or 0,
                 r["last"]) for r in rows]

    def run_index(self, limit: int, offset: int = 0, *, entity: str = "", project: str = "",
                  state: str = "") -> list[RunIndexEntry]:
        """A page of attributed runs, most recently started first (ties in key order), of one
        entity and/or project, read through the alerts' clustered key so a filtered page costs
        the matching runs' rows; ``state`` "open" keeps runs with a firing alert (through the
        ``alerts_firing`` index), "resolved" the others."""
        where, args = "entity != ''", []
        if entity:
            where, args = where + " AND entity = ?", [entity]
        if project:
            where, args = where + " AND project = ?", [*args, project]
        if state == "open":
            where += (" AND (entity, project, run_id) IN (SELECT entity, project, run_id FROM "
                      "alerts WHERE status = 'firing')")
        having = " HAVING SUM(status='firing') = 0" if state == "resolved" else ""
        sql = ("SELECT entity, project, run_id, COUNT(*) AS n, SUM(status='firing') AS firing, "  # noqa: S608 - constant conditions
               "MAX(starts_at) AS last, MAX(updated_at) AS changed FROM alerts WHERE " + where
               + " GROUP BY entity, project, run_id" + having + " ORDER BY last DESC, entity, "
               "project, run_id LIMIT ? OFFSET ?")  # the values are bound
        rows = self._read(sql, (*args, limit, offset))
        return [RunIndexEntry(RunKey(r["entity"], r["project"], r["run_id"]), r["n"],
                              r["firing"] or 0, (r["n"], r["firing"] or 0, r["changed"]))
                for r in rows]

    def unattributed_count(self) -> int:
        """Number of stored alerts no run could be found for (the empty run key: a prefix of
        the primary key)."""
        return self._read("SELECT COUNT(*) FROM alerts WHERE entity='' AND project='' AND "
                          "run_id=''")[0][0]

    def alert_count(self) -> int:
        """Number of stored alert rows (tests and metrics)."""
        return self._read("SELECT COUNT(*) FROM alerts")[0][0]

    # retention ------------------------------------------------------------------------------
    def purge(self, older_than: float, delivering: bool = True) -> int:
        """Delete resolved alerts that ended before ``older_than``, except those of runs whose
        W&B delivery is still pending. Parked runs and, without W&B (``delivering`` False),
        every run have nothing pending, so the store stays bounded in every mode."""
        cutoff = iso(datetime.fromtimestamp(older_than, UTC))
        with self._tx() as conn:
            cur = conn.execute(
                "DELETE FROM alerts WHERE status='resolved' AND ends_at < ? AND NOT EXISTS "
                "(SELECT 1 FROM outbox o WHERE o.entity=alerts.entity AND "
                "o.project=alerts.project AND o.run_id=alerts.run_id AND "
                "o.dirty_seq > o.delivered_seq AND o.parked IS NULL AND ?)", (cutoff, delivering))
            removed = cur.rowcount
            conn.execute(
                "DELETE FROM outbox WHERE NOT (dirty_seq > delivered_seq AND parked IS NULL AND ?) "
                "AND NOT EXISTS (SELECT 1 FROM alerts a WHERE a.entity=outbox.entity AND "
                "a.project=outbox.project AND a.run_id=outbox.run_id)", (delivering,))
            conn.execute("DELETE FROM endings WHERE ended_at < ?", (older_than,))
            # a run's cost goes with its last alert (its issues can no longer be measured)
            conn.execute(
                "DELETE FROM gpu_hours WHERE NOT EXISTS (SELECT 1 FROM alerts a WHERE "
                "a.entity=gpu_hours.entity AND a.project=gpu_hours.project AND "
                "a.run_id=gpu_hours.run_id)")
            conn.execute(
                "DELETE FROM evidence WHERE NOT EXISTS (SELECT 1 FROM alerts a WHERE "
                "a.entity=evidence.entity AND a.project=evidence.project AND "
                "a.run_id=evidence.run_id)")
            conn.execute(
                "DELETE FROM marks WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE "
                "o.entity=marks.entity AND o.project=marks.project AND o.run_id=marks.run_id)")
        return removed
