"""Telemetry coverage of a run over its lifetime: which hosts and GPUs the rules could see, when.

Why: silence is only evidence when someone was listening. A run with no alert is "not the
infrastructure" only if every one of its hosts had its dcgm-exporter and node_exporter up and
every one of its GPUs reported for the whole run; otherwise the windows nobody saw are named, by
host and time. Plain data in and out: the samples come from range queries (prometheus/endings.py),
judged here on the queries' step grid.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

DCGM = "dcgm_exporter"
NODE = "node_exporter"
# What is missing when each part is: the words of the blind-window lines.
WHAT = {DCGM: "GPU telemetry", NODE: "host telemetry"}


@dataclass(frozen=True)
class Blind:
    """One window in which part of a run's telemetry was missing."""

    host: str
    what: str  # "GPU telemetry", "host telemetry" or "GPU 3"
    start: float
    end: float

    def text(self, ref: float | None = None) -> str:
        """``no GPU telemetry from gpu-node-012 from 11:40:00 to 12:31:00`` (dates only where
        the day differs from ``ref``'s)."""
        ref = self.start if ref is None else ref
        return (f"no {self.what} from {self.host} from {clock(self.start, ref)} to "
                f"{clock(self.end, ref)}")


@dataclass(frozen=True)
class Coverage:
    """What was seen of a run between ``start`` and ``end`` (unix seconds)."""

    hosts: tuple[str, ...]
    gpus: int
    start: float
    end: float
    blind: tuple[Blind, ...] = ()

    @property
    def complete(self) -> bool:
        """True when every host's exporters were up and every GPU reported throughout."""
        return not self.blind

    def span(self) -> str:
        """``on 2026-11-29 from 10:02:00 to 12:31:00 UTC`` (both dates when it crossed
        midnight)."""
        day = datetime.fromtimestamp(self.start, UTC).strftime("%Y-%m-%d")
        return f"on {day} from {clock(self.start, self.start)} to {clock(self.end, self.start)} UTC"

    def where(self) -> str:
        """``64 hosts and 512 GPUs``."""
        hosts = f"{len(self.hosts)} host{'s' if len(self.hosts) != 1 else ''}"
        return f"{hosts} and {self.gpus} GPU{'s' if self.gpus != 1 else ''}"

    def line(self, limit: int = 5) -> str:
        """The "seen through" line every issue and verdict carries."""
        head = (f"seen through: dcgm-exporter and node_exporter of {self.where()} "
                f"{self.span()}")
        if self.complete:
            return head + "; present throughout"
        shown = "; ".join(b.text(self.start) for b in self.blind[:limit])
        more = len(self.blind) - limit
        return f"{head}; gaps: {shown}" + (f"; and {more} more" if more > 0 else "")

    def as_dict(self) -> dict[str, object]:
        """JSON shape kept in the store and shown on the pages."""
        return {"hosts": list(self.hosts), "gpus": self.gpus, "start": self.start,
                "end": self.end, "blind": [[b.host, b.what, b.start, b.end] for b in self.blind]}

    @staticmethod
    def from_dict(data: Mapping[str, object]) -> Coverage:
        """Inverse of ``as_dict``."""
        blind = data.get("blind") or []
        assert isinstance(blind, list)
        hosts = data.get("hosts") or []
        assert isinstance(hosts, list)
        return Coverage(tuple(str(h) for h in hosts), int(str(data.get("gpus", 0))),
                        float(str(data["start"])), float(str(data["end"])),
                        tuple(Blind(str(h), str(w), float(s), float(e)) for h, w, s, e in blind))


def clock(ts: float, ref: float) -> str:
    """``HH:MM:SS`` UTC, with the date when ``ts`` falls on another day than ``ref``."""
    when = datetime.fromtimestamp(ts, UTC)
    same = when.date() == datetime.fromtimestamp(ref, UTC).date()
    return when.strftime("%H:%M:%S" if same else "%Y-%m-%d %H:%M:%S")


def grid(start: float, end: float, step: float) -> list[float]:
    """The evaluation times of a range query ``[start, end]`` at ``step``."""
    count = int((end - start) // step) + 1 if end >= start else 0
    return [start + k * step for k in range(count)]


def _windows(missing: Iterable[float], step: float, end: float) -> list[tuple[float, float]]:
    """Consecutive missing grid points as windows; each point stands for the step after it."""
    out: list[tuple[float, float]] = []
    for ts in sorted(missing):
        if out and ts - out[-1][1] <= step * 0.5:
            out[-1] = (out[-1][0], min(end, ts + step))
        else:
            out.append((ts, min(end, ts + step)))
    return out


def _seen(stamps: Iterable[float], start: float, step: float) -> set[int]:
    """Grid indices (from ``start``) with a sample, tolerant to float rounding."""
    return {round((ts - start) / step) for ts in stamps}


def judge(hosts: Iterable[str], gpus: Mapping[str, Iterable[str]], *, start: float, end: float,
          step: float, targets: Mapping[tuple[str, str], Iterable[float]],
          present: Mapping[tuple[str, str], Iterable[float]]) -> Coverage:
    """Coverage from what the range queries returned.

    ``targets``: (host, exporter) -> times the exporter's target was up (a time after two
    failed scrapes in a row is left out); ``present``: (host, gpu) -> times the GPU reported. A
    host with no GPU list (the exporter did not publish which GPUs the run holds) is judged on
    its exporters only. A missing dcgm-exporter hides its GPUs too, so their windows inside it
    are not repeated."""
    points = grid(start, end, step)
    host_list = tuple(sorted(set(hosts)))
    blind: list[Blind] = []
    for host in host_list:
        dark: set[int] = set()
        for exporter in (DCGM, NODE):
            seen = _seen(targets.get((host, exporter), ()), start, step)
            missing = [p for k, p in enumerate(points) if k not in seen]
            if exporter == DCGM:
                dark = {k for k in range(len(points)) if k not in seen}
            blind += [Blind(host, WHAT[exporter], s, e) for s, e in _windows(missing, step, end)]
        for gpu in sorted(gpus.get(host, ()), key=_gpu_order):
            seen = _seen(present.get((host, gpu), ()), start, step)
            missing = [p for k, p in enumerate(points) if k not in seen and k not in dark]
            blind += [Blind(host, f"GPU {gpu}", s, e) for s, e in _windows(missing, step, end)]
    blind.sort(key=lambda b: (b.start, b.host, b.what))
    total = sum(len(set(gpus.get(h, ()))) for h in host_list)
    return Coverage(host_list, total, start, end, tuple(blind))


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)
