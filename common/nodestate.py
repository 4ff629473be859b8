"""Scheduler node state: is a host in the pool, drained, down, cordoned or tainted, and why.

Published as ``wandb_infra_node_state{hostname, scheduler, state, reason} 1`` and
``wandb_infra_node_schedulable{hostname, scheduler}`` (1 when new jobs may start there), so the
bridge can tell a user whether restarting a run could land on the faulty node again.

* Slurm: ``scontrol show node -o`` (one line per node; ``State=IDLE+DRAIN``, ``Reason=... [user@
  time]`` last on the line) or ``sinfo --json`` (22.05: ``state`` plus ``state_flags``; newer:
  ``state`` is a list). The state is Slurm's own text, base state and flags joined by ``+``.
* Kubernetes: ``GET /api/v1/nodes`` (paged): ``Ready``/``NotReady``/``Unknown`` from the Ready
  condition, ``SchedulingDisabled`` when cordoned (``spec.unschedulable``), ``Tainted`` when a
  NoSchedule/NoExecute taint not in ``tolerated_taints`` is set (e.g. NVSentinel's); the reason
  lists those taints and the abnormal conditions.

Parsing only: the exporter polls and publishes (``exporter.sources.nodestate``), the bridge reads
a host's state back to say whether a restart is safe and, optionally, to drain or cordon it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from wandb_infra.common.commands import json_list

STATE = "wandb_infra_node_state"
SCHEDULABLE = "wandb_infra_node_schedulable"
STATE_LABELS: tuple[str, ...] = ("hostname", "scheduler", "state", "reason")
MAX_REASON = 200

# Slurm state words (base or flag) under which no new job starts on the node. Not here, because
# the next job (a restart included) can still land there: power saving (POWERED_DOWN,
# POWERING_DOWN, POWER_DOWN: the job powers the node up) and RESERVED (the reservation's own jobs,
# often the team's restart, run there). MAINT is a maintenance reservation: out.
SLURM_OUT = frozenset({
    "DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING", "MAINT", "REBOOT_ISSUED",
    "REBOOT_REQUESTED", "FUTURE", "INVALID",
})
K8S_OUT = frozenset({"SchedulingDisabled", "Tainted", "NotReady", "Unknown"})
DEFAULT_TOLERATED = ("nvidia.com/gpu",)
_NORMAL_TRUE = {"Ready"}


class NodeState(NamedTuple):
    """One host's scheduler state as published."""

    hostname: str
    scheduler: str
    state: str
    reason: str

    @property
    def schedulable(self) -> bool:
        """True when the scheduler may start new jobs on the host."""
        return schedulable(self.scheduler, self.state)


def schedulable(scheduler: str, state: str) -> bool:
    """Whether a state string (as published) lets new jobs start on the host."""
    if scheduler == "slurm":
        words = {w.strip().rstrip("*~#$@%!^-").upper() for w in state.split("+")}
        return not words & SLURM_OUT
    return not {w.strip() for w in state.split(",")} & K8S_OUT


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 1] + "…"


_REASON_STAMP = re.compile(r"\s*\[[^\]@]*@[^\]]*\]\s*$")


def parse_scontrol_nodes(text: str) -> list[NodeState]:
    """Nodes from ``scontrol show node -o``; ``Reason=`` runs to the end of the line."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith("NodeName="):
            continue
        head, sep, reason = line.partition(" Reason=")
        fields = dict(t.partition("=")[::2] for t in head.split() if "=" in t)
        name, state = fields.get("NodeName", ""), fields.get("State", "")
        if name and state:
            reason = _REASON_STAMP.sub("", reason) if sep else ""
            out.append(NodeState(name, "slurm", state, _clip(reason)))
    return out


def parse_sinfo_json(text: str) -> list[NodeState]:
    """Nodes from ``sinfo --json`` (22.05 ``state`` + ``state_flags``; newer ``state`` lists)."""
    out, seen = [], set()
    for node in json_list(text, "sinfo --json", "nodes"):
        if not isinstance(node, Mapping) or not isinstance(node.get("name"), str):
            continue
        raw = node.get("state")
        words = [str(w) for w in raw] if isinstance(raw, list) else [str(raw or "")]
        words += [str(f) for f in node.get("state_flags") or [] if str(f) not in words]
        state = "+".join(w.upper() for w in words if w)
        if state and node["name"] not in seen:  # sinfo lists a node once per partition
            seen.add(node["name"])
            out.append(NodeState(node["name"], "slurm", state, _clip(str(node.get("reason")
                                                                         or ""))))
    return out


def k8s_node_state(node: Mapping[str, Any], tolerated: Sequence[str] = DEFAULT_TOLERATED
                   ) -> NodeState | None:
    """A Node object's state, kubectl-style (``Ready,SchedulingDisabled``), and why."""
    meta, spec, status = (node.get("metadata") or {}, node.get("spec") or {},
                          node.get("status") or {})
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    ready, why = "Unknown", []
    for cond in status.get("conditions") or []:
        if not isinstance(cond, Mapping):
            continue
        ctype, value = str(cond.get("type", "")), str(cond.get("status", ""))
        if ctype == "Ready":
            ready = "Ready" if value == "True" else ("NotReady" if value == "False" else "Unknown")
            if value != "True":
                why.append(f"Ready={value} {cond.get('reason') or ''}".strip())
        elif value == "True" and ctype not in _NORMAL_TRUE:
            message = str(cond.get("message") or cond.get("reason") or "")
            why.append(f"{ctype}=True" + (f" ({message})" if message else ""))
    words = [ready]
    if spec.get("unschedulable"):
        words.append("SchedulingDisabled")
    tainted = []
    for taint in spec.get("taints") or []:
        if not isinstance(taint, Mapping) or taint.get("effect") not in ("NoSchedule",
                                                                           "NoExecute"):
            continue
        key = str(taint.get("key", ""))
        if key in tolerated or key == "node.kubernetes.io/unschedulable":
            continue
        taint_value = taint.get("value")
        tainted.append(f"{key}{'=' + str(taint_value) if taint_value else ''}:"
                       f"{taint['effect']}")
    if tainted:
        words.append("Tainted")
        why.insert(0, "taint " + ", ".join(tainted))
    return NodeState(name, "kubernetes", ",".join(words), _clip("; ".join(why)))
