"""What an issue cost the run, measured from its GPUs' own signals. Pure: plain data in and out.

The catalog's impact text is written before anything happened ("the job may crash"); the run's
GPUs say what did happen. For each issue the edge (prometheus/impact_reader.py) reads one signal
(tensor activity, else utilisation, else power) as three series around the root cause's onset:
the mean over the affected GPUs the run holds, the mean over all of the run's GPUs, and the
busiest of them. From those:

* **crash**: the run's join series ended while the issue was open, within ``CRASH_WINDOW`` of
  the onset, and W&B does not say the run finished (a run that finished normally did not crash,
  and one that ran on for longer ended for its own reasons);
* **hang**: the busiest GPU of the run went idle, so no GPU of the run computed;
* **slowdown**: the affected GPUs' level dropped by at least ``MIN_DROP`` (the single best
  change point in the window, so noise does not count);
* **no visible effect** otherwise.

The measured change moves the issue's onset when it came before the alert fired, searched no
earlier than ``MAX_LEAD`` before the alert's own onset and never before ``not_before`` (the run's
start, a previous issue's end): nothing can cause what happened before it existed. GPU-hours lost
are the run's GPUs times the time from that onset until recovery, the run's end or now; an issue
with no visible effect cost none.

Where the run logs its own throughput or MFU to W&B, ``with_run_metric`` measures that series
over the same window with the same change point: a fall of at least ``MIN_DROP`` is the slowdown
the run itself saw, a fall to at most ``IDLE`` of its level a hang, and either is named in the
impact line instead of the GPU signal (a crash, or a GPU hang over a mere slowdown, stands).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from statistics import median
from typing import Any

Points = Sequence[tuple[float, float]]

MAX_LEAD = 600.0  # the change is searched this long before the alert's onset, at most
AFTER = 900.0  # and this long after it fired, unless the issue ended earlier
MIN_DROP = 0.10  # a fall of the level by 10 % or more is a slowdown
IDLE = 0.02  # a ratio signal at or below this computes nothing
ACTIVE = 0.05  # below this before the change, a ratio signal was not computing anyway
MIN_SAMPLES = 3  # samples on each side of a change (one odd scrape is not a change)
RATIO_SIGNALS = ("tensor activity", "GPU utilisation")  # power is in watts: no idle level
# A fault that kills a training process ends its job within about a minute: the failed CUDA call
# returns at once, Slurm kills the job's other tasks after KillWait (30 s by default,
# https://slurm.schedmd.com/slurm.conf.html#OPT_KillWait) and Kubernetes a pod after its
# terminationGracePeriodSeconds (30 s by default, https://kubernetes.io/docs/concepts/workloads/
# pods/pod-lifecycle/#pod-termination), then the exporter's next discovery and scrape. Five
# minutes covers that with margin; a run that ended later ended for its own reasons, unless it
# stopped computing first (ranks waiting on a dead peer sit in NCCL until PyTorch's watchdog
# timeout, 10 minutes by default: github.com/pytorch/pytorch/pull/110947), which is measured as a
# hang until the run's end.
CRASH_WINDOW = 300.0
FINISHED = "finished"  # the W&B state of a run whose script exited normally
CRASH, HANG, SLOWDOWN, NONE, UNMEASURED = "crash", "hang", "slowdown", "none", "unmeasured"


@dataclass(frozen=True)
class Signals:
    """One signal of the run around an issue, as read from Prometheus."""

    signal: str  # "tensor activity", "GPU utilisation" or "power"
    where: str  # the affected GPUs, e.g. "gpu-node-065 GPUs 0-3"
    affected: Points
    run_mean: Points
    run_max: Points
    gpus: int  # GPUs the run holds
    not_before: float  # the earliest moment a cause can exist
    run_end: float | None = None  # when the run's join series ended; None: still running
    run_state: str | None = None  # the run's W&B state as last read; None: not known


@dataclass(frozen=True)
class Impact:
    """An issue's measured effect and cost."""

    kind: str
    text: str
    onset: float  # the root cause's onset, moved to the measured change when that applies
    onset_reason: str  # why it moved ("" when it did not)
    until: float  # when the cost stopped (or now)
    until_what: str  # "recovery", "the run's end", "the end", "now"
    gpus: int
    gpu_hours: float
    drop: float | None = None  # the fall of the affected GPUs' level, 0..1
    changed_at: float | None = None
    signal: str = ""

    @property
    def headline(self) -> str:
        """``Slowdown of 54%: ...``: what the impact line of the notes and pages says."""
        if self.kind == SLOWDOWN and self.drop is not None:
            return f"Slowdown of {round(self.drop * 100)}%: {self.text}"
        title = {CRASH: "Crash", HANG: "Hang", NONE: "No visible effect"}.get(self.kind, "")
        return f"{title}: {self.text}" if title else self.text

    @property
    def cost_text(self) -> str:
        """``12.3 GPU-hours (64 GPUs x 11 min 30 s from 18:42:40 until recovery at ...)``."""
        if self.kind in (NONE, UNMEASURED):
            return f"0 GPU-hours ({self.text})" if self.kind == NONE else self.text
        return (f"{hours_text(self.gpu_hours)} GPU-hours ({self.gpus} GPUs x "
                f"{duration(self.until - self.onset)} from {clock(self.onset)} until "
                f"{self.until_what}{'' if self.until_what == 'now' else ' at ' + clock(self.until)}"
                f")")

    def as_dict(self) -> dict[str, Any]:
        """The run-data contract (JSON view, ``explain --json``)."""
        return asdict(self) | {"headline": self.headline, "cost_text": self.cost_text,
                               "gpu_hours": round(self.gpu_hours, 3)}


def hours_text(hours: float) -> str:
    """GPU-hours to a sensible precision (``0.42``, ``12.3``, ``340``)."""
    return f"{hours:.2f}" if hours < 10 else (f"{hours:.1f}" if hours < 100 else f"{hours:.0f}")


def clock(ts: float) -> str:
    """``18:42:40`` UTC."""
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S")


def duration(seconds: float) -> str:
    """``29 s``, ``11 min 30 s``, ``2 h 5 min``."""
    s = round(abs(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min" + (f" {s % 60} s" if s % 60 else "")
    return f"{s // 3600} h" + (f" {s % 3600 // 60} min" if s % 3600 // 60 else "")


def _relative(at: float, fired: float) -> str:
    return (f"{duration(fired - at)} before the alert" if at < fired
            else f"{duration(at - fired)} after the alert")


def _within(points: Points, lo: float, hi: float) -> list[tuple[float, float]]:
    return sorted((float(t), float(v)) for t, v in points if lo <= float(t) <= hi)


def change_point(points: Points) -> tuple[int, float, float] | None:
    """The single split that best separates two levels (least squared error, O(n)): the index
    of the first sample at the new level, the mean before and the median after; None with
    fewer than ``MIN_SAMPLES`` samples on either side."""
    values = [v for _, v in points]
    n = len(values)
    if n < 2 * MIN_SAMPLES:
        return None
    total, total_sq = sum(values), sum(v * v for v in values)
    best: tuple[float, int] | None = None
    left = left_sq = 0.0
    for k in range(1, n):
        left += values[k - 1]
        left_sq += values[k - 1] ** 2
        if k < MIN_SAMPLES or n - k < MIN_SAMPLES:
            continue
        right, right_sq = total - left, total_sq - left_sq
        cost = (left_sq - left * left / k) + (right_sq - right * right / (n - k))
        if best is None or cost < best[0] - 1e-12:
            best = (cost, k)
    if best is None:
        return None
    k = best[1]
    return k, sum(values[:k]) / k, median(values[k:])


def _idle_span(points: Points, lo: float, end: float) -> tuple[float, float | None] | None:
    """The first time after ``lo`` the busiest GPU went idle having computed, and when it
    computed again (None: still idle), idle for at least ``MIN_SAMPLES`` samples."""
    seen = sorted((float(t), float(v)) for t, v in points if float(t) <= end)
    was_active = False
    for i, (t, v) in enumerate(seen):
        if v > IDLE:
            was_active = True
            continue
        if not was_active or t < lo:
            continue
        after = seen[i:]
        back = next((s for s, w in after if w > IDLE), None)
        idle = [s for s, _ in after if back is None or s < back]
        if len(idle) >= MIN_SAMPLES:
            return t, back
        was_active = False
    return None


def _recovered(points: Points, start: float, level: float) -> float | None:
    """When the affected GPUs were back within ``MIN_DROP / 2`` of their level before."""
    for t, v in sorted((float(t), float(v)) for t, v in points):
        if t > start and v >= level * (1 - MIN_DROP / 2):
            return t
    return None


def search_window(*, onset: float, fired: float, ended: float | None, not_before: float,
                  now: float, run_end: float | None) -> tuple[float, float]:
    """Where a change is searched: from ``MAX_LEAD`` before the onset (never before
    ``not_before``) until the issue ended or ``AFTER`` past the alert, bounded by now and the
    run's end."""
    lo = max(not_before, onset - MAX_LEAD)
    horizon = now if run_end is None else min(now, run_end)
    hi = min(horizon, ended if ended is not None else fired + AFTER)
    return lo, max(hi, min(horizon, fired))


def _moved(onset: float, changed: float | None, lo: float, fired: float,
           signal: str) -> tuple[float, str]:
    """The onset moved to a measured change before the alert fired, and why."""
    if changed is None or not lo <= changed < fired or abs(changed - onset) < 1.0:
        return onset, ""
    return changed, (f"onset moved from {clock(onset)} (the alert's start minus its rule's "
                     f"'for') to {clock(changed)}: the run's {signal} changed then, "
                     f"{_relative(changed, fired)} fired")


def _until(at: float | None, what: str, *, run_end: float | None, ended: float | None,
           now: float) -> tuple[float, str]:
    """When the cost stopped: the measured recovery or the run's end, whichever came first;
    without either the issue's end, else now."""
    options = [(at, what), (run_end, "the run's end"),
               (ended if at is None else None, "the issue's end")]
    found = [(t, w) for t, w in options if t is not None and t <= now]
    return min(found, key=lambda x: x[0]) if found else (now, "now")


def measure(signals: Signals, *, onset: float, fired: float, ended: float | None,
            now: float) -> Impact:
    """The issue's effect on the run (see the module doc). ``onset`` is the root cause's onset
    (its alert's ``startsAt`` minus the rule's ``for``), ``fired`` its ``startsAt``, ``ended``
    when the issue ended (None while open)."""
    lo, hi = search_window(onset=onset, fired=fired, ended=ended, not_before=signals.not_before,
                           now=now, run_end=signals.run_end)
    horizon = now if signals.run_end is None else min(now, signals.run_end)
    ratio = signals.signal in RATIO_SIGNALS
    gpus = signals.gpus

    def stop(at: float | None, what: str) -> tuple[float, str]:
        return _until(at, what, run_end=signals.run_end, ended=ended, now=now)

    def impact(kind: str, text: str, until: tuple[float, str], *,
               drop: float | None = None, changed: float | None = None) -> Impact:
        moved, reason = _moved(onset, changed, lo, fired, signals.signal)
        end_at = max(moved, until[0])
        return Impact(kind, text, moved, reason, end_at, until[1], gpus,
                      gpus * (end_at - moved) / 3600.0, drop, changed, signals.signal)

    run_end = signals.run_end
    if run_end is not None and crashed(signals, onset=onset, ended=ended, lo=lo):
        text = (f"the run ended at {clock(run_end)}, "
                f"{duration(run_end - onset)} after the root cause's onset")
        return impact(CRASH, text, (run_end, "the run's end"))
    if ratio:
        span = _idle_span(signals.run_max, lo, horizon)
        if span is not None and span[0] <= hi:
            began, back = span
            if back is not None:
                text = f"no GPU of the run computed from {clock(began)} to {clock(back)}"
            elif run_end is not None:
                text = (f"no GPU of the run computed from {clock(began)} until the run ended "
                        f"at {clock(run_end)}")
            else:
                text = f"no GPU of the run has computed since {clock(began)}"
            return impact(HANG, text, stop(back, "recovery"), changed=began)
    window = _within(signals.affected, lo, hi)
    found = change_point(window)
    if found is not None:
        k, before, after = found
        drop = 1 - after / before if before > (ACTIVE if ratio else 0.0) else 0.0
        if drop >= MIN_DROP:
            at = window[k][0]
            text = (f"{signals.signal} on {signals.where} fell {round(drop * 100)}% at "
                    f"{clock(at)}, {_relative(at, fired)}")
            run_found = change_point(_within(signals.run_mean, lo, hi))
            if run_found is not None and run_found[1] > 0:
                run_drop = 1 - run_found[2] / run_found[1]
                if abs(run_drop - drop) >= 0.05:
                    text += (f" (the mean over the run's {gpus} GPUs fell "
                             f"{max(0, round(run_drop * 100))}%)")
            back = _recovered(signals.affected, at, before)
            return impact(SLOWDOWN, text, stop(back, "recovery"), drop=drop, changed=at)
    if not window:
        return unmeasured(f"no {signals.signal} samples for the run's GPUs from {clock(lo)} "
                          f"to {clock(hi)}", onset, gpus)
    text = f"no change in the run's GPU activity ({signals.signal}, {clock(lo)} to {clock(hi)})"
    seen_to = ("the run's end" if run_end is not None and hi >= run_end
               else "now" if ended is None else "the issue's end")
    return Impact(NONE, text, onset, "", hi, seen_to, gpus, 0.0, 0.0, None, signals.signal)


@dataclass(frozen=True)
class RunMetric:
    """A metric the run logs itself (its W&B history), where higher is better: throughput, MFU."""

    name: str  # the history key, e.g. "mfu"
    points: Points  # (epoch seconds, value)


def with_run_metric(gpu: Impact, metric: RunMetric, *, onset: float, fired: float,
                    ended: float | None, not_before: float, now: float) -> Impact:
    """The issue's impact as the run's own metric shows it, where that fell by ``MIN_DROP`` or
    more (a slowdown) or to ``IDLE`` of its level (a hang) in the same window ``measure``
    searched; otherwise ``gpu``, the GPU-signal measurement, unchanged. A crash stands, and a
    GPU hang stands over a slowdown the metric saw (the GPUs say more). The GPUs' own finding,
    when they saw one, follows the metric's."""
    if gpu.kind == CRASH:
        return gpu
    run_end = gpu.until if gpu.until_what == "the run's end" else None
    lo, hi = search_window(onset=onset, fired=fired, ended=ended, not_before=not_before,
                           now=now, run_end=run_end)
    series = _within(metric.points, lo, hi)
    found = change_point(series)
    if found is None or found[1] <= 0:
        return gpu
    k, before, after = found
    drop = 1 - after / before
    stopped = after <= before * IDLE
    if drop < MIN_DROP or (gpu.kind == HANG and not stopped):
        return gpu
    at, signal = series[k][0], f"own {metric.name}"
    text = (f"the run's {signal} {'stopped' if stopped else f'fell {round(drop * 100)}%'} at "
            f"{clock(at)}, {_relative(at, fired)}")
    if stopped:
        text += f" (from {before:.3g} to {after:.3g})"
    if gpu.kind in (SLOWDOWN, HANG):
        text += f"; {gpu.text}"
    moved, reason = _moved(onset, at, lo, fired, signal)
    until, what = _until(_recovered(metric.points, at, before), "recovery", run_end=run_end,
                         ended=ended, now=now)
    end_at = max(moved, until)
    return Impact(HANG if stopped else SLOWDOWN, text, moved, reason, end_at, what, gpu.gpus,
                  gpu.gpus * (end_at - moved) / 3600.0, drop, at, signal)


def crashed(signals: Signals, *, onset: float, ended: float | None, lo: float) -> bool:
    """Whether the run's end counts as a crash of the issue: it ended no earlier than ``lo``
    and within ``CRASH_WINDOW`` of the onset while the issue was still open, and W&B does not
    say it finished normally."""
    run_end = signals.run_end
    if run_end is None or signals.run_state == FINISHED:
        return False
    still_open = ended is None or run_end <= ended
    return still_open and lo <= run_end <= onset + CRASH_WINDOW


def unmeasured(why: str, onset: float, gpus: int = 0) -> Impact:
    """An issue whose effect could not be read (no Prometheus, no samples): it costs nothing
    that can be stated, and the catalog's prose stays the impact text."""
    return Impact(UNMEASURED, f"not measured: {why}", onset, "", onset, "now", gpus, 0.0)


def run_gpu_hours(impacts: Iterable[Impact]) -> float:
    """The run's total: each cost interval's GPUs over the union of the intervals, so two
    issues hitting the run at once are not counted twice."""
    spans = sorted((i.onset, i.until, i.gpus) for i in impacts if i.gpu_hours > 0)
    total, current = 0.0, None
    for start, end, gpus in spans:
        if current is not None and start <= current[1]:
            if end > current[1]:
                total += current[2] * (end - current[1]) / 3600.0
                current = (current[0], end, max(current[2], gpus))
            continue
        total += gpus * (end - start) / 3600.0
        current = (start, end, gpus)
    return total
