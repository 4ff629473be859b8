"""Talking to the scheduler for the quarantine (``actuator.py`` decides): is a host one node,
is it in the pool, take it out (Slurm drain through ``scontrol``; Kubernetes cordon and taint
with one merge PATCH carrying the Node's ``resourceVersion``, a 409 conflict retried on a fresh
read). Nothing here ever returns a node to service.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import requests

from wandb_infra.common.commands import SourceError, run_command
from wandb_infra.common.kubeapi import CONNECTION_SECTION, KubeApi
from wandb_infra.common.nodestate import k8s_node_state, parse_scontrol_nodes

MAX_HOST_CHARS = 253  # a DNS name; longer label text is refused (and clipped in the audit log)
# One node name: DNS labels (letters, digits, '-' and '_' inside), dot-separated. Everything
# Slurm or Kubernetes would read as more than one node is outside it: ',' lists, '[02-40]'
# hostlist ranges, '*' / '?' wildcards, spaces, '=' (another scontrol argument), '/'.
_NODE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?"
                        r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?)*")
_RESERVED = {"all", "localhost"}


def one_node(host: str) -> str | None:
    """Why ``host`` is not exactly one node name (None when it is)."""
    if not host or len(host) > MAX_HOST_CHARS:
        return f"host name of {len(host)} characters is not one node name"
    if not _NODE_NAME.fullmatch(host):
        return ("host name is not one node name (host lists, hostlist ranges, wildcards, "
                "spaces and other punctuation are refused)")
    return f"host name '{host}' is reserved, not one node" if host.lower() in _RESERVED else None


class QuarantineError(RuntimeError):
    """The scheduler refused or could not be reached; the message says which."""


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
        if one_node(host) is not None:  # never hand Slurm a hostlist expression
            raise QuarantineError(f"not one node name: {host[:80]!r}")
        nodes = parse_scontrol_nodes(self._call("show", "node", "-o", host))
        if not nodes:
            raise QuarantineError(f"Slurm does not know node {host}")
        if len(nodes) != 1 or nodes[0].hostname != host:
            raise QuarantineError(f"Slurm names {len(nodes)} node(s) for {host!r}, not exactly "
                                  "that one node")
        return nodes[0].schedulable

    def isolate(self, host: str, reason: str) -> str:
        """Drain: running jobs finish, no new job starts."""
        if one_node(host) is not None:
            raise QuarantineError(f"not one node name: {host[:80]!r}")
        self._call("update", f"NodeName={host}", "State=DRAIN", f"Reason={reason}")
        return f"drained, reason '{reason}'"


class KubernetesActions:
    """Cordon and taint with one merge PATCH (needs 'get', 'list' and 'patch' on nodes)."""

    def __init__(self, cfg: Mapping[str, Any], taint_key: str,
                 session: requests.Session | None = None) -> None:
        where = "quarantine.kubernetes"
        self.api = KubeApi(CONNECTION_SECTION.resolve(cfg, where), where, session)
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
        if one_node(host) is not None:  # never a path such as '../nodes' or a selector
            raise QuarantineError(f"not one node name: {host[:80]!r}")
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
