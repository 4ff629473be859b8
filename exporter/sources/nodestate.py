"""Node-state pollers: Slurm (``scontrol show node -o`` or ``sinfo --json``) and Kubernetes Nodes.

Host names go through the exporter's HostnameMapper, so they equal the join metrics' ``hostname``.
A failing poll keeps the last good states for the grace period, like the run sources. What the
states mean is ``common.nodestate``'s.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import requests

from wandb_infra.common.commands import MAX_OUTPUT_BYTES
from wandb_infra.common.kubeapi import CONNECTION, KubeApi
from wandb_infra.common.nodestate import (
    DEFAULT_TOLERATED,
    NodeState,
    k8s_node_state,
    parse_scontrol_nodes,
    parse_sinfo_json,
)
from wandb_infra.common.schema import Key, Section
from wandb_infra.exporter.model import SourceResult
from wandb_infra.exporter.sources import SchedulerCommand, source_keys

COMMANDS = {"scontrol": ["scontrol", "show", "node", "-o"], "sinfo_json": ["sinfo", "--json"]}

SLURM_SCHEMA = Section({
    **source_keys("slurm_nodes", interval=30, timeout=10),
    "mode": Key("str", "scontrol", "scontrol (scontrol show node -o) or sinfo_json "
                "(sinfo --json)", choices=tuple(COMMANDS)),
    "command": Key("list[str]", None, "run this instead of the mode's command", optional=True),
    "max_output_bytes": Key("int", MAX_OUTPUT_BYTES, "more output is refused as a source error",
                            above=0),
}, help="each node's Slurm state (drained, down, ... and the reason) as "
        "wandb_infra_node_state and wandb_infra_node_schedulable; read-only")

KUBERNETES_SCHEMA = Section({
    **source_keys("kubernetes_nodes", interval=30, timeout=None),
    "tolerated_taints": Key("list[str]", list(DEFAULT_TOLERATED), "NoSchedule/NoExecute taint "
                            "keys the runs' pods tolerate: a node with only these is still "
                            "schedulable"),
    **CONNECTION,
}, help="each Node's state; needs 'list' on 'nodes'; a connection key not set here is taken "
        "from sources.kubernetes")


class _Published:
    """The last good states of one poller, kept for the grace period after failures."""

    def __init__(self, mapper: Callable[[str], str], grace: float,
                 clock: Callable[[], float]) -> None:
        self.mapper, self.grace, self.clock = mapper, grace, clock
        self._lock = threading.Lock()
        self._states: tuple[NodeState, ...] = ()
        self._at = 0.0

    def put(self, states: Sequence[NodeState]) -> list[str]:
        """Publish ``states`` under their mapped host names. A name that several distinct nodes
        map to (``gpu-07.rack-a`` and ``gpu-07.rack-b`` both ``gpu-07``) is published with no
        state: either node's would tell the bridge where the other stands (the faulty one
        reported out of the pool). Returns one problem per such name."""
        mapped: dict[str, NodeState] = {}
        nodes: dict[str, set[str]] = {}
        for s in states:
            host = self.mapper(s.hostname)
            nodes.setdefault(host, set()).add(s.hostname)
            mapped.setdefault(host, s._replace(hostname=host))
        shared = {h: sorted(n) for h, n in nodes.items() if len(n) > 1}
        with self._lock:
            self._states = tuple(s for h, s in mapped.items() if h not in shared)
            self._at = self.clock()
        return [f"nodes {', '.join(n)} all map to host name {h!r}: no state published for it "
                "(set hostnames.strip_domain: false or a rewrite that tells them apart)"
                for h, n in sorted(shared.items())]

    def states(self) -> tuple[NodeState, ...]:
        """What to publish now (nothing once the last good poll is older than the grace)."""
        with self._lock:
            return self._states if self.clock() - self._at <= self.grace else ()


class SlurmNodeSource(_Published):
    """Polls ``scontrol show node -o`` (default) or ``sinfo --json``."""

    def __init__(self, cfg: Mapping[str, Any], mapper: Callable[[str], str], grace: float,
                 runner: Any = subprocess.run, clock: Callable[[], float] = time.time) -> None:
        super().__init__(mapper, grace, clock)
        cfg = SLURM_SCHEMA.resolve(cfg, "node_state.slurm")
        self.name = str(cfg["name"])
        self.interval = float(cfg["interval_seconds"])
        self.command = SchedulerCommand.from_section(cfg, COMMANDS, runner)

    def poll(self) -> SourceResult:
        """Run the command; publish every node's state (a host name shared by several nodes,
        none, and a problem)."""
        parse = parse_scontrol_nodes if self.command.mode == "scontrol" else parse_sinfo_json
        states = parse(self.command.output())
        return SourceResult(problems=self.put(states))


class KubernetesNodeSource(_Published):
    """Lists Nodes with the Kubernetes source's connection settings (needs ``list nodes``)."""

    def __init__(self, cfg: Mapping[str, Any], mapper: Callable[[str], str], grace: float,
                 session: requests.Session | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(mapper, grace, clock)
        cfg = KUBERNETES_SCHEMA.resolve(cfg, "node_state.kubernetes")
        self.api = KubeApi(cfg, "node_state.kubernetes", session)
        self.name = str(cfg["name"])
        self.interval = float(cfg["interval_seconds"])
        self.tolerated = tuple(cfg["tolerated_taints"])

    def list_nodes(self) -> list[Mapping[str, Any]]:
        """Every Node (all pages)."""
        return self.api.list_all("/api/v1/nodes", "nodes")

    def poll(self) -> SourceResult:
        """List Nodes; publish each one's state (a malformed Node is skipped and reported)."""
        result, states = SourceResult(), []
        for node in self.list_nodes():
            try:
                state = k8s_node_state(node, self.tolerated)
            except (TypeError, AttributeError, ValueError) as exc:
                result.problems.append(f"skipped malformed node: {exc}")
                continue
            if state:
                states.append(state)
        result.problems += self.put(states)
        return result
