"""Optional active quarantine: take a node with a critical hardware root cause out of the pool.

Off by default; ``dry_run`` (the default once enabled) only records what it would do. For an open
issue whose root cause is a critical hardware fault (XID 79/94/95, double-bit ECC, fallen off the
bus, ...), the faulty host is drained in Slurm (``scontrol update NodeName=... State=DRAIN
Reason=...``) or cordoned and tainted in Kubernetes (one merge PATCH carrying the Node's
``resourceVersion``; a 409 conflict is retried on a fresh read). Rules that keep it from doing harm:

* a circuit breaker: at most ``max_nodes`` nodes, and at most ``max_fraction`` of the fleet, per
  ``window_seconds``; beyond it nothing is done and the refusal is audit-logged;
* idempotent: at most one action per (issue, host), remembered in the audit log across restarts,
  so a node an operator returned to service is not taken out again for the same event; a node
  already out of the pool is left alone;
* never returns a node to service: there is no resume or uncordon anywhere in this module;
* every decision (done, would do in dry run, skipped, refused by the breaker, failed) is one JSON
  line in the audit log and is shown in the issue.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from wandb_infra.bridge.diagnosis import Issue
from wandb_infra.bridge.remediation import faulty_hosts
from wandb_infra.catalog.vocabulary import CauseClass
from wandb_infra.common.commands import SourceError, run_command
from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.kubeapi import KubeApi
from wandb_infra.common.logsetup import log_fields
from wandb_infra.common.nodestate import k8s_node_state, parse_scontrol_nodes

log = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    "enabled": False, "dry_run": True, "scheduler": "slurm", "max_nodes": 2,
    "max_fraction": 0.05, "window_seconds": 3600.0, "audit_log": "",
    "taint_key": "wandb.ai/infra-quarantine", "slurm_command": ["scontrol"],
    "kubernetes": {},
}
RETRY_SECONDS = 300.0  # a refused or failed (issue, host) is looked at again after this


class QuarantineError(RuntimeError):
    """The scheduler refused or could not be reached; the message says which."""


@dataclass(frozen=True)
class Decision:
    """One audit-log line: what was (or would have been) done to a host for an issue."""

    at: float
    issue: str
    host: str
    outcome: str  # done | dry_run | already_out | refused | failed
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
        }.get(self.outcome, self.detail)


class SlurmActions:
    """Drain through ``scontrol`` (needs SlurmUser, root or an operator account)."""

    def __init__(self, command: Sequence[str], timeout: float = 15.0,
                 runner: Callable[..., Any] = subprocess.run) -> None:
        self.command, self.timeout, self._run = list(command), timeout, runner

    def _call(self, *args: str) -> str:
        try:
            return run_command([*self.command, *args], self.timeout, self._run)
        except SourceError as exc:
            raise QuarantineError(str(exc)) from exc

    def fleet_size(self) -> int:
        """Nodes Slurm knows."""
        return len(parse_scontrol_nodes(self._call("show", "node", "-o")))

    def in_pool(self, host: str) -> bool:
        """Whether new jobs may start on ``host`` now."""
        nodes = parse_scontrol_nodes(self._call("show", "node", "-o", host))
        if not nodes:
            raise QuarantineError(f"Slurm does not know node {host}")
        return nodes[0].schedulable

    def isolate(self, host: str, reason: str) -> str:
        """Drain: running jobs finish, no new job starts."""
        self._call("update", f"NodeName={host}", "State=DRAIN", f"Reason={reason}")
        return f"drained, reason '{reason}'"


class KubernetesActions:
    """Cordon and taint with one merge PATCH (needs 'get', 'list' and 'patch' on nodes)."""

    def __init__(self, cfg: Mapping[str, Any], taint_key: str,
                 session: requests.Session | None = None) -> None:
        self.api = KubeApi(cfg, session)
        self.taint_key = taint_key

    def _request(self, method: str, path: str, body: Any = None) -> requests.Response:
        try:
            return self.api.request(method, path, data=None if body is None else json.dumps(body),
                                    content_type=None if body is None
                                    else "application/merge-patch+json")
        except SourceError as exc:
            raise QuarantineError(str(exc)) from exc

    def _get(self, host: str) -> dict[str, Any]:
        """The Node named ``host``, or the one node whose name's first DNS label is ``host``
        (the exporter strips domains, so alerts may name ``gpu01`` for ``gpu01.example``)."""
        resp = self._request("GET", f"/api/v1/nodes/{host}")
        if resp.status_code == 404:
            found = [n for n in self._nodes()
                     if str((n.get("metadata") or {}).get("name", "")).split(".")[0] == host]
            if len(found) == 1:
                return found[0]
        if resp.status_code != 200:
            raise QuarantineError(f"GET node {host}: HTTP {resp.status_code}")
        return resp.json()

    def _nodes(self) -> list[dict[str, Any]]:
        resp = self._request("GET", "/api/v1/nodes")
        if resp.status_code != 200:
            raise QuarantineError(f"list nodes: HTTP {resp.status_code}")
        return [n for n in resp.json().get("items") or [] if isinstance(n, dict)]

    def fleet_size(self) -> int:
        """Nodes in the cluster."""
        return len(self._nodes())

    def in_pool(self, host: str) -> bool:
        """Whether new pods may be scheduled on ``host`` now."""
        state = k8s_node_state(self._get(host))
        return state is None or state.schedulable

    def isolate(self, host: str, reason: str, attempts: int = 4) -> str:
        """Cordon and add the NoSchedule taint; on a 409 conflict read again and retry."""
        for _ in range(attempts):
            node = self._get(host)
            name = node["metadata"]["name"]
            taints = [t for t in (node.get("spec") or {}).get("taints") or []
                      if t.get("key") != self.taint_key]
            taints.append({"key": self.taint_key, "value": "true", "effect": "NoSchedule"})
            patch = {"metadata": {"resourceVersion": node["metadata"]["resourceVersion"],
                                  "annotations": {self.taint_key: reason[:250]}},
                     "spec": {"unschedulable": True, "taints": taints}}
            resp = self._request("PATCH", f"/api/v1/nodes/{name}", patch)
            if resp.status_code == 200:
                return (f"cordoned node {name} and tainted it {self.taint_key}:NoSchedule, "
                        f"reason '{reason}'")
            if resp.status_code != 409:
                raise QuarantineError(f"PATCH node {name}: HTTP {resp.status_code} "
                                      f"{resp.text[:200]}")
        raise QuarantineError(f"PATCH node {host}: still conflicting after {attempts} tries")


class Quarantine:
    """Decides and (unless dry run) acts; thread-safe; the audit log is its memory."""

    def __init__(self, cfg: Mapping[str, Any], actions: SlurmActions | KubernetesActions,
                 audit_log: Path, clock: Callable[[], float] = time.time) -> None:
        self.dry_run = bool(cfg.get("dry_run", True))
        self.max_nodes = int(cfg.get("max_nodes", 2))
        self.max_fraction = float(cfg.get("max_fraction", 0.05))
        self.window = float(cfg.get("window_seconds", 3600.0))
        self.actions, self.audit_log, self.clock = actions, audit_log, clock
        self._lock = threading.Lock()
        self._decisions: list[Decision] = []
        if audit_log.exists():
            for line in audit_log.read_text(encoding="utf-8").splitlines():
                try:
                    self._decisions.append(Decision(**json.loads(line)))
                except (ValueError, TypeError):
                    continue

    @staticmethod
    def wanted(issue: Issue) -> bool:
        """Only an open issue whose root cause is a critical hardware fault."""
        root = issue.root
        return (issue.root_ended_at is None and root.cause is CauseClass.HARDWARE
                and root.severity == "critical")

    def decisions(self, issue_key: str) -> list[Decision]:
        """What was decided for an issue (shown in it)."""
        with self._lock:
            return [d for d in self._decisions if d.issue == issue_key]

    def consider(self, issue: Issue) -> list[Decision]:
        """Act on the issue's faulty hosts where allowed; returns the new decisions."""
        if not self.wanted(issue):
            return []
        out = []
        final = {"done", "already_out", *(("dry_run",) if self.dry_run else ())}
        with self._lock:
            for host in faulty_hosts(issue):
                last = next((d for d in reversed(self._decisions)
                             if d.issue == issue.key and d.host == host), None)
                if last is not None and (last.outcome in final
                                         or self.clock() - last.at < RETRY_SECONDS):
                    continue  # one action per (issue, host): idempotent, never undone
                decision = self._decide(issue, host)
                self._record(decision)
                out.append(decision)
        return out

    def _decide(self, issue: Issue, host: str) -> Decision:
        now = self.clock()
        reason = f"wandb-infra: {issue.root.alertname} {issue.where}"[:200]
        try:
            if not self.actions.in_pool(host):
                return Decision(now, issue.key, host, "already_out", "")
            counted = {"done", *(("dry_run",) if self.dry_run else ())}
            recent = {d.host for d in self._decisions
                      if d.outcome in counted and d.at > now - self.window}
            fleet = self.actions.fleet_size()
            limit = min(self.max_nodes, int(self.max_fraction * fleet))
            if len(recent) >= limit:
                detail = (f"circuit breaker open: {len(recent)} node(s) quarantined in the last "
                          f"{self.window:g} s, limit {limit} (max_nodes {self.max_nodes}, "
                          f"{self.max_fraction:.0%} of {fleet} nodes)")
                return Decision(now, issue.key, host, "refused", detail)
            if self.dry_run:
                return Decision(now, issue.key, host, "dry_run", f"reason '{reason}'")
            return Decision(now, issue.key, host, "done", self.actions.isolate(host, reason))
        except QuarantineError as exc:
            return Decision(now, issue.key, host, "failed", str(exc))

    def _record(self, decision: Decision) -> None:
        self._decisions.append(decision)
        self.audit_log.parent.mkdir(parents=True, exist_ok=True)
        with self.audit_log.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(decision.__dict__) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        level = logging.WARNING if decision.outcome in ("done", "refused", "failed") \
            else logging.INFO
        log.log(level, "quarantine decision", extra=log_fields(
            host=decision.host, outcome=decision.outcome, issue=decision.issue,
            detail=decision.detail))


def check(raw: Mapping[str, Any] | None) -> dict[str, Any]:
    """The quarantine section over its defaults, validated (ConfigError says what is wrong)."""
    cfg = {**DEFAULTS, **(raw or {})}
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown keys in quarantine: {', '.join(unknown)}")
    if cfg["scheduler"] not in ("slurm", "kubernetes"):
        raise ConfigError("quarantine.scheduler must be 'slurm' or 'kubernetes'")
    command = cfg["slurm_command"]
    if not isinstance(command, list) or not command or not all(isinstance(c, str)
                                                                 for c in command):
        raise ConfigError("quarantine.slurm_command must be a list of strings")
    try:
        ok = (int(cfg["max_nodes"]) >= 0 and 0 <= float(cfg["max_fraction"]) <= 1
              and float(cfg["window_seconds"]) > 0)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError("quarantine: max_nodes >= 0, 0 <= max_fraction <= 1, "
                          "window_seconds > 0")
    return cfg


def build(raw: Mapping[str, Any] | None, store_dir: Path) -> Quarantine | None:
    """The configured quarantine, or None when disabled."""
    cfg = check(raw)
    if not cfg["enabled"]:
        return None
    actions: SlurmActions | KubernetesActions
    if cfg["scheduler"] == "slurm":
        actions = SlurmActions(cfg["slurm_command"])
    else:
        actions = KubernetesActions(cfg["kubernetes"] or {}, str(cfg["taint_key"]))
    audit = Path(str(cfg["audit_log"])) if cfg["audit_log"] else store_dir / \
        "quarantine-audit.jsonl"
    return Quarantine(cfg, actions, audit)
