"""Deliberate bugs the suite must catch (mutation checks).

Each mutant replaces one exact piece of the product (or of the suite's own guard) with a wrong
one, runs the tests meant to catch it, and passes only if they fail. The list names what each
part of the suite is there to catch, so a restructured suite (files merged, scenarios run at
once, promtool cases spread over group orders) can be shown to catch the same bugs as before:

    .venv/bin/python -m tests.mutants            # every mutant, one after the other
    .venv/bin/python -m tests.mutants coverage   # the mutants whose name contains "coverage"

A mutant is applied to the working tree and the file is restored afterwards, whatever happens;
it refuses to run on a file with uncommitted changes. ``tests/test_mutants.py`` checks, in the
unit layer, that every mutant still applies to the code (its text is found exactly once).
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    """One deliberate bug: ``old`` (found once in ``path``) becomes ``new``; ``tests`` must fail."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str


MUTANTS: tuple[Mutant, ...] = (
    Mutant("retry-after-ignored", "bridge/projection/delivery.py",
           "return max(delay, retry_after or 0.0)", "return delay",
           ("tests/test_bridge_delivery.py", "tests/test_bridge_wandb_outage.py"),
           "W&B's Retry-After must hold deliveries back, not the bridge's own backoff only"),
    Mutant("coverage-always-complete", "bridge/diagnosis/coverage.py",
           "return not self.blind", "return True",
           ("tests/test_endings_verdict.py",),
           "a run whose telemetry had gaps must not be judged clear"),
    Mutant("coverage-one-scrape-blinds", "bridge/prometheus/endings.py",
           "(max_over_time(up[", "(min_over_time(up[",
           ("tests/test_prometheus_queries_promtool.py",),
           "one failed scrape is no gap in a run's coverage; two in a row are"),
    Mutant("root-cause-latest", "bridge/diagnosis/root_cause.py",
           "else min(self.issues, key=lambda i: i.root.rank_key())",
           "else max(self.issues, key=lambda i: i.root.rank_key())",
           ("tests/test_bridge_diagnosis.py", "tests/test_verdict.py"),
           "the run's headline is its strongest, earliest root cause"),
    Mutant("job-log-verdict-swapped", "bridge/joblog/reading.py",
           "verdict = {LogClass.INFRASTRUCTURE: Verdict.INFRASTRUCTURE,\n"
           "                       LogClass.APPLICATION: Verdict.APPLICATION}",
           "verdict = {LogClass.INFRASTRUCTURE: Verdict.APPLICATION,\n"
           "                       LogClass.APPLICATION: Verdict.INFRASTRUCTURE}",
           ("tests/test_joblog.py",),
           "an ECC error in the log is the machine's, an out-of-memory error the model's"),
    Mutant("demo-ignores-sigterm", "demo/__main__.py",
           "for signum in (signal.SIGTERM, signal.SIGINT):",
           "for signum in (signal.SIGINT,):",
           ("tests/test_demo_signals.py",),
           "the demo stops on the first SIGTERM as on Ctrl-C"),
    Mutant("node-state-now-unread", "bridge/prometheus/remediation.py",
           "for s in self.prom.instant(expr, end):", "for s in ():",
           ("tests/test_remediation_verdict.py",),
           "a node drained since the last point of a coarse history grid is out of the pool now"),
    Mutant("leak-check-silent", "tests/conftest.py",
           "session.exitstatus = pytest.ExitCode.TESTS_FAILED",
           "session.exitstatus = session.exitstatus",
           ("tests/test_harness_processes.py",),
           "a process that outlives its test fails the run"),
    Mutant("thermal-rule-blind", "alert_rules/wandb-infra.rules.yml",
           "alert: GpuThermalViolation", "alert: GpuThermalViolationX",
           ("tests/test_rules.py",),
           "the shipped rule file is what the promtool suites test"),
)


def apply(mutant: Mutant) -> str:
    """The mutated text of the mutant's file; ValueError unless ``old`` is found exactly once."""
    text = (ROOT / mutant.path).read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise ValueError(f"{mutant.name}: {mutant.old!r} found {count} times in {mutant.path}")
    return text.replace(mutant.old, mutant.new)


def run(mutant: Mutant) -> tuple[bool, float]:
    """Apply, run its tests, restore. (caught, seconds)."""
    path = ROOT / mutant.path
    dirty = subprocess.run(["git", "diff", "--quiet", "--", mutant.path], cwd=ROOT, check=False)
    if dirty.returncode != 0:
        raise RuntimeError(f"{mutant.path} has uncommitted changes: commit them first")
    original = path.read_text()
    mutated = apply(mutant)
    started = time.monotonic()
    try:
        path.write_text(mutated)
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p",
                                 "no:cacheprovider", *mutant.tests], cwd=ROOT, check=False,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        path.write_text(original)
    return result.returncode not in (0, 5), time.monotonic() - started


def main(argv: list[str]) -> int:
    """Run the mutants named (by substring) in ``argv``, or all; exit 1 if one survived."""
    chosen = [m for m in MUTANTS if not argv or any(a in m.name for a in argv)]
    if not chosen:
        print(f"no mutant matches {argv}; known: {', '.join(m.name for m in MUTANTS)}")
        return 2
    survived = []
    for mutant in chosen:
        caught, seconds = run(mutant)
        print(f"{'caught  ' if caught else 'SURVIVED'} {mutant.name:26} {seconds:6.0f} s  "
              f"{' '.join(mutant.tests)}", flush=True)
        if not caught:
            survived.append(mutant.name)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} mutants caught")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
