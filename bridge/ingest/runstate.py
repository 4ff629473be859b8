"""What the bridge keeps about each run besides its alerts and its W&B outbox: the marks it
wrote to the run in W&B, Prometheus' answer about each alert, the ended run and its verdict,
the GPU-hours it lost and the worker's other evidence. A part of ``Store``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from wandb_infra.bridge.diagnosis.root_cause import AlertFact
from wandb_infra.bridge.ingest.schema import ADD_MARK, Mark, StorePart, from_iso, iso
from wandb_infra.common.runkey import RunKey


@dataclass(frozen=True)
class Ending:
    """An ended run: when, what said so, and its verdict once judged (JSON, bridge/outcome)."""

    run: RunKey
    ended_at: float
    how: str
    verdict: str | None
    outcome: str | None
    attempts: int


class RunState(StorePart):
    """``Store``'s per-run state (see module docstring)."""

    @staticmethod
    def _bump(conn: sqlite3.Connection, run: RunKey, now: float) -> None:
        raise NotImplementedError  # Store's outbox bump

    # marks ----------------------------------------------------------------------------------
    def marks(self, run: RunKey) -> list[Mark]:
        """What the bridge wrote to a run (or saw of it first), oldest first."""
        rows = self._read("SELECT kind, key, at, name FROM marks WHERE entity=? AND project=? "
                          "AND run_id=? ORDER BY at, kind, key", (run.entity, run.project,
                                                                  run.run_id))
        return [Mark(r["kind"], r["key"], r["at"], r["name"]) for r in rows]

    def add_marks(self, run: RunKey, marks: Sequence[Mark]) -> None:
        """Remember marks so they are never written twice."""
        with self._tx() as conn:
            conn.executemany(ADD_MARK, [(run.entity, run.project, run.run_id, m.kind, m.key,
                                          m.at, m.name) for m in marks])

    # confirmations ---------------------------------------------------------------------------
    def confirmations(self, run: RunKey) -> dict[tuple[str, datetime], str]:
        """(fingerprint, start) -> what Prometheus said of the run's alerts: "" it raised it,
        else why not; alerts not answered yet are left out."""
        rows = self._read("SELECT fingerprint, starts_at, confirmation FROM alerts WHERE "
                          "entity=? AND project=? AND run_id=? AND confirmation IS NOT NULL",
                          (run.entity, run.project, run.run_id))
        return {(r[0], from_iso(r[1])): r[2] for r in rows}

    def record_confirmations(self, run: RunKey,
                             answers: Sequence[tuple[AlertFact, str]]) -> None:
        """Store Prometheus' final answers about the run's alerts (they never change)."""
        with self._tx() as conn:
            conn.executemany(
                "UPDATE alerts SET confirmation=? WHERE entity=? AND project=? AND run_id=? "
                "AND starts_at=? AND fingerprint=?",
                [(why, *run, iso(f.starts_at), f.fingerprint) for f, why in answers])

    # ended runs -----------------------------------------------------------------------------
    @staticmethod
    def _ending(row: sqlite3.Row) -> Ending:
        return Ending(RunKey(row["entity"], row["project"], row["run_id"]), row["ended_at"],
                      row["how"], row["verdict"], row["outcome"], row["attempts"])

    def add_endings(self, runs: Sequence[tuple[RunKey, float, str]], now: float) -> int:
        """Record runs as ended (run, when, what said so); a run already known keeps its
        first record and gains the witness. Returns how many were new."""
        rows = [(r.entity, r.project, r.run_id, at, now, how) for r, at, how in runs
                if r.attributed]
        with self._tx() as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO ending_witnesses (entity, project, run_id, at, how) "
                "VALUES (?,?,?,?,?)", [(*row[:4], row[5]) for row in rows])
            return max(0, conn.executemany(
                "INSERT OR IGNORE INTO endings (entity, project, run_id, ended_at, found_at, how) "
                "VALUES (?,?,?,?,?,?)", rows).rowcount)

    def witnesses(self, run: RunKey) -> list[str]:
        """What said the run ended, first first."""
        return [r[0] for r in self._read(
            "SELECT how FROM ending_witnesses WHERE entity=? AND project=? AND run_id=? "
            "ORDER BY at, how", (run.entity, run.project, run.run_id))]

    def unconfirmed_endings(self, since: float, limit: int) -> list[Ending]:
        """Ended runs (judged or not) with fewer than two witnesses that ended after
        ``since``, newest first: the ones a reappearing run withdraws."""
        rows = self._read(
            "SELECT * FROM endings e WHERE ended_at > ? AND (SELECT COUNT(*) FROM "
            "ending_witnesses w WHERE w.entity=e.entity AND w.project=e.project AND "
            "w.run_id=e.run_id) < 2 ORDER BY ended_at DESC LIMIT ?", (since, limit))
        return [self._ending(r) for r in rows]

    def withdraw_ending(self, run: RunKey, now: float) -> None:
        """The run is alive after all: forget its ending, witnesses and verdict; a verdict
        already queued for W&B is projected again without it."""
        key = (run.entity, run.project, run.run_id)
        with self._tx() as conn:
            judged = conn.execute("SELECT verdict FROM endings WHERE entity=? AND project=? "
                                  "AND run_id=?", key).fetchone()
            conn.execute("DELETE FROM endings WHERE entity=? AND project=? AND run_id=?", key)
            conn.execute("DELETE FROM ending_witnesses WHERE entity=? AND project=? AND "
                         "run_id=?", key)
            if judged is not None and judged[0] is not None:
                self._bump(conn, run, now)

    def pending_endings(self, now: float, limit: int) -> list[Ending]:
        """Ended runs still to be judged, past their retry time, oldest end first."""
        rows = self._read("SELECT * FROM endings WHERE verdict IS NULL AND next_attempt <= ? "
                          "ORDER BY ended_at LIMIT ?", (now, limit))
        return [self._ending(r) for r in rows]

    def record_outcome(self, run: RunKey, verdict: str, outcome: str, now: float, *,
                       deliver: bool) -> None:
        """Store a run's verdict; with ``deliver`` its W&B projection is queued (the run gets
        an outbox row if it had none)."""
        with self._tx() as conn:
            conn.execute("UPDATE endings SET verdict=?, outcome=?, judged_at=?, last_error=NULL "
                         "WHERE entity=? AND project=? AND run_id=?",
                         (verdict, outcome, now, run.entity, run.project, run.run_id))
            if deliver:
                self._bump(conn, run, now)

    def ending_failed(self, run: RunKey, next_attempt: float, error: str) -> None:
        """Prometheus could not answer for this run: try again at ``next_attempt``."""
        with self._tx() as conn:
            conn.execute("UPDATE endings SET attempts=attempts+1, next_attempt=?, last_error=? "
                         "WHERE entity=? AND project=? AND run_id=?",
                         (next_attempt, error[:500], run.entity, run.project, run.run_id))

    def ending(self, run: RunKey) -> Ending | None:
        """One run's ending record."""
        rows = self._read("SELECT * FROM endings WHERE entity=? AND project=? AND run_id=?",
                          (run.entity, run.project, run.run_id))
        return self._ending(rows[0]) if rows else None

    def endings_page(self, verdict: str, limit: int, offset: int = 0) -> list[Ending]:
        """Judged runs with this verdict, most recently ended first."""
        rows = self._read("SELECT * FROM endings WHERE verdict=? ORDER BY ended_at DESC, "
                          "entity, project, run_id LIMIT ? OFFSET ?", (verdict, limit, offset))
        return [self._ending(r) for r in rows]

    def scanned_to(self, name: str) -> float | None:
        """Up to when the named scan has looked (None: never)."""
        rows = self._read("SELECT scanned_to FROM scans WHERE name=?", (name,))
        return float(rows[0][0]) if rows else None

    def set_scanned_to(self, name: str, at: float) -> None:
        """Remember up to when the named scan has looked (survives restarts)."""
        with self._tx() as conn:
            conn.execute("INSERT INTO scans (name, scanned_to) VALUES (?, ?) ON CONFLICT (name) "
                         "DO UPDATE SET scanned_to=excluded.scanned_to", (name, at))

    # GPU-hours lost ---------------------------------------------------------------------------
    def record_gpu_hours(self, run: RunKey, hours: float, now: float) -> None:
        """A run's GPU-hours lost as just measured; written only when the figure changed (run
        pages measure often)."""
        hours = round(hours, 3)
        if not run.attributed or self.gpu_hours(run) == hours:
            return
        with self._tx() as conn:
            conn.execute("INSERT INTO gpu_hours (entity, project, run_id, hours, measured_at) "
                         "VALUES (?,?,?,?,?) ON CONFLICT (entity, project, run_id) DO UPDATE "
                         "SET hours=excluded.hours, measured_at=excluded.measured_at",
                         (run.entity, run.project, run.run_id, hours, now))

    def gpu_hours(self, run: RunKey) -> float | None:
        """A run's GPU-hours lost as last measured (None: never measured)."""
        rows = self._read("SELECT hours FROM gpu_hours WHERE entity=? AND project=? AND "
                          "run_id=?", (run.entity, run.project, run.run_id))
        return float(rows[0][0]) if rows else None

    def gpu_hours_by_project(self) -> list[tuple[str, str, float]]:
        """(entity, project, GPU-hours lost summed over its runs), in key order."""
        rows = self._read("SELECT entity, project, SUM(hours) FROM gpu_hours "
                          "GROUP BY entity, project ORDER BY entity, project")
        return [(r[0], r[1], float(r[2])) for r in rows]

    def record_evidence(self, run: RunKey, kind: str, body: str, now: float) -> None:
        """Evidence of ``kind`` about a run as just computed (replaces the previous)."""
        with self._tx() as conn:
            conn.execute("INSERT INTO evidence (entity, project, run_id, kind, body, computed_at) "
                         "VALUES (?,?,?,?,?,?) ON CONFLICT (entity, project, run_id, kind) DO "
                         "UPDATE SET body=excluded.body, computed_at=excluded.computed_at",
                         (run.entity, run.project, run.run_id, kind, body, now))

    def evidence(self, run: RunKey, kind: str) -> tuple[str, float] | None:
        """(body, computed at) of the run's last evidence of ``kind``; None: never computed."""
        rows = self._read("SELECT body, computed_at FROM evidence WHERE entity=? AND project=? "
                          "AND run_id=? AND kind=?", (run.entity, run.project, run.run_id, kind))
        return (str(rows[0][0]), float(rows[0][1])) if rows else None
