"""Optional active quarantine: take the node of a critical fault out of the pool, where the
fault needs it out of service (a GPU reset, a reboot, a replacement; never XID 94 or an
application fault). Off by default; ``dry_run`` (the default once enabled) only records.

Slurm drains the host (``scontrol update ... State=DRAIN``), Kubernetes cordons and taints it
(one merge PATCH on the Node's ``resourceVersion``). What keeps it from doing harm (each case is
in docs/reliability.md): a circuit breaker per window and in all (``max_total``, until
``--reset-breaker``); at most one action per (issue, host), remembered in the audit log and its
ledger across restarts and rotation; never returning a node to service; one JSON audit line per
decision, shown in the issue; exactly one node per host name (``one_node``), confirmed by
Slurm; no record, no action (an ``acting`` line fsynced before the scheduler is asked, and one
without its result counts as done); one breaker per audit log (``flock``); a damaged audit log
reported and skipped line by line.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wandb_infra.bridge.diagnosis.need import faulty_hosts
from wandb_infra.bridge.diagnosis.root_cause import Issue
from wandb_infra.bridge.quarantine.schedulers import (
    MAX_HOST_CHARS,
    KubernetesActions,
    QuarantineError,
    SlurmActions,
    one_node,
)
from wandb_infra.common.kubeapi import CONNECTION_SECTION
from wandb_infra.common.logsetup import log_fields
from wandb_infra.common.schema import Key, Section

log = logging.getLogger(__name__)

SCHEMA = Section({
    "enabled": Key("bool", False, "take the faulty node of an open critical issue out of the "
                   "pool where its fault needs the node out of service (a GPU reset, a reboot, "
                   "a replacement; never for XID 94 or application faults), from the "
                   "'wandb-infra-bridge quarantine' process; false: read-only"),
    "dry_run": Key("bool", True, "only record and show what it would do"),
    "scheduler": Key("str", "slurm", "slurm (scontrol update State=DRAIN; needs an operator) or "
                     "kubernetes (cordon + NoSchedule taint; needs patch on nodes)",
                     choices=("slurm", "kubernetes")),
    "max_nodes": Key("int", 2, "circuit breaker: at most this many nodes per window",
                     minimum=0),
    "max_fraction": Key("number", 0.05, "circuit breaker: at most this share of the fleet per "
                        "window", minimum=0, maximum=1),
    "window_seconds": Key("number", 3600.0, "the circuit breaker's window", above=0),
    "max_total": Key("int", 10, "circuit breaker: at most this many nodes in all until an "
                     "operator resets it (wandb-infra-bridge quarantine --reset-breaker)",
                     minimum=0),
    "audit_log": Key("str", "", "JSON-lines file of every decision (empty: "
                     "quarantine-audit.jsonl next to the store)"),
    "taint_key": Key("str", "wandb.ai/infra-quarantine", "the Kubernetes taint key and "
                     "annotation it sets", check=bool, expect="a non-empty string"),
    "slurm_command": Key("list[str]", ["scontrol"], "the scontrol command (e.g. [ssh, "
                         "slurm-head, scontrol])", check=bool, expect="a non-empty list of "
                         "strings"),
    "kubernetes": Section(CONNECTION_SECTION.keys, help="the Kubernetes connection, keys as in "
                          "the exporter's sources.kubernetes"),
}, help="optional active quarantine (off by default)")
RETRY_SECONDS = 300.0  # a refused or failed (issue, host) is looked at again after this
LEDGER_ENTRIES = 10_000  # nodes acted on remembered in the ledger (the oldest are forgotten)
@dataclass(frozen=True)
class Decision:
    """One audit-log line: what was (or would have been) done to a host for an issue."""

    at: float
    issue: str
    host: str
    outcome: str  # acting (before acting) | done | dry_run | already_out | refused | failed
    detail: str

    def text(self) -> str:
        """How the issue shows it."""
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.at))
        return {
            "done": f"quarantined {self.host} at {when} ({self.detail})",
            "dry_run": f"dry run: would have quarantined {self.host} at {when} ({self.detail})",
            "already_out": f"{self.host} was already out of the pool at {when}",
            "refused": f"not quarantined {self.host}: {self.detail}",
            "failed": f"quarantine of {self.host} failed at {when}: {self.detail}",
            "acting": f"quarantine of {self.host} started at {when}; its result was not "
                      "recorded (the bridge stopped meanwhile); counted as done",
        }.get(self.outcome, self.detail)


class Quarantine:
    """Decides and (unless dry run) acts; thread-safe; the audit log is its memory, shared with
    every process that appends to the same file (each decision holds its ``flock``)."""

    def __init__(self, cfg: Mapping[str, Any], actions: SlurmActions | KubernetesActions | None,
                 audit_log: Path, clock: Callable[[], float] = time.time) -> None:
        cfg = SCHEMA.resolve(cfg, "quarantine")
        self.dry_run = bool(cfg["dry_run"])
        self.max_nodes = int(cfg["max_nodes"])
        self.max_fraction = float(cfg["max_fraction"])
        self.window = float(cfg["window_seconds"])
        self.max_total = int(cfg["max_total"])
        self.actions, self.audit_log, self.clock = actions, audit_log, clock
        self.ledger_path = audit_log.with_name(audit_log.name + ".ledger")
        self._inode: int | None = None  # the audit log's, to notice a rotation
        self._lock = threading.Lock()
        self._decisions: list[Decision] = []
        self._offset = 0  # bytes of the audit log already read
        self._lineno = 0
        self.audit_problems: list[str] = []  # damaged lines skipped (reported, never fatal)
        self.audit_writable = True
        try:
            with self.audit_log.open("rb") as handle:
                self._read_new(handle, at_start=True)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.audit_problems.append(f"cannot read the audit log: {exc}")
        if self.audit_problems:
            log.error("quarantine audit log damaged; the damaged lines are skipped",
                      extra=log_fields(audit_log=str(self.audit_log),
                                       problems="; ".join(self.audit_problems[:5]),
                                       count=len(self.audit_problems)))

    def _read_new(self, handle: Any, at_start: bool = False) -> None:
        """Read the complete lines appended since the last read (other processes' decisions);
        a line that is not UTF-8 JSON of a decision is skipped and reported. A last line
        without its newline is a truncated write when found at start (reported; the next
        record starts on a new line), and another writer's line in progress otherwise. A new
        file under the same name (a rotation) is read from its start; what was read from the
        old one stays remembered."""
        inode = os.fstat(handle.fileno()).st_ino
        if inode != self._inode:
            self._inode, self._offset, self._lineno = inode, 0, 0
        handle.seek(self._offset)
        data = handle.read()
        complete, newline, rest = data.rpartition(b"\n")
        lines = complete.split(b"\n") if newline else []
        self._offset += len(complete) + len(newline)
        for raw in lines:
            self._lineno += 1
            self._parse(raw)
        if rest and at_start:
            self._lineno += 1
            self._offset += len(rest)
            self.audit_problems.append(f"line {self._lineno}: truncated ({len(rest)} bytes "
                                       "without a newline)")

    def _parse(self, raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            fields = json.loads(raw.decode("utf-8"))
            if not isinstance(fields, dict):
                raise TypeError("not an object")
            decision = Decision(**fields)
            if not isinstance(decision.at, int | float) or not isinstance(decision.host, str):
                raise TypeError("bad field types")
        except (ValueError, TypeError) as exc:
            problem = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else \
                f"not a decision ({type(exc).__name__})"
            self.audit_problems.append(f"line {self._lineno}: {problem}")
            return
        self._decisions.append(decision)

    @staticmethod
    def wanted(issue: Issue) -> bool:
        """Only an open issue with a critical root cause; the caller offers only issues whose
        restart decision lets the node be taken out (diagnosis/verdict.py: the fault needs the
        node out of service and that has not happened)."""
        return issue.root_ended_at is None and issue.root.severity == "critical"

    def decisions(self, issue_key: str) -> list[Decision]:
        """What was decided for an issue (shown in it): an ``acting`` line followed by its
        result shows the result only."""
        with self._lock:
            mine = [d for d in self._decisions if d.issue == issue_key]
        return [d for i, d in enumerate(mine) if d.outcome != "acting"
                or not any(later.host == d.host for later in mine[i + 1:])]

    def refresh(self) -> None:
        """Read what the acting process appended to the audit log since the last read."""
        try:
            with self._lock, self.audit_log.open("rb") as handle:
                self._read_new(handle)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("quarantine audit log not readable", extra=log_fields(error=str(exc)))

    def consider(self, issue: Issue) -> list[Decision]:
        """Act on the issue's faulty hosts where allowed; returns the new decisions."""
        if self.actions is None or not self.wanted(issue):
            return []
        out = []
        final = {"done", "already_out", "acting", *(("dry_run",) if self.dry_run else ())}
        with self._lock, self._shared() as handle:
            ledger = self._ledger() if handle is not None else None
            # clipped: a forged label of any length is refused without being stored whole
            for host in (h[:MAX_HOST_CHARS + 1] for h in faulty_hosts(issue)):
                last = next((d for d in reversed(self._decisions)
                             if d.issue == issue.key and d.host == host), None)
                if last is not None and (last.outcome in final
                                         or self.clock() - last.at < RETRY_SECONDS):
                    continue  # one action per (issue, host): idempotent, never undone
                if isinstance(ledger, Ledger) and ledger.acted_on(issue.key, host):
                    continue  # acted on before the audit log was rotated
                decision = self._decide(issue, host, handle, ledger)
                self._record(decision, handle)
                out.append(decision)
        return out

    def reset_breaker(self) -> Decision:
        """An operator's reset of the total cap: nodes acted on before it no longer count
        against ``max_total`` (they are still never acted on again for the same issue)."""
        with self._lock, self._shared() as handle:
            now = self.clock()
            ledger = self._ledger() if handle is not None else None
            if not isinstance(ledger, Ledger):
                why = ledger or "audit log not writable"
                raise QuarantineError(f"cannot reset the breaker: {why}")
            counted = ledger.since_reset()
            ledger.reset_at = now
            self._save(ledger)
            decision = Decision(now, "", "", "reset", f"circuit breaker reset by an operator; "
                                f"{counted} node(s) had been quarantined since the last reset")
            self._record(decision, handle)
            return decision

    def _ledger(self) -> Ledger | str:
        """The ledger, or why it cannot be read (then nothing is acted on)."""
        try:
            return Ledger.parse(self.ledger_path.read_bytes())
        except FileNotFoundError:
            return Ledger([], 0.0)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            return f"quarantine ledger {self.ledger_path} unreadable: {exc}"

    def _save(self, ledger: Ledger) -> None:
        """Write the ledger atomically and durably (QuarantineError when it cannot be)."""
        tmp = self.ledger_path.with_name(self.ledger_path.name + ".tmp")
        try:
            with tmp.open("wb") as handle:
                handle.write(ledger.dump())
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.ledger_path)
        except OSError as exc:
            raise QuarantineError(f"quarantine ledger not writable: {exc}") from exc

    @contextlib.contextmanager
    def _shared(self) -> Iterator[Any]:
        """The audit log opened for appending under an exclusive ``flock``, with what other
        processes appended read first (None when it cannot be opened: nothing is acted on)."""
        try:
            self.audit_log.parent.mkdir(parents=True, exist_ok=True)
            handle = self.audit_log.open("a+b")
        except OSError as exc:
            self._audit_failed(exc)
            yield None
            return
        with handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
                self._read_new(handle)
            except OSError as exc:
                self._audit_failed(exc)
                yield None
                return
            try:
                yield handle
            finally:
                with contextlib.suppress(OSError):
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _audit_failed(self, exc: OSError) -> None:
        if self.audit_writable:
            log.error("quarantine audit log not writable: nothing is quarantined until it is",
                      extra=log_fields(audit_log=str(self.audit_log), error=str(exc)))
        self.audit_writable = False

    def _decide(self, issue: Issue, host: str, handle: Any,
                ledger: Ledger | str | None) -> Decision:
        assert self.actions is not None  # consider() never decides without actions
        now = self.clock()
        reason = f"wandb-infra: {issue.root.alertname} {issue.where}"[:200]
        invalid = one_node(host)
        if invalid is not None:
            return Decision(now, issue.key, host, "refused", invalid)
        if handle is None or ledger is None:
            return Decision(now, issue.key, host, "failed",
                            "audit log not writable: nothing done (no record, no action)")
        if isinstance(ledger, str):
            return Decision(now, issue.key, host, "failed", f"{ledger}: nothing done")
        try:
            if not self.actions.in_pool(host):
                return Decision(now, issue.key, host, "already_out", "")
            counted = {"done", "acting", *(("dry_run",) if self.dry_run else ())}
            recent = {d.host for d in self._decisions
                      if d.outcome in counted and d.at > now - self.window
                      and one_node(d.host) is None}
            fleet = self.actions.fleet_size()
            limit = min(self.max_nodes, int(self.max_fraction * fleet))
            if len(recent) >= limit:
                detail = (f"circuit breaker open: {len(recent)} node(s) quarantined in the last "
                          f"{self.window:g} s, limit {limit} (max_nodes {self.max_nodes}, "
                          f"{self.max_fraction:.0%} of {fleet} nodes)")
                return Decision(now, issue.key, host, "refused", detail)
            if self.dry_run:
                return Decision(now, issue.key, host, "dry_run", f"reason '{reason}'")
            total = ledger.since_reset()
            if total >= self.max_total:
                detail = (f"circuit breaker open: {total} node(s) quarantined since the last "
                          f"reset, limit max_total {self.max_total}; an operator resets it "
                          "with 'wandb-infra-bridge quarantine --reset-breaker'")
                return Decision(now, issue.key, host, "refused", detail)
            ledger.add(issue.key, host, now)
            self._save(ledger)  # first: a crash after it never acts again, never twice
            intent = Decision(now, issue.key, host, "acting", f"reason '{reason}'")
            if not self._record(intent, handle):  # no record, no action
                return Decision(now, issue.key, host, "failed",
                                "audit log not writable: nothing done (no record, no action)")
            return Decision(self.clock(), issue.key, host, "done",
                            self.actions.isolate(host, reason))
        except QuarantineError as exc:
            return Decision(now, issue.key, host, "failed", str(exc))

    def _record(self, decision: Decision, handle: Any) -> bool:
        """Append the decision durably (fsync); False when the audit log cannot be written
        (the decision is still remembered in memory, so it is not retried at once)."""
        self._decisions.append(decision)
        written = False
        if handle is not None:
            try:
                handle.seek(0, os.SEEK_END)
                if handle.tell() and handle.tell() != self._offset:
                    self._read_new(handle)
                line = json.dumps(decision.__dict__).encode() + b"\n"
                if handle.tell() and not self._ends_with_newline(handle):
                    line = b"\n" + line  # after a truncated line: start a new one
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())
                self._offset = handle.tell()
                self._lineno += line.count(b"\n")
                written = True
            except OSError as exc:
                self._audit_failed(exc)
        if written:
            self.audit_writable = True
        level = logging.WARNING if decision.outcome in ("done", "refused", "failed") \
            else logging.INFO
        log.log(level, "quarantine decision", extra=log_fields(
            host=decision.host[:80], outcome=decision.outcome, issue=decision.issue,
            detail=decision.detail, recorded=written))
        return written

    @staticmethod
    def _ends_with_newline(handle: Any) -> bool:
        handle.seek(-1, os.SEEK_END)
        last = handle.read(1)
        handle.seek(0, os.SEEK_END)
        return bool(last == b"\n")


@dataclass
class Ledger:
    """What the audit log must not forget when it is rotated: the (issue, host) pairs acted on
    (newest ``LEDGER_ENTRIES``) and when an operator last reset the total cap."""

    acted: list[tuple[str, str, float]]
    reset_at: float

    @classmethod
    def parse(cls, raw: bytes) -> Ledger:
        data = json.loads(raw.decode("utf-8"))
        acted = [(str(i), str(h), float(a)) for i, h, a in data["acted"]]
        return cls(acted, float(data["reset_at"]))

    def dump(self) -> bytes:
        return json.dumps({"acted": self.acted[-LEDGER_ENTRIES:],
                           "reset_at": self.reset_at}).encode()

    def acted_on(self, issue: str, host: str) -> bool:
        return any(i == issue and h == host for i, h, _ in self.acted)

    def since_reset(self) -> int:
        """Distinct nodes acted on since the last reset."""
        return len({h for _, h, at in self.acted if at > self.reset_at})

    def add(self, issue: str, host: str, at: float) -> None:
        self.acted.append((issue, host, at))


def check(raw: Mapping[str, Any] | None) -> dict[str, Any]:
    """The quarantine section over its defaults, validated (ConfigError says what is wrong)."""
    return SCHEMA.resolve(raw, "quarantine")


def build(raw: Mapping[str, Any] | None, store_dir: Path,
          acting: bool = True) -> Quarantine | None:
    """The configured quarantine, or None when disabled; ``acting`` False builds only the view
    of its audit log (no scheduler client, no credentials read)."""
    cfg = check(raw)
    if not cfg["enabled"]:
        return None
    actions: SlurmActions | KubernetesActions | None = None
    if acting:
        actions = (SlurmActions(cfg["slurm_command"]) if cfg["scheduler"] == "slurm"
                   else KubernetesActions(cfg["kubernetes"], str(cfg["taint_key"])))
    audit = Path(str(cfg["audit_log"])) if cfg["audit_log"] else store_dir / \
        "quarantine-audit.jsonl"
    return Quarantine(cfg, actions, audit)
