"""Marker rows wait for the root cause to settle, batched per run, never starved."""

from __future__ import annotations

from datetime import timedelta

from harness.bridge_payloads import T0
from wandb_infra.bridge.diagnosis.root_cause import AlertFact, diagnose
from wandb_infra.bridge.ingest.schema import Mark
from wandb_infra.bridge.projection.plan import plan_markers

SETTLE = 75.0


def _fact(name: str, minutes: float, host: str, severity: str = "critical",
          category: str = "gpu_hardware") -> AlertFact:
    return AlertFact(f"{name}-{host}", name, T0 + timedelta(minutes=minutes), None, severity,
                     category, host, "0")


def _run(facts_at: list[tuple[float, AlertFact]], until: float, step: float = 5.0):
    """Feed facts at their arrival times (seconds), plan every ``step``; returns the rows
    written with the time they were written."""
    done: list[Mark] = []
    written: list[tuple[float, Mark, dict]] = []
    now = 0.0
    while now <= until:
        known = [f for at, f in facts_at if at <= now]
        plan = plan_markers(diagnose(known), done, now, SETTLE)
        done += plan.seen + [mark for mark, _ in plan.rows]
        written += [(now, mid, row) for mid, row in plan.rows]
        now += step
    return written


def test_start_rows_wait_for_the_settle_time_and_come_in_one_batch():
    stall = _fact("TrainingStalled", 0.7, "h2", "warning", "workload")
    xid = _fact("GpuXidError", 0, "h1")
    written = _run([(0, stall), (60, xid)], until=300)
    assert [(at, row["infra/issue_alert"]) for at, _, row in written] == [
        (135.0, "GpuXidError")], "the stall was never a root cause long enough to be written"


def test_a_run_with_ever_new_issues_still_gets_markers():
    """A new, unrelated issue every 60 s never lets the whole run settle; the oldest waiting
    issue is written after at most twice the settle time."""
    arrivals = [(60.0 * n, _fact("GpuXidError", 20 * n, f"h{n}")) for n in range(8)]
    written = _run(arrivals, until=480)
    assert written, "starved"
    first_at = written[0][0]
    assert first_at <= 2 * SETTLE
    assert all(at >= 0 + SETTLE for at, _, _ in written)


def test_a_start_row_sits_at_the_onset_every_surface_shows():
    """Where the measured change moved the issue's onset, the marker is there too (not where
    the alert began), as in the notes and on the run page."""
    diagnosis = diagnose([_fact("GpuThermalViolation", 0, "h1", "warning", "gpu_degradation")])
    (issue,) = diagnosis.issues
    moved = issue.started_at.timestamp() - 27
    settled = issue.started_at.timestamp() + 2 * SETTLE
    first = plan_markers(diagnosis, [], settled, SETTLE, {issue.key: moved})
    later = plan_markers(diagnosis, first.seen, settled + 2 * SETTLE, SETTLE,
                         {issue.key: moved})
    ((_mid, row),) = later.rows
    assert row["_timestamp"] == moved
