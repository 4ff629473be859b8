"""Reading what the restart verdict needs from Prometheus, and the verdict as issues carry it.

For each issue's faulty hosts, range queries from shortly before the issue to now: the scheduler
state (the exporter's ``wandb_infra_node_state``, or kube-state-metrics' cordon and taints, less
those the run's pods tolerate), the evidence of a recovery action (the driver's recovery action
per GPU, the GPUs' UUIDs and count, ``node_boot_time_seconds``) and whether the host is a repeat
offender. ``diagnosis/verdict.py`` decides; its ``Decision`` becomes the ``Remediation`` every
surface and the quarantine read. Without Prometheus each issue still gets a verdict.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from wandb_infra.bridge.diagnosis.evidence import Change, GpuEvidence, HostEvidence, Timeline
from wandb_infra.bridge.diagnosis.need import Policy, faulty_hosts
from wandb_infra.bridge.diagnosis.root_cause import Diagnosis, Issue
from wandb_infra.bridge.diagnosis.verdict import NO_PROMETHEUS, Decision, decide
from wandb_infra.bridge.prometheus.client import PrometheusClient, PrometheusError, regex_literal
from wandb_infra.bridge.prometheus.history import pick_step
from wandb_infra.catalog import series
from wandb_infra.catalog.alerts import ALERTS, PLAIN_VALUES
from wandb_infra.catalog.host_alerts import HOST_REPEAT_OFFENDER
from wandb_infra.catalog.template import fill
from wandb_infra.common.nodestate import DEFAULT_TOLERATED, STATE

__all__ = ["Change", "NodeStateHistory", "Remediation", "Timeline", "exclusion", "faulty_hosts",
           "remediations_for", "signature", "summary_verdict"]

log = logging.getLogger(__name__)

LEAD = 600.0  # history starts this long before the issue: the state the fault found
MAX_STEPS = 2000
DOWN_BACKOFF = 30.0  # after a failed query, Prometheus is not asked again for this long
STEPS = (1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0)
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_TIMES = re.compile(r"(\d{4}-\d{2}-\d{2} )?\d{2}:\d{2}:\d{2}( UTC)?")
_CORDON_TAINT = "node.kubernetes.io/unschedulable"  # the cordon's own taint: read as the cordon
BOOT_TIME = """
max by (hostname) (
  max by (instance, job) (node_boot_time_seconds)
  * on (instance, job) group_left (hostname)
  ${TARGET}
)
"""


@dataclass(frozen=True)
class Remediation:
    """An issue's restart verdict as W&B and the pages show it: the decision's verdict, why,
    the exclusion, what to do and what the fault needs, each faulty host's state history, and
    what the quarantine did (``action``)."""

    verdict: str
    detail: str
    exclusion: str
    timelines: tuple[Timeline, ...]
    action: str = ""
    advice: str = ""
    needs: str = ""
    drain: bool = False

    @classmethod
    def of(cls, decision: Decision, timelines: Mapping[str, Timeline] | None) -> Remediation:
        """The issue's remediation from its decision and its hosts' timelines."""
        lines = tuple((timelines or {}).get(h) or Timeline(h, (), None) for h in decision.hosts)
        return cls(decision.verdict, decision.detail, decision.exclusion, lines,
                   advice=decision.advice, needs=decision.need.words, drain=decision.drain)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Remediation:
        """Inverse of ``dataclasses.asdict`` (the run service stores the worker's)."""
        def change(c: dict[str, Any] | None) -> Change | None:
            return None if c is None else Change(**c)
        lines = tuple(Timeline(t["hostname"], tuple(Change(**c) for c in t["changes"]),
                               change(t["current"])) for t in data["timelines"])
        return Remediation(**{**data, "timelines": lines})

    def as_dict(self) -> dict[str, Any]:
        """The run-data contract: verdict, detail, exclusion, advice, needs, hosts (current
        state, since), and ``action`` when the quarantine decided something."""
        hosts = [{"hostname": t.hostname, "state": now.state if now else "unknown",
                  "reason": now.reason if now else "", "since": _iso(now.at) if now else ""}
                 for t in self.timelines for now in (t.current,)]
        out = {"verdict": self.verdict, "detail": self.detail, "exclusion": self.exclusion,
               "advice": self.advice, "needs": self.needs, "hosts": hosts}
        return out | ({"action": self.action} if self.action else {})

    def history_lines(self) -> list[str]:
        """One line per host: ``h: in service (IDLE) 11:50:02; out of the pool ...``."""
        return [f"{t.hostname}: " + "; ".join(_describe(t.changes)) for t in self.timelines
                if t.changes]


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _clock(ts: float, previous: float | None) -> str:
    when = datetime.fromtimestamp(ts, UTC)
    same_day = previous is not None and datetime.fromtimestamp(previous, UTC).date() == when.date()
    return when.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M:%S UTC")


def _describe(changes: Sequence[Change]) -> list[str]:
    out, previous, was_in = [], None, None
    for c in changes:
        if not c.state:
            text = f"no scheduler data from {_clock(c.at, previous)}"
        else:
            what = ("out of the pool" if not c.in_pool
                    else "back in service" if was_in is False else "in service")
            # the first entry is the state the history window starts with, not a change
            when = "as of" if previous is None else "from"
            text = f"{what} ({c.state}) {when} {_clock(c.at, previous)}"
            if c.reason:
                text += f", reason '{c.reason}'"
            was_in = c.in_pool
        out.append(text)
        previous = c.at
    return out


def exclusion(hosts: Sequence[str], scheduler: str) -> str:
    """How to keep a restart off ``hosts``: an sbatch option or a pod-spec affinity snippet
    (host names that are not plain DNS labels are left out: they come from alert labels)."""
    hosts = [h for h in hosts if _HOST.fullmatch(h)]
    if not hosts:
        return ""
    if scheduler == "slurm":
        return f"sbatch --exclude={','.join(hosts)}"
    if scheduler == "kubernetes":
        values = ", ".join(json.dumps(h) for h in hosts)
        return ("affinity:\n  nodeAffinity:\n    requiredDuringSchedulingIgnoredDuringExecution:"
                "\n      nodeSelectorTerms:\n      - matchExpressions:\n"
                "        - key: kubernetes.io/hostname\n          operator: NotIn\n"
                f"          values: [{values}]")
    return ""


def remediations_for(diagnosis: Diagnosis, policy: Policy,
                     read: tuple[dict[str, Timeline], dict[str, HostEvidence]] | None,
                     now: float, *, scheduler: str = "",
                     unread: str = NO_PROMETHEUS) -> dict[str, Remediation]:
    """Issue key -> remediation for every issue that names a host. ``read`` is what
    Prometheus gave (None: nothing, ``unread`` says why); ``scheduler`` is the exclusion's
    syntax when no host's state says it."""
    timelines, evidence = read if read is not None else (None, None)
    decisions = {issue.key: decide(issue, policy, timelines=timelines, evidence=evidence,
                                   now=now, unread=unread, exclusion_for=lambda hosts, known:
                                   exclusion(hosts, known or scheduler))
                 for issue in diagnosis.issues}
    return {k: Remediation.of(d, timelines) for k, d in decisions.items() if d is not None}


def signature(remediations: Mapping[str, Remediation]) -> str:
    """A short digest of what the issues show about remediation (a change re-writes the run).
    Times are left out: a state seen only in the read of now is dated at that read, and the
    grid dates it later, so its time moves between refreshes while nothing changed; what a
    host went through is the sequence of its states."""
    data = sorted(
        (key, r.verdict, _TIMES.sub("<t>", r.detail), r.exclusion, r.action,
         [(t.hostname, [(c.state, c.reason) for c in t.changes]) for t in r.timelines])
        for key, r in remediations.items())
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:16]


class NodeStateHistory:
    """Reads the faulty hosts' scheduler history and recovery evidence from Prometheus (range
    queries). Only the worker and the quarantine process read, each on its own thread; what the
    worker read is stored with the run (``runs/service.py``) and shown while Prometheus fails."""

    def __init__(self, prom: PrometheusClient, *, clock: Callable[[], float] = time.time,
                 tolerated_taints: Sequence[str] = DEFAULT_TOLERATED) -> None:
        self.prom = prom
        self.clock = clock
        self.tolerated = (*tolerated_taints, _CORDON_TAINT)
        self._down_until = 0.0

    def for_diagnosis(self, diagnosis: Diagnosis, policy: Policy | None = None, *,
                      scheduler: str = "") -> dict[str, Remediation] | None:
        """Issue key -> remediation for every issue that names a host; None when Prometheus
        cannot answer and nothing was read before (the caller keeps what it shows)."""
        wanted = [i for i in diagnosis.issues if faulty_hosts(i)]
        if not wanted:
            return {}
        hosts = tuple(sorted({h for i in wanted for h in faulty_hosts(i)}))
        start = min(i.started_at.timestamp() for i in wanted) - LEAD
        read = self.read(hosts, start)
        if read is None:
            return None
        return remediations_for(diagnosis, policy or Policy(), read, self.clock(),
                                scheduler=scheduler)

    def read(self, hosts: tuple[str, ...], start: float
             ) -> tuple[dict[str, Timeline], dict[str, HostEvidence]] | None:
        """Timelines and evidence from ``start`` to now; None when Prometheus fails, and for
        ``DOWN_BACKOFF`` seconds after (a pass over many runs does not wait for a timeout on
        each)."""
        now = self.clock()
        if now < self._down_until:
            return None
        try:
            return self._read(hosts, start, now)
        except (PrometheusError, ValueError, KeyError, TypeError) as exc:
            log.warning("node state lookup failed: %s", type(exc).__name__)
            self._down_until = now + DOWN_BACKOFF
            return None

    def _read(self, hosts: tuple[str, ...], start: float, end: float
              ) -> tuple[dict[str, Timeline], dict[str, HostEvidence]]:
        start = min(start, end - 60)
        # A step from a fixed ladder and a start on its grid: the samples (so the change times
        # shown) stay put from one refresh to the next.
        wanted = pick_step(start, end, (end - start) / MAX_STEPS)
        step = next((s for s in STEPS if s >= wanted), wanted)
        start = start // step * step
        regex = "|".join(regex_literal(h) for h in hosts)
        points = self._points(f'{STATE}{{hostname=~"{regex}"}}', start, end, step,
                              lambda m: (m.get("hostname", ""), m.get("scheduler", ""),
                                         m.get("state", ""), m.get("reason", "")))
        missing = [h for h in hosts if h not in points]
        if missing:
            points.update(self._ksm(missing, start, end, step))
        timelines = {h: _timeline(h, p, step, end) for h, p in points.items() if h in hosts}
        return timelines, self._evidence(hosts, regex, start, end, step)

    def _evidence(self, hosts: Sequence[str], regex: str, start: float, end: float,
                  step: float) -> dict[str, HostEvidence]:
        """Boot time now, GPU count at the start and now, each GPU's UUIDs and the driver's
        recovery action over the window."""
        select = f'{{hostname=~"{regex}"}}'
        boot = {s["metric"].get("hostname", ""): float(s["value"][1]) for s in self.prom.instant(
            fill(BOOT_TIME, {"TARGET": series.NODE_EXPORTER_TARGET + select}), end)}
        repeat = {s["metric"].get("hostname", ""): round(float(s["value"][1]))
                  for s in self.prom.instant(fill(ALERTS[HOST_REPEAT_OFFENDER].condition, {
                      **PLAIN_VALUES, "HOST_HARDWARE_SINCE": series.HOST_HARDWARE_SINCE + select}),
                      end)}
        counts = {s["metric"].get("hostname", ""): [(float(t), float(v)) for t, v in s["values"]]
                  for s in self.prom.range(series.HOST_GPU_COUNT + select, start, end, step)}
        present: dict[tuple[str, str], list[tuple[float, str]]] = {}
        for s in self.prom.range(series.GPU_PRESENT + select, start, end, step):
            m = s["metric"]
            key = (m.get("hostname", ""), m.get("gpu", ""))
            present.setdefault(key, []).extend((float(t), m.get("gpu_uuid", ""))
                                               for t, _ in s["values"])
        driver: dict[tuple[str, str], dict[float, int]] = {}
        for s in self.prom.range(series.GPU_RECOVERY_ACTION + select, start, end, step):
            m = s["metric"]
            values = driver.setdefault((m.get("hostname", ""), m.get("gpu", "")), {})
            for t, v in s["values"]:
                values[float(t)] = max(values.get(float(t), 0), int(float(v)))
        out = {}
        for host in hosts:
            gpus = {}
            for (h, gpu), samples in present.items():
                if h != host:
                    continue
                samples.sort()
                uuids = dict.fromkeys(uuid for _, uuid in samples if uuid)  # first seen first
                reporting = end - samples[-1][0] <= 1.5 * step + 1
                values = driver.get((h, gpu), {})
                changes: list[tuple[float, int]] = []
                for ts in sorted({t for t, _ in samples} | set(values)):
                    value = values.get(ts, 0)
                    if not changes or changes[-1][1] != value:
                        changes.append((ts, value))
                gpus[gpu] = GpuEvidence(tuple(uuids), reporting, tuple(changes))
            count = sorted(counts.get(host, []))
            now_count = count[-1][1] if count and end - count[-1][0] <= 1.5 * step + 1 else None
            out[host] = HostEvidence(
                boot_time=boot.get(host),
                gpus_now=None if now_count is None else int(now_count),
                gpus_before=int(count[0][1]) if count else None, gpus=gpus,
                repeat_episodes=repeat.get(host, 0))
        return out

    def _and_now(self, expr: str, start: float, end: float, step: float
                 ) -> list[dict[Any, Any]]:
        """``expr``'s range on the step grid, each series with its value now added at ``end``:
        the grid's last point can be up to a step old (5 minutes for an issue days old), and
        the verdict is about the state now. A change seen only now is dated now (the grid
        dates it at its next point once that is past; ``signature`` ignores the move)."""
        series_ = {json.dumps(s["metric"], sort_keys=True): s
                   for s in self.prom.range(expr, start, end, step)}
        for s in self.prom.instant(expr, end):
            key = json.dumps(s["metric"], sort_keys=True)
            values = series_.setdefault(key, {"metric": s["metric"], "values": []})["values"]
            if not values or float(values[-1][0]) < end:
                values.append([end, s["value"][1]])
        return list(series_.values())

    def _points(self, expr: str, start: float, end: float, step: float,
                row: Callable[[Mapping[str, str]], tuple[str, str, str, str]]
                ) -> dict[str, dict[float, tuple[str, str, str]]]:
        out: dict[str, dict[float, tuple[str, str, str]]] = {}
        for series_ in self._and_now(expr, start, end, step):
            host, scheduler, state, reason = row(series_["metric"])
            for ts, _ in series_["values"]:
                out.setdefault(host, {})[float(ts)] = (scheduler, state, reason)
        return out

    def _ksm(self, hosts: Sequence[str], start: float, end: float, step: float
             ) -> dict[str, dict[float, tuple[str, str, str]]]:
        """kube-state-metrics as the same input: the cordon and NoSchedule/NoExecute taints the
        run's pods do not tolerate. A host is the node of exactly its name, else the one node
        whose first DNS label it is; two such nodes are ambiguous and give no data."""
        regex = "|".join(regex_literal(h) for h in hosts)
        node = f'node=~"({regex})(\\\\..*)?"'
        cordon: dict[str, dict[float, bool]] = {}
        for s in self._and_now(f"kube_node_spec_unschedulable{{{node}}}", start, end, step):
            name = s["metric"].get("node", "")
            for ts, value in s["values"]:
                cordon.setdefault(name, {})[float(ts)] = value == "1"
        names = _node_names(hosts, cordon)
        ignored = "|".join(regex_literal(k) for k in self.tolerated)
        taints: dict[str, dict[float, list[str]]] = {}
        expr = (f'kube_node_spec_taint{{{node},effect=~"NoSchedule|NoExecute",'
                f'key!~"{ignored}"}}')
        for s in self._and_now(expr, start, end, step):
            m = s["metric"]
            text = f"{m.get('key', '')}{'=' + m['value'] if m.get('value') else ''}:" \
                   f"{m.get('effect', '')}"
            for ts, _ in s["values"]:
                taints.setdefault(m.get("node", ""), {}).setdefault(float(ts), []).append(text)
        out: dict[str, dict[float, tuple[str, str, str]]] = {}
        for host, name in names.items():
            for ts, cordoned in cordon[name].items():
                tainted = sorted(taints.get(name, {}).get(ts, []))
                words = ["Ready"] + (["SchedulingDisabled"] if cordoned else []) + (
                    ["Tainted"] if tainted else [])
                reason = f"taint {', '.join(tainted)}" if tainted else ""
                out.setdefault(host, {})[ts] = ("kubernetes", ",".join(words), reason)
        return out


def _node_names(hosts: Sequence[str], nodes: Iterable[str]) -> dict[str, str]:
    """Host -> its Kubernetes node: the node named exactly so, else the only node whose first
    DNS label it is (two such nodes: the host is left out, so it has no data)."""
    nodes = list(nodes)
    out = {}
    for host in hosts:
        if host in nodes:
            out[host] = host
            continue
        matches = [n for n in nodes if n.split(".")[0] == host]
        if len(matches) == 1:
            out[host] = matches[0]
        elif matches:
            log.warning("host matches several Kubernetes nodes; no state read for it",
                        extra={"host": host, "nodes": ",".join(sorted(matches))})
    return out


def _timeline(host: str, points: Mapping[float, tuple[str, str, str]], step: float,
              end: float) -> Timeline:
    """Compress per-step samples into changes; a gap of more than 1.5 steps is 'no data'."""
    changes: list[Change] = []
    last_ts = None
    for ts in sorted(points):
        scheduler, state, reason = points[ts]
        if last_ts is not None and ts - last_ts > 1.5 * step and changes[-1].state:
            changes.append(Change(last_ts + step, changes[-1].scheduler, "", ""))
        prev = changes[-1] if changes else None
        if prev is None or (prev.state, prev.reason) != (state, reason):
            changes.append(Change(ts, scheduler, state, reason))
        last_ts = ts
    current = changes[-1] if changes and last_ts is not None and \
        end - last_ts <= 1.5 * step + 1 and changes[-1].state else None
    return Timeline(host, tuple(changes), current)


def headline(remediations: Mapping[str, Remediation], diagnosis: Diagnosis
             ) -> Remediation | None:
    """The run-level remediation: the headline issue's, else the first issue that has one."""
    order: Iterable[Issue] = ([diagnosis.root_cause] if diagnosis.root_cause else []) + list(
        diagnosis.ranked)
    return next((remediations[i.key] for i in order if i.key in remediations), None)


def summary_verdict(remediations: Mapping[str, Remediation], diagnosis: Diagnosis
                    ) -> dict[str, str]:
    """``infra/restart_verdict`` for the runs table once the run ended ({} with nothing to say)."""
    rem = headline(remediations, diagnosis)
    return {} if rem is None else {"infra/restart_verdict": rem.verdict}
