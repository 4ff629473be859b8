"""The reading of a job's console log: its first meaningful error with the rank, host and GPU
the log names, how many ranks and hosts only showed consequences, and the time span.

Rules (the facts behind them are in ``catalog/logsignatures.py``):

* a line's signature is its most specific matching one; the first meaningful error is the
  earliest line whose class is infrastructure, application or ambiguous, and a concrete error
  beats a generic wrapper (``terminate called``, a bare Python exception) even when later;
* cascade and teardown lines never become the first error: NCCL timeouts, aborted
  communicators, a peer closing its socket, the launcher's SIGTERM/SIGKILL fan-out and the
  watchdog's abort are consequences;
* the task missing from srun's ``tasks 0-57,59-63: Terminated`` fan-out is the origin;
* with no meaningful error the verdict is ``unknown`` and no cause is made up.

The scanner is fed raw bytes: it finds candidate lines with one cheap anchor search over each
chunk (every signature's lines carry one of ``ANCHORS``; a test checks it against every example
line), so most of a multi-gigabyte log is never decoded, and its state is bounded whatever the
log's size.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import re2

from wandb_infra.bridge.joblog import text as T
from wandb_infra.catalog.logsignatures import BY_ID, BY_SPECIFICITY, LogClass, Signature
from wandb_infra.catalog.xid import XIDS, XidClass

# Every signature's lines contain one of these (checked by tests against every example line);
# RE2 finds them all in one linear pass (about 200 MB/s here, where Python's re manages 20).
ANCHORS = (b"rror", b"ERROR", b"WARN", b"NVRM", b"fallen off", b"ssert", b"Caught signal",
           b"Segmentation", b"SIGSEGV", b"CANCELLED", b"Killed", b"exitcode", b"atchdog",
           b"NCCL operations", b"entire process", b"closing signal", b"received by PID",
           b"terminate called", b"xception", b"cudaDev", b"Root Cause")
PREFILTER = re2.compile(b"|".join(re.escape(a) for a in ANCHORS))
ROOT_CAUSE_LINES = 8  # torchrun's "Root Cause (first observed failure)" block, after its title
MAX_EVENTS = 4096  # classified lines kept (the rest are only counted)
MAX_NAMES = 65_536  # distinct ranks, hosts and NCCL devices remembered
CHUNK = 8 * 1024 * 1024

_COMPILED: tuple[tuple[Signature, re.Pattern[str], re.Pattern[str] | None], ...] = tuple(
    (s, re.compile(s.pattern), re.compile(s.extract) if s.extract else None)
    for s in BY_SPECIFICITY)
_EXTRACT = {s.id: x for s, _, x in _COMPILED}
_XID = re.compile(r"\): ([0-9]+)")
_CANDIDATE = frozenset({LogClass.INFRASTRUCTURE, LogClass.APPLICATION, LogClass.AMBIGUOUS})
_TASKS = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_ROOT_FIELD = re.compile(r"\b(time|host|rank|exitcode)\s*:\s*(\S+)")
_SRUN_STATUS = re.compile(r"srun: error: (?P<host>[^:\s]+): tasks? (?P<tasks>[0-9][0-9,-]*): "
                          r"(?P<status>.+)$")


class Verdict(StrEnum):
    """What the log alone says failed."""

    INFRASTRUCTURE = "infrastructure"
    APPLICATION = "application"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Budget:
    """How much of each log is read: its tail within both limits (None: no limit)."""

    max_bytes: int | None = 8 * 1024 * 1024
    max_lines: int | None = 200_000


@dataclass(frozen=True)
class SourceStatus:
    """One log source as read: ``error`` says why nothing came from it."""

    name: str
    lines: int = 0
    bytes: int = 0
    cut: bool = False
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON shape."""
        return {"name": self.name, "lines": self.lines, "bytes": self.bytes, "cut": self.cut,
                **({"error": self.error} if self.error else {})}


@dataclass(frozen=True)
class Event:
    """One classified line: where it is, what it is, what it names."""

    signature: str
    cls: LogClass
    text: str
    source: str
    line: int
    order: tuple[int, int]
    rank: int | None = None
    host: str | None = None
    gpu: int | None = None
    pci_bus: str | None = None
    peer: str | None = None
    task: str | None = None
    clock: str | None = None
    epoch: float | None = None
    generic: bool = False
    pid: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        """The event ``as_dict`` wrote (stored evidence read back)."""
        sig = str(data["signature"])
        return cls(signature=sig, cls=LogClass(data["class"]), text=str(data["text"]),
                   source=str(data["source"]), line=int(data["line"]), order=(0, int(data["line"])),
                   rank=data.get("rank"), host=data.get("host"), gpu=data.get("gpu"),
                   pci_bus=data.get("pci_bus"), peer=data.get("peer"), task=data.get("task"),
                   clock=data.get("time"), epoch=data.get("epoch"),
                   generic=BY_ID[sig].generic if sig in BY_ID else False)

    def as_dict(self) -> dict[str, Any]:
        """JSON shape of the first error (``line`` is 1-based in its source)."""
        return {"text": self.text, "line": self.line, "source": self.source,
                "signature": self.signature, "class": str(self.cls), "rank": self.rank,
                "host": self.host, "gpu": self.gpu, "pci_bus": self.pci_bus,
                "peer": self.peer, "task": self.task, "time": self.clock,
                "epoch": self.epoch}


@dataclass(frozen=True)
class LauncherRootCause:
    """torchrun's own "Root Cause (first observed failure)" entry."""

    host: str | None
    rank: int | None
    exitcode: int | None
    time: str | None


@dataclass(frozen=True)
class Reading:
    """What the job's log says; pure data, the same wherever it is shown."""

    verdict: Verdict
    first_error: Event | None
    meaning: str
    cascade_ranks: int
    cascade_hosts: int
    cascade_lines: int
    error_lines: int
    span: tuple[str, str] | None
    quotes: tuple[str, ...]
    origin_tasks: tuple[int, ...] = ()
    launcher: LauncherRootCause | None = None
    sources: tuple[SourceStatus, ...] = ()
    cut: bool = False
    corroborates: tuple[str, ...] = ()
    gap: str = ""
    xid: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape ``explain --log --json`` prints."""
        return {
            "verdict": str(self.verdict),
            "first_error": self.first_error.as_dict() if self.first_error else None,
            "meaning": self.meaning,
            "cascade": {"ranks": self.cascade_ranks, "hosts": self.cascade_hosts,
                        "lines": self.cascade_lines},
            "error_lines": self.error_lines,
            "span": list(self.span) if self.span else None,
            "quotes": list(self.quotes),
            "origin_tasks": list(self.origin_tasks),
            "launcher_root_cause": None if self.launcher is None else asdict(self.launcher),
            "corroborated_by": list(self.corroborates),
            "telemetry_needs": self.gap,
            "xid": self.xid,
            "budget_cut": self.cut,
            "sources": [s.as_dict() for s in self.sources],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reading:
        """The reading ``as_dict`` wrote (the run service stores it as evidence)."""
        cascade, launcher = data["cascade"], data.get("launcher_root_cause")
        return cls(
            verdict=Verdict(data["verdict"]),
            first_error=None if data["first_error"] is None
            else Event.from_dict(data["first_error"]),
            meaning=str(data["meaning"]), cascade_ranks=int(cascade["ranks"]),
            cascade_hosts=int(cascade["hosts"]), cascade_lines=int(cascade["lines"]),
            error_lines=int(data["error_lines"]),
            span=None if data["span"] is None else (str(data["span"][0]), str(data["span"][1])),
            quotes=tuple(str(q) for q in data["quotes"]),
            origin_tasks=tuple(int(t) for t in data["origin_tasks"]),
            launcher=None if launcher is None else LauncherRootCause(**launcher),
            sources=tuple(SourceStatus(**s) for s in data["sources"]), cut=bool(data["budget_cut"]),
            corroborates=tuple(data["corroborated_by"]), gap=str(data.get("telemetry_needs", "")),
            xid=data.get("xid"))


def classify(line: str) -> Signature | None:
    """The line's signature: its most specific match, or None."""
    for sig, rx, _ in _COMPILED:
        if rx.search(line):
            return sig
    return None


def _int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _tasks(spec: str) -> set[int]:
    """``0-57,59-63`` as a set (ranges capped so a forged line cannot allocate much)."""
    return {n for m in _TASKS.finditer(spec) for n in range(
        int(m[1]), min(int(m[2] or m[1]), int(m[1]) + MAX_NAMES) + 1)}


def _ranges(numbers: tuple[int, ...]) -> str:
    """``(1, 2, 3, 7)`` as ``1-3,7``, srun's own notation."""
    parts: list[list[int]] = []
    for n in numbers:
        if parts and parts[-1][-1] == n - 1:
            parts[-1].append(n)
        else:
            parts.append([n])
    return ",".join(f"{p[0]}-{p[-1]}" if len(p) > 1 else str(p[0]) for p in parts)


@dataclass
class _Device:
    rank: int
    bus: str


@dataclass
class Scanner:
    """Accumulates a reading over any number of sources, chunk by chunk, in bounded memory."""

    events: list[Event] = field(default_factory=list)
    counts: dict[LogClass, int] = field(default_factory=dict)
    devices: dict[tuple[str, int, int], _Device] = field(default_factory=dict)
    rank_devices: dict[int, tuple[str, int, str]] = field(default_factory=dict)
    terminated: dict[int, str] = field(default_factory=dict)
    failed_tasks: dict[int, str] = field(default_factory=dict)
    launcher: LauncherRootCause | None = None
    sources: list[SourceStatus] = field(default_factory=list)

    def feed(self, buf: bytes, source: str, source_index: int, first_line: int = 1,
             host: str | None = None) -> int:
        """Scan ``buf`` (whole lines) whose first line is ``first_line`` of ``source``; returns
        the number of lines it held."""
        line_no, pos, seen = first_line, 0, -1
        for m in PREFILTER.finditer(buf):
            start = buf.rfind(b"\n", 0, m.start()) + 1
            if start <= seen:
                continue
            line_no += buf.count(b"\n", pos, start)
            end = buf.find(b"\n", m.end())
            end = len(buf) if end == -1 else end
            raw = buf[start:end]
            seen, pos = start, start
            if b"Root Cause" in raw:
                block_end = end
                for _ in range(ROOT_CAUSE_LINES):
                    nxt = buf.find(b"\n", block_end + 1)
                    block_end = len(buf) if nxt == -1 else nxt
                self._root_cause(buf[end:block_end])
            self.line(raw, source, source_index, line_no, host=host)
        return line_no - first_line + buf.count(b"\n", pos) + (0 if buf.endswith(b"\n") else 1)

    def _root_cause(self, block: bytes) -> None:
        if self.launcher is not None:
            return
        fields: dict[str, str] = {}
        for seg in T.segments(block.replace(b"\n", b" ")):
            for key, value in _ROOT_FIELD.findall(seg):
                fields.setdefault(key, value)
        if fields:
            self.launcher = LauncherRootCause(
                host=fields.get("host"), rank=_int(fields.get("rank")),
                exitcode=_int(fields.get("exitcode")), time=fields.get("time"))

    def line(self, raw: bytes | str, source: str, source_index: int, line_no: int, *,
             host: str | None = None, epoch: float | None = None) -> None:
        """Classify one physical line (a W&B line comes with its own timestamp)."""
        data = raw.encode("utf-8", "replace") if isinstance(raw, str) else raw
        for seg in T.segments(data):
            self._segment(seg, source, source_index, line_no, host=host, epoch=epoch)

    def _segment(self, seg: str, source: str, source_index: int, line_no: int, *,
                 host: str | None, epoch: float | None) -> None:
        pre = T.prefix(seg)
        if (init := T.COMM_INIT.search(seg)) and pre.host is not None and pre.pid is not None:
            if len(self.devices) < MAX_NAMES:
                comm_rank, dev = int(init.group("rank")), int(init.group("dev"))
                self.devices[(pre.host, pre.pid, dev)] = _Device(comm_rank, init.group("bus"))
                self.rank_devices.setdefault(comm_rank, (pre.host, dev, init.group("bus")))
            return
        sig = classify(seg)
        if sig is None:
            return
        fields: dict[str, str] = {}
        extract = _EXTRACT[sig.id]
        if extract is not None and (m := extract.search(seg)):
            fields = {k: v for k, v in m.groupdict().items() if v is not None}
        cls = sig.class_for_exit(_int(fields.get("exit")))
        code = _int(fields.get("xid"))
        if sig.id == "nvrm_xid" and code in XIDS and \
                XIDS[code].cls in (XidClass.APPLICATION, XidClass.INFORMATIONAL):
            cls = LogClass.AMBIGUOUS
        self._srun(seg)
        self.counts[cls] = self.counts.get(cls, 0) + 1
        if len(self.events) >= MAX_EVENTS:
            return
        rank = _int(fields.get("rank")) if "rank" in fields else pre.rank
        gpu = _int(fields.get("gpu") or fields.get("gpu2"))
        gpu = pre.gpu if gpu is None else gpu
        self.events.append(Event(
            signature=sig.id, cls=cls, text=T.quote(seg), source=source, line=line_no,
            order=(source_index, line_no), rank=rank,
            host=fields.get("host") or fields.get("host2") or pre.host or host,
            gpu=gpu, pci_bus=fields.get("pci"), peer=fields.get("peer"),
            task=fields.get("task") or (None if pre.task is None else str(pre.task)),
            clock=pre.clock, epoch=pre.epoch if pre.epoch is not None else epoch,
            generic=sig.generic, pid=pre.pid))

    def _srun(self, seg: str) -> None:
        m = _SRUN_STATUS.search(seg)
        if not m:
            return
        target = self.terminated if m.group("status").strip() == "Terminated" \
            else self.failed_tasks
        for task in _tasks(m.group("tasks")):
            if len(target) < MAX_NAMES:
                target[task] = m.group("host")

    def _complete(self, ev: Event) -> Event:
        """Fill the event's rank, host and GPU from NCCL's communicator lines."""
        rank, host, gpu, bus = ev.rank, ev.host, ev.gpu, ev.pci_bus
        if host is not None and ev.pid is not None and gpu is not None:
            dev = self.devices.get((host, ev.pid, gpu))
            if dev is not None:
                rank = dev.rank if rank is None else rank
                bus = bus or dev.bus
        if rank is not None and rank in self.rank_devices:
            r_host, r_dev, r_bus = self.rank_devices[rank]
            if host is None or host == r_host:
                host, gpu, bus = r_host, r_dev if gpu is None else gpu, bus or r_bus
        launcher = self.launcher
        if launcher is not None and ev.cls in _CANDIDATE and rank is not None and \
                launcher.rank == rank and host is None:
            host = launcher.host
        return Event(**{**ev.__dict__, "rank": rank, "host": host, "gpu": gpu,
                        "pci_bus": bus})

    def origin_tasks(self) -> tuple[int, ...]:
        """The srun tasks that failed: those reported with another status than Terminated,
        else the few missing from the Terminated fan-out."""
        if self.failed_tasks:
            return tuple(sorted(self.failed_tasks))[:8]
        if not self.terminated:
            return ()
        missing = set(range(max(self.terminated) + 1)) - set(self.terminated)
        return tuple(sorted(missing)) if 0 < len(missing) <= 3 else ()

    def reading(self) -> Reading:
        """The reading of everything fed so far."""
        candidates = [e for e in self.events if e.cls in _CANDIDATE]
        pool = [e for e in candidates if not e.generic] or candidates
        first = None
        if pool:
            timed = all(e.epoch is not None for e in pool)
            first = self._complete(min(pool, key=lambda e: (e.epoch, e.order) if timed
                                       else (0.0, e.order)))
        origin = self.origin_tasks()
        if first is not None and first.rank is None and first.task is None and origin:
            named = {self.failed_tasks.get(t) or self.terminated.get(t) for t in origin}
            first = Event(**{**first.__dict__, "task": _ranges(origin),
                             "host": first.host or (named.pop() if len(named) == 1 else None)})
        consequence = [e for e in self.events
                       if e.cls in (LogClass.CASCADE, LogClass.TEARDOWN)]
        active_ranks = {e.rank for e in candidates if e.rank is not None}
        active_hosts = {e.host for e in candidates if e.host is not None}
        ranks = {e.rank for e in consequence if e.rank is not None} - active_ranks
        hosts = {e.host for e in consequence if e.host is not None} - active_hosts
        epochs = [e.epoch for e in self.events if e.epoch is not None]
        clocks = [e.clock for e in self.events if e.clock is not None]
        span = ((T.iso(min(epochs)), T.iso(max(epochs))) if epochs
                else (clocks[0], clocks[-1]) if clocks else None)
        verdict, meaning, sig = Verdict.UNKNOWN, "", None
        if first is not None:
            sig = next(s for s, _, _ in _COMPILED if s.id == first.signature)
            meaning = sig.meaning
            verdict = {LogClass.INFRASTRUCTURE: Verdict.INFRASTRUCTURE,
                       LogClass.APPLICATION: Verdict.APPLICATION}.get(first.cls,
                                                                     Verdict.UNKNOWN)
        xid = None
        if first is not None and first.signature == "nvrm_xid" and (m := _XID.search(first.text)):
            xid = int(m.group(1))
        return Reading(
            verdict=verdict, first_error=first, meaning=meaning,
            cascade_ranks=len(ranks), cascade_hosts=len(hosts),
            cascade_lines=self.counts.get(LogClass.CASCADE, 0)
            + self.counts.get(LogClass.TEARDOWN, 0),
            error_lines=sum(self.counts.get(c, 0) for c in _CANDIDATE),
            span=span, quotes=self._quotes(first), origin_tasks=origin,
            launcher=self.launcher, sources=tuple(self.sources),
            cut=any(s.cut for s in self.sources),
            corroborates=sig.alerts if sig is not None else (), gap=sig.gap if sig else "",
            xid=xid)

    def _quotes(self, first: Event | None) -> tuple[str, ...]:
        """At most ``QUOTE_LINES`` lines: the first error, then the first line of each other
        signature in log order (errors before consequences)."""
        out: list[str] = [first.text] if first is not None else []
        seen = {first.signature} if first is not None else set()
        ordered = sorted(self.events, key=lambda e: (e.cls not in _CANDIDATE, e.order))
        for ev in ordered:
            if len(out) >= T.QUOTE_LINES:
                break
            if ev.signature not in seen:
                seen.add(ev.signature)
                out.append(ev.text)
        return tuple(out)


def tail(path: str, budget: Budget) -> tuple[bytes, bool]:
    """The file's last whole lines within ``budget`` and whether the budget cut it."""
    with open(path, "rb") as handle:
        handle.seek(0, 2)
        size = handle.tell()
        start = 0 if budget.max_bytes is None else max(0, size - budget.max_bytes)
        handle.seek(start)
        data = handle.read()
    cut = start > 0
    if cut:
        data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
    if budget.max_lines is not None and data.count(b"\n") > budget.max_lines:
        at = len(data)
        for _ in range(budget.max_lines + (1 if data.endswith(b"\n") else 0)):
            at = data.rfind(b"\n", 0, at)
        data, cut = data[at + 1:], True
    return data, cut


def stream(path: str, chunk: int = CHUNK) -> Iterator[tuple[bytes, int]]:
    """The whole file as chunks of whole lines, each with the number of its first line."""
    line_no, rest = 1, b""
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            block = rest + block
            cut = block.rfind(b"\n") + 1
            if cut == 0:
                rest = block
                continue
            yield block[:cut], line_no
            line_no += block.count(b"\n", 0, cut)
            rest = block[cut:]
    if rest:
        yield rest, line_no
