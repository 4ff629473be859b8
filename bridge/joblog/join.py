"""The job log's reading joined with the infrastructure diagnosis into one statement and verdict.

* infrastructure root cause: the log's timeouts are its consequences, and the first failing rank
  is named when the log says which one (on that GPU when host and GPU agree);
* no alert and an application error: verdict application, naming the error, rank, host and line;
* no alert and an infrastructure signature: verdict infrastructure, seen in the job's log, with
  why telemetry did not see it (the coverage gap when known, else the rules that would have);
* an alert and an application error the alert does not explain: both are said, and the alert is
  called coincident, never the cause;
* no fatal line: said so, and no cause is given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC

from wandb_infra.bridge.diagnosis.root_cause import Issue
from wandb_infra.bridge.joblog.reading import Event, Reading, Verdict
from wandb_infra.bridge.joblog.text import iso
from wandb_infra.catalog.logsignatures import BY_ID, LogClass
from wandb_infra.catalog.xid import XIDS

_EXCEPTION = re.compile(r"\b((?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception))\b")
# Exception classes too general to name an error by (the signature's meaning says more).
_GENERAL = frozenset({"RuntimeError", "Exception", "Error", "AssertionError", "OSError"})


@dataclass(frozen=True)
class Joined:
    """One story for the run: the verdict, where it came from, and the sentence that says it."""

    verdict: Verdict
    basis: str
    statement: str
    app_error: str = ""

    def as_dict(self) -> dict[str, str]:
        """JSON shape."""
        return {"verdict": str(self.verdict), "basis": self.basis, "statement": self.statement,
                "app_error": self.app_error}

    def summary(self) -> dict[str, str]:
        """The run's summary keys for the runs table: ``infra/verdict`` always,
        ``infra/app_error`` when the application's own error is the answer."""
        return {"infra/verdict": str(self.verdict),
                **({"infra/app_error": self.app_error} if self.app_error else {})}


def where(ev: Event) -> str:
    """``rank 12 (node-003 GPU 4)``, with whatever the log named."""
    place = [p for p in (ev.host, None if ev.gpu is None else f"GPU {ev.gpu}") if p]
    tasks = "tasks" if ev.task and not ev.task.isdigit() else "task"
    who = f"rank {ev.rank}" if ev.rank is not None else f"{tasks} {ev.task}" if ev.task else ""
    if who and place:
        return f"{who} ({' '.join(place)})"
    return who or " ".join(place) or "an unnamed rank"


def _when(ev: Event) -> str:
    return (f" at {iso(ev.epoch)[11:19]}" if ev.epoch is not None
            else f" at {ev.clock}" if ev.clock else "")


def error_name(ev: Event) -> str:
    """A short name for the error: the exception class the line names when it says more than
    the signature's meaning (``torch.OutOfMemoryError``), else that meaning."""
    sig = BY_ID[ev.signature]
    m = _EXCEPTION.search(ev.text)
    if m and (sig.generic or m.group(1).rsplit(".", 1)[-1] not in _GENERAL) and \
            sig.cls is not LogClass.AMBIGUOUS:
        return m.group(1)
    return sig.meaning


def _line(ev: Event) -> str:
    return f"`{ev.text}`"


def _clock(stamp: str) -> str:
    """``21:44:35`` from an ISO timestamp or a clock time."""
    return stamp[11:19] if len(stamp) >= 19 and stamp[10] == "T" else stamp


def _consequences(reading: Reading) -> str:
    if reading.cascade_ranks:
        start = f" from {_clock(reading.span[0])}" if reading.span else ""
        return (f"the NCCL timeouts and aborts on {reading.cascade_ranks} rank(s){start}")
    if reading.cascade_lines:
        return f"the {reading.cascade_lines} consequence line(s) in the job's log"
    return ""


def _consistent(ev: Event, issue: Issue) -> bool:
    """Whether the log's first error can be the alert's fault: the signature corroborates the
    alert (or its XID class), or it names the alert's host."""
    sig = BY_ID[ev.signature]
    root = issue.root
    xid = root.labels.get("xid", "")
    if root.alertname in sig.alerts:
        return True
    if xid.isdigit() and int(xid) in XIDS and XIDS[int(xid)].cls in sig.xids:
        return True
    return bool(ev.host and root.hostname and ev.host.split(".")[0] == root.hostname.split(".")[0])


def _cause(issue: Issue) -> str:
    root = issue.root
    xid = root.labels.get("xid", "")
    what = f"XID {xid}" if xid else root.alertname
    return f"{what} on {issue.where} at {issue.started_at.astimezone(UTC):%H:%M:%S}"


def join(reading: Reading, root: Issue | None, coverage: str = "") -> Joined:
    """The combined statement; ``coverage`` is the telemetry coverage line of the ended run when
    known (it names the host or time telemetry did not see)."""
    first = reading.first_error
    if root is not None:
        return _with_alert(reading, root, first)
    if first is None:
        return _without_error(reading)
    name, place = error_name(first), where(first)
    if reading.verdict is Verdict.APPLICATION:
        return Joined(Verdict.APPLICATION, "job log",
                      f"{name} on {place}{_when(first)}: {_line(first)}; no infrastructure "
                      "alert on the run's hosts", app_error=f"{name} on {place}")
    if reading.verdict is Verdict.INFRASTRUCTURE:
        sig = BY_ID[first.signature]
        missed = (f"telemetry did not see it: {coverage}" if coverage else
                  "telemetry did not see it: no alert fired"
                  + (f" (the rules that would: {', '.join(sig.alerts[:3])}; {sig.gap})"
                     if sig.alerts else " and no rule covers this fault class"))
        return Joined(Verdict.INFRASTRUCTURE, "job log",
                      f"infrastructure, seen in the job's log: {reading.meaning} on {place}"
                      f"{_when(first)}: {_line(first)}; {missed}")
    return Joined(Verdict.UNKNOWN, "job log",
                  f"the job's first error is ambiguous ({reading.meaning}) on {place}"
                  f"{_when(first)}: {_line(first)}; no alert corroborates either cause")


def _without_error(reading: Reading) -> Joined:
    origin = (f"; srun names task(s) {', '.join(map(str, reading.origin_tasks))} as the one(s) "
              "that did not just get terminated") if reading.origin_tasks else ""
    if reading.cascade_lines:
        return Joined(Verdict.UNKNOWN, "job log",
                      f"only consequences in the job's log ({_consequences(reading)}): the "
                      f"failing rank's own error is not in what was read{origin}")
    if all(s.error for s in reading.sources):
        return Joined(Verdict.UNKNOWN, "", "no console log could be read"
                      + "".join(f"; {s.error}" for s in reading.sources))
    return Joined(Verdict.UNKNOWN, "job log",
                  "no fatal line in the job's log (a silent hang or a clean exit): no cause "
                  "is given")


def _with_alert(reading: Reading, issue: Issue, first: Event | None) -> Joined:
    cause = _cause(issue)
    if first is not None and reading.verdict is Verdict.APPLICATION and \
            not _consistent(first, issue):
        name = error_name(first)
        return Joined(Verdict.APPLICATION, "job log",
                      f"{name} on {where(first)}{_when(first)}: {_line(first)}; {cause} came "
                      "in the same window but does not explain this error (a coincident alert "
                      "is not a root cause)", app_error=f"{name} on {where(first)}")
    cons = _consequences(reading)
    parts = [f"{cons} are consequences of {cause}" if cons else f"root cause {cause}"]
    if first is not None and _consistent(first, issue):
        same = (first.host and issue.root.hostname and first.gpu is not None
                and issue.root.gpu == str(first.gpu))
        parts.append(f"{where(first)}{' on that GPU' if same else ''} failed first"
                     f"{_when(first)}: {_line(first)}")
    elif first is not None:
        parts.append(f"the log's first error ({error_name(first)} on {where(first)}"
                     f"{_when(first)}) does not name that host: {_line(first)}")
    else:
        parts.append("the job's log names no failing rank")
    return Joined(Verdict.INFRASTRUCTURE, "telemetry and job log", "; ".join(parts))
