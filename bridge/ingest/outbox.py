"""The W&B outbox in the store: one row per run with new information (``dirty_seq`` bumped on
every change), the sequence delivered, retries with backoff, parked runs and the finish-state
checks. A part of ``Store`` (``store.py`` holds the connection and the alerts)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, fields

from wandb_infra.bridge.ingest.schema import StorePart
from wandb_infra.common.runkey import RunKey


@dataclass(frozen=True)
class OutboxRow:
    """A run's pending W&B projection."""

    run: RunKey
    dirty_seq: int
    delivered_seq: int
    pending_since: float | None
    attempts: int
    next_attempt: float
    last_flush: float
    parked: str | None
    last_error: str | None
    storage_id: str | None
    run_state: str | None
    summary_seq: int
    next_state_check: float | None
    delivered_at: float | None


@dataclass(frozen=True)
class QueueStats:
    """Backlog figures for /metrics."""

    pending_runs: int
    oldest_pending_age: float
    parked_runs: int


class Outbox(StorePart):
    """``Store``'s outbox (see module docstring)."""

    @staticmethod
    def _bump(conn: sqlite3.Connection, run: RunKey, now: float) -> None:
        if not run.attributed:
            return
        conn.execute(
            "INSERT INTO outbox (entity, project, run_id, dirty_seq, pending_since) "
            "VALUES (?,?,?,1,?) ON CONFLICT (entity, project, run_id) DO UPDATE SET "
            "dirty_seq = dirty_seq + 1, parked = NULL, attempts = 0, "
            "pending_since = COALESCE(pending_since, excluded.pending_since)",
            (run.entity, run.project, run.run_id, now))

    @staticmethod
    def _outbox(row: sqlite3.Row) -> OutboxRow:
        return OutboxRow(RunKey(row["entity"], row["project"], row["run_id"]),
                         *(row[f.name] for f in fields(OutboxRow)[1:]))  # columns by name

    def outbox(self, run: RunKey) -> OutboxRow | None:
        """One run's outbox row."""
        rows = self._read("SELECT * FROM outbox WHERE entity=? AND project=? AND run_id=?",
                          (run.entity, run.project, run.run_id))
        return self._outbox(rows[0]) if rows else None

    def due(self, now: float, flush_interval: float, limit: int = 100) -> list[OutboxRow]:
        """Runs to deliver now: pending, not parked, past backoff and their flush interval;
        plus delivered runs whose finish-state check is due. Oldest pending first."""
        rows = self._read(
            "SELECT * FROM outbox WHERE parked IS NULL AND next_attempt <= ? AND "
            "((dirty_seq > delivered_seq AND last_flush + ? <= ?) OR "
            "(next_state_check IS NOT NULL AND next_state_check <= ?)) "
            "ORDER BY COALESCE(pending_since, next_state_check), entity, project, run_id "
            "LIMIT ?", (now, flush_interval, now, now, limit))
        return [self._outbox(r) for r in rows]

    def delivered(self, run: RunKey, seq: int, now: float, *, storage_id: str | None,
                  run_state: str | None, summary_seq: int,
                  next_state_check: float | None) -> None:
        """Record a successful projection of everything up to ``seq``."""
        with self._tx() as conn:
            conn.execute(
                "UPDATE outbox SET delivered_seq=MAX(delivered_seq, ?), attempts=0, "
                "next_attempt=0, last_flush=?, last_error=NULL, storage_id=?, run_state=?, "
                "summary_seq=?, next_state_check=?, delivered_at=?, "
                "pending_since=CASE WHEN dirty_seq > ? THEN ? ELSE NULL END "
                "WHERE entity=? AND project=? AND run_id=?",
                (seq, now, storage_id, run_state, summary_seq, next_state_check, now, seq, now,
                 run.entity, run.project, run.run_id))

    def retry_later(self, run: RunKey, now: float, next_attempt: float, error: str) -> None:
        """Record a transient failure; the worker tries again at ``next_attempt``."""
        with self._tx() as conn:
            conn.execute(
                "UPDATE outbox SET attempts=attempts+1, next_attempt=?, last_flush=?, "
                "last_error=? WHERE entity=? AND project=? AND run_id=?",
                (next_attempt, now, error[:500], run.entity, run.project, run.run_id))

    def rebase_retries(self, now: float, latest: float) -> None:
        """After the wall clock stepped back to ``now``: no retry waits past ``latest``, and
        flush and state-check times from the old clock's future count as now."""
        with self._tx() as conn:
            conn.execute("UPDATE outbox SET next_attempt=MIN(next_attempt, ?), "
                         "last_flush=MIN(last_flush, ?), "
                         "next_state_check=MIN(next_state_check, ?)", (latest, now, now))

    def park(self, run: RunKey, now: float, reason: str) -> None:
        """Stop retrying a run after a permanent failure (new alerts for it unpark it)."""
        with self._tx() as conn:
            conn.execute(
                "UPDATE outbox SET parked=?, last_error=?, last_flush=?, next_state_check=NULL "
                "WHERE entity=? AND project=? AND run_id=?",
                (reason[:500], reason[:500], now, run.entity, run.project, run.run_id))

    def unpark_due(self, now: float, base: float, cap: float) -> int:
        """Give parked runs another try, each ``base * 2**attempts`` (at most ``cap``) seconds
        after it was parked: a revoked key restored, a run created late, a W&B fault taken for
        permanent. Returns how many were unparked."""
        with self._tx() as conn:
            cur = conn.execute(
                "UPDATE outbox SET parked=NULL, attempts=attempts+1, next_attempt=? "
                "WHERE parked IS NOT NULL AND last_flush + MIN(?, ? * (1 << MIN(attempts, 20))) "
                "<= ?", (now, cap, base, now))
            return cur.rowcount

    def parked(self) -> list[OutboxRow]:
        """Runs whose delivery is parked, with the reason."""
        return [self._outbox(r) for r in self._read("SELECT * FROM outbox WHERE parked IS NOT "
                                                    "NULL ORDER BY entity, project, run_id")]

    def queue_stats(self, now: float) -> QueueStats:
        """Pending runs, age of the oldest pending change, parked runs. Parked runs are not
        pending (they wait for new alerts), so they never age the backlog."""
        row = self._read(
            "SELECT SUM(dirty_seq > delivered_seq AND parked IS NULL) AS pending, "
            "MIN(CASE WHEN dirty_seq > delivered_seq AND parked IS NULL THEN pending_since "
            "END) AS oldest, "
            "SUM(parked IS NOT NULL) AS parked FROM outbox")[0]
        oldest = row["oldest"]
        return QueueStats(row["pending"] or 0, 0.0 if oldest is None else max(0.0, now - oldest),
                          row["parked"] or 0)
