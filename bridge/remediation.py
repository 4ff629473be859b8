"""What is being done about an issue's faulty hosts, and whether restarting the run is safe.

The exporter publishes each host's scheduler state (``wandb_infra_node_state{hostname, scheduler,
state, reason}``, exporter/sources/nodestate.py); where only kube-state-metrics is scraped, its
``kube_node_spec_unschedulable`` and ``kube_node_spec_taint`` stand in. One range query per set of
hosts, from shortly before the issue to now, gives each host's state history ("drained 12:03,
reason 'XID 94'; back in service 14:40") and the verdict:

* **safe**: every faulty host is out of the pool (drained, down, cordoned, tainted), or was taken
  out and is back in service with the root cause resolved (repaired);
* **unsafe**: a faulty host is still schedulable, so a restart may land on it again; the exact
  exclusion is given (``sbatch --exclude=...`` or a Kubernetes node-affinity snippet);
* **unknown**: no scheduler data for the faulty hosts.

Only issues whose root cause names a host and is not a mere symptom (a stall on 64 hosts says
nothing about which node is bad) get a verdict.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import requests

from wandb_infra.bridge.diagnosis import AlertFact, Diagnosis, Issue, diagnose
from wandb_infra.bridge.explain import _regex_literal, pick_step
from wandb_infra.catalog.vocabulary import CauseClass
from wandb_infra.common.nodestate import DEFAULT_TOLERATED, STATE, schedulable

log = logging.getLogger(__name__)

LEAD = 600.0  # history starts this long before the issue: the state the fault found
MAX_STEPS = 2000
DOWN_BACKOFF = 30.0  # after a failed query, Prometheus is not asked again for this long
STEPS = (1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0)
_KSM_IGNORED = (*DEFAULT_TOLERATED, "node.kubernetes.io/unschedulable")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


@dataclass(frozen=True)
class Change:
    """A host's state from ``at`` on (``state`` empty: no data then)."""

    at: float
    scheduler: str
    state: str
    reason: str

    @property
    def in_pool(self) -> bool:
        """True when new jobs may start on the host in this state."""
        return bool(self.state) and schedulable(self.scheduler, self.state)


@dataclass(frozen=True)
class Timeline:
    """One host's state changes, oldest first; ``current`` is None when there is no data now."""

    hostname: str
    changes: tuple[Change, ...]
    current: Change | None


@dataclass(frozen=True)
class Remediation:
    """The restart verdict of one issue and the history behind it."""

    verdict: str
    detail: str
    exclusion: str
    timelines: tuple[Timeline, ...]
    action: str = ""  # what the bridge's quarantine did or would do (bridge/quarantine.py)

    def as_dict(self) -> dict[str, Any]:
        """The run-data contract: verdict, detail, exclusion, hosts (current state, since), and
        ``action`` when the quarantine decided something."""
        hosts = []
        for t in self.timelines:
            now = t.current
            hosts.append({"hostname": t.hostname, "state": now.state if now else "unknown",
                          "reason": now.reason if now else "",
                          "since": _iso(now.at) if now else ""})
        out = {"verdict": self.verdict, "detail": self.detail, "exclusion": self.exclusion,
               "hosts": hosts}
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
            if c.in_pool:
                what = "back in service" if was_in is False else "in service"
            else:
                what = "out of the pool"
            # the first entry is the state the history window starts with, not a change
            when = "as of" if previous is None else "from"
            text = f"{what} ({c.state}) {when} {_clock(c.at, previous)}"
            if c.reason:
                text += f", reason '{c.reason}'"
            was_in = c.in_pool
        out.append(text)
        previous = c.at
    return out


def faulty_hosts(issue: Issue) -> list[str]:
    """The hosts an issue's root cause names (none for a symptom such as a stall)."""
    if issue.root.cause is CauseClass.SYMPTOM:
        return []
    return sorted({f.hostname for f in (issue.root, *issue.peers) if f.hostname})


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


def verdict(issue: Issue, timelines: Mapping[str, Timeline]) -> Remediation | None:
    """The restart verdict for one issue from its faulty hosts' timelines (None: no host)."""
    hosts = faulty_hosts(issue)
    if not hosts:
        return None
    lines = tuple(timelines.get(h) or Timeline(h, (), None) for h in hosts)
    started = issue.started_at.timestamp()
    resolved = issue.root_ended_at is not None
    out, repaired, risky, unknown = [], [], [], []
    for t in lines:
        now = t.current
        if now is None:
            unknown.append(t.hostname)
        elif not now.in_pool:
            out.append(f"{t.hostname} is out of the pool ({now.state} since "
                       f"{_clock(now.at, None)}" + (f", reason '{now.reason}')" if now.reason
                                                    else ")"))
        elif resolved and any(c.state and not c.in_pool and c.at >= started - LEAD
                              for c in t.changes):
            repaired.append(f"{t.hostname} was taken out of the pool and is back in service "
                            f"({now.state}) since {_clock(now.at, None)}, with the root cause "
                            "resolved")
        else:
            risky.append(t)
    schedulers = [t.current.scheduler for t in lines if t.current]
    scheduler = max(set(schedulers), key=schedulers.count) if schedulers else ""
    if risky:
        names = [t.hostname for t in risky] + unknown
        still = ", ".join(f"{t.hostname} ({t.current.state})" for t in risky if t.current)
        them = "it" if len(names) == 1 else "them"
        one = len(risky) == 1
        detail = f"{still} {'is' if one else 'are'} still schedulable"
        if resolved:
            detail += (f" and {'was' if one else 'were'} never taken out of the pool (the fault "
                       "itself has resolved): "
                       f"a restart may land there again; exclude {them} to be sure")
        else:
            detail += f": a restart may land on the same faulty hardware; exclude {them}"
        return Remediation("unsafe", _join(detail, out, repaired, unknown), exclusion(
            names, scheduler), lines)
    if unknown:
        detail = (f"no scheduler state for {', '.join(unknown)} in Prometheus (enable the "
                  "exporter's node_state, or scrape kube-state-metrics)")
        return Remediation("unknown", _join(detail, out, repaired, []),
                           exclusion(unknown, scheduler), lines)
    return Remediation("safe", "; ".join(out + repaired) + ": a restart cannot land on a "
                       "faulty host", "", lines)


def _join(head: str, out: list[str], repaired: list[str], unknown: list[str]) -> str:
    rest = out + repaired + ([f"no scheduler state for {', '.join(unknown)}"] if unknown else [])
    return "; ".join([head, *rest])


def signature(remediations: Mapping[str, Remediation]) -> str:
    """A short digest of what the issues show about remediation (a change re-writes the run)."""
    data = sorted(
        (key, r.verdict, r.exclusion, r.action,
         [(t.hostname, [(c.at, c.state, c.reason) for c in t.changes]) for t in r.timelines])
        for key, r in remediations.items())
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:16]


class NodeStateHistory:
    """Reads the hosts' state history from Prometheus (range queries, cached briefly)."""

    def __init__(self, base_url: str, timeout: float = 5.0, *, cache_seconds: float = 10.0,
                 session: requests.Session | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.cache_seconds = cache_seconds
        self.session = session or requests.Session()
        self.clock = clock
        self._lock = threading.Lock()
        self._cache: dict[tuple[tuple[str, ...], float], tuple[float, dict[str, Timeline]]] = {}
        self._down_until = 0.0

    def for_diagnosis(self, diagnosis: Diagnosis) -> dict[str, Remediation] | None:
        """Issue key -> remediation for every issue that names a faulty host; None when
        Prometheus cannot answer and nothing was read before (the caller keeps what it shows)."""
        wanted = [(i, faulty_hosts(i)) for i in diagnosis.issues]
        wanted = [(i, h) for i, h in wanted if h]
        if not wanted:
            return {}
        hosts = tuple(sorted({h for _, hs in wanted for h in hs}))
        start = min(i.started_at.timestamp() for i, _ in wanted) - LEAD
        timelines = self.timelines(hosts, start)
        if timelines is None:
            return None
        out = {}
        for issue, _ in wanted:
            rem = verdict(issue, timelines)
            if rem is not None:
                out[issue.key] = rem
        return out

    def timelines(self, hosts: tuple[str, ...], start: float) -> dict[str, Timeline] | None:
        """Each host's changes from ``start`` to now. While Prometheus fails (and for
        ``DOWN_BACKOFF`` seconds after, so pages and refreshes do not each wait for a timeout)
        the last good answer is served, or None when there is none."""
        now = self.clock()
        key = (hosts, start)
        with self._lock:
            hit = self._cache.get(key)
            if hit and (now - hit[0] < self.cache_seconds or now < self._down_until):
                return hit[1]
            if now < self._down_until:
                return None
        try:
            result = self._read(hosts, start, now)
        except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
            log.warning("node state lookup failed: %s", type(exc).__name__)
            with self._lock:
                self._down_until = now + DOWN_BACKOFF
            return hit[1] if hit else None
        with self._lock:
            if len(self._cache) > 512:
                self._cache.clear()
            self._cache[key] = (now, result)
        return result

    def _read(self, hosts: tuple[str, ...], start: float, end: float) -> dict[str, Timeline]:
        start = min(start, end - 60)
        # A step from a fixed ladder and a start on its grid: the samples (so the change times
        # shown, and the signature that triggers a re-write) stay put from one refresh to the next.
        wanted = pick_step(start, end, (end - start) / MAX_STEPS)
        step = next((s for s in STEPS if s >= wanted), wanted)
        start = start // step * step
        regex = "|".join(_regex_literal(h) for h in hosts)
        points = self._points(f'{STATE}{{hostname=~"{regex}"}}', start, end, step,
                              lambda m: (m.get("hostname", ""), m.get("scheduler", ""),
                                         m.get("state", ""), m.get("reason", "")))
        missing = [h for h in hosts if h not in points]
        if missing:
            points.update(self._ksm(missing, start, end, step))
        return {h: _timeline(h, p, step, end) for h, p in points.items()}

    def _points(self, expr: str, start: float, end: float, step: float,
                row: Callable[[Mapping[str, str]], tuple[str, str, str, str]]
                ) -> dict[str, dict[float, tuple[str, str, str]]]:
        out: dict[str, dict[float, tuple[str, str, str]]] = {}
        for series in self._range(expr, start, end, step):
            host, scheduler, state, reason = row(series["metric"])
            for ts, _ in series["values"]:
                out.setdefault(host, {})[float(ts)] = (scheduler, state, reason)
        return out

    def _ksm(self, hosts: Sequence[str], start: float, end: float, step: float
             ) -> dict[str, dict[float, tuple[str, str, str]]]:
        """kube-state-metrics as the same input: cordon and NoSchedule/NoExecute taints."""
        regex = "|".join(_regex_literal(h) for h in hosts)
        node = f'node=~"({regex})(\\\\..*)?"'
        cordon: dict[str, dict[float, bool]] = {}
        for s in self._range(f"kube_node_spec_unschedulable{{{node}}}", start, end, step):
            host = s["metric"].get("node", "").split(".")[0]
            for ts, value in s["values"]:
                cordon.setdefault(host, {})[float(ts)] = value == "1"
        ignored = "|".join(_regex_literal(k) for k in _KSM_IGNORED)
        taints: dict[str, dict[float, list[str]]] = {}
        expr = (f'kube_node_spec_taint{{{node},effect=~"NoSchedule|NoExecute",'
                f'key!~"{ignored}"}}')
        for s in self._range(expr, start, end, step):
            m = s["metric"]
            host = m.get("node", "").split(".")[0]
            text = f"{m.get('key', '')}{'=' + m['value'] if m.get('value') else ''}:" \
                   f"{m.get('effect', '')}"
            for ts, _ in s["values"]:
                taints.setdefault(host, {}).setdefault(float(ts), []).append(text)
        out: dict[str, dict[float, tuple[str, str, str]]] = {}
        for host, samples in cordon.items():
            for ts, cordoned in samples.items():
                tainted = sorted(taints.get(host, {}).get(ts, []))
                words = ["Ready"] + (["SchedulingDisabled"] if cordoned else []) + (
                    ["Tainted"] if tainted else [])
                reason = f"taint {', '.join(tainted)}" if tainted else ""
                out.setdefault(host, {})[ts] = ("kubernetes", ",".join(words), reason)
        return out

    def _range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        resp = self.session.get(f"{self.base_url}/api/v1/query_range", timeout=self.timeout,
                                params={"query": expr, "start": f"{start:.3f}",
                                        "end": f"{end:.3f}", "step": f"{step:.3f}"})
        body = resp.json()
        if body.get("status") != "success":
            raise ValueError(f"Prometheus rejected {expr!r}: {body.get('error')}")
        return body["data"]["result"]


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



def run_remediation(history: NodeStateHistory | None, facts: Sequence[AlertFact],
                    incident_gap: timedelta) -> dict[str, Any]:
    """``{"remediation": {...}}`` for a run's data (its headline issue's verdict), or ``{}``
    when there is nothing to say (no Prometheus, no faulty host)."""
    if history is None or not facts:
        return {}
    diagnosis = diagnose(list(facts), incident_gap)
    rem = headline(history.for_diagnosis(diagnosis) or {}, diagnosis)
    return {} if rem is None else {"remediation": rem.as_dict()}
