"""Shared by every benchmark: medians of repetitions and the results.json record."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass


@dataclass
class Result:
    """One figure, its baseline measured in the same run, and whether it met its target.

    ``ratio`` is value / baseline. ``target`` is a bound on ``value`` (``lower_is_better``) or a
    floor (otherwise), in the same unit.
    """

    name: str
    value: float
    unit: str
    baseline: float | None
    target: float | None
    lower_is_better: bool = True
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """value / baseline, or None without a baseline."""
        if not self.baseline:
            return None
        return self.value / self.baseline

    @property
    def met(self) -> bool | None:
        """Whether the target holds; None when the figure has no target."""
        if self.target is None:
            return None
        return self.value <= self.target if self.lower_is_better else self.value >= self.target

    def as_dict(self) -> dict[str, object]:
        """The JSON shape of bench/results.json."""
        data = asdict(self)
        data.pop("lower_is_better")
        data["ratio"] = None if self.ratio is None else round(self.ratio, 4)
        data["met"] = self.met
        return data


def median_seconds(fn: Callable[[], object], repeat: int = 7, warmup: int = 1) -> float:
    """Median wall time of ``fn`` over ``repeat`` calls after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
