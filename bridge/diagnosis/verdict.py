"""Is it safe to restart? One decision per issue, from what the fault needs, whether that has
been seen to happen, and where the scheduler stands.

Pure: plain data in (the issue, the site's policy, each faulty host's scheduler timeline and GPU
evidence read from Prometheus by ``prometheus/remediation.py``), a ``Decision`` out. The "what
to do" text, the verdict and the quarantine's permission are all fields of that one decision, so
they cannot disagree:

* the **need** is the root cause's recovery action (``catalog/recovery.py``): the XID's bucket in
  NVIDIA's catalog, the alert's own, or the driver's recovery action (DCGM field 1523) when it
  asks for more; a site policy may override it per code, bucket or alert, and says so;
* it is **done** when telemetry shows it after the fault's onset: the driver's recovery action
  cleared, the node rebooted with its GPUs back, a new GPU, a fault that clears by itself
  (a link, a temperature) quiet for the settle time;
* **safe**: nothing to do, done, or the host is out of the pool (or was taken out after the
  onset and returned, unless telemetry shows the action still needed: the driver still asking,
  or a reboot the fault needs while the boot time predates it); **unsafe**: not done and
  schedulable; **unknown**: what is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from wandb_infra.bridge.diagnosis.root_cause import AlertFact, Issue
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.catalog.host_alerts import GPU_REPEAT_OFFENDER, HOST_REPEAT_OFFENDER
from wandb_infra.catalog.recovery import (
    BUCKETS,
    DRIVER_ACTION_WORDS,
    SPECS,
    STRENGTH,
    Action,
    driver_action,
    from_driver_label,
    stronger,
)
from wandb_infra.catalog.runbook import CLASS_ALERT
from wandb_infra.catalog.series import REPEAT_WINDOW, span
from wandb_infra.catalog.vocabulary import CauseClass
from wandb_infra.catalog.xid import CATALOG_URL, XIDS, XidClass, codes
from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.nodestate import schedulable

SAFE, UNSAFE, UNKNOWN = "safe", "unsafe", "unknown"
DEFAULT_SETTLE = 600.0
_RESOLVED = frozenset(a for a in Action if SPECS[a].out_of_service is not None)


@dataclass(frozen=True)
class Policy:
    """A site's overrides of NVIDIA's actions (XID code, NVIDIA bucket, alert name) and the time
    a self-clearing fault must stay quiet before it counts as fixed."""

    xid: Mapping[int, Action] = field(default_factory=dict)
    bucket: Mapping[str, Action] = field(default_factory=dict)
    alert: Mapping[str, Action] = field(default_factory=dict)
    settle_seconds: float = DEFAULT_SETTLE

    @classmethod
    def from_config(cls, raw: Mapping[str, Any] | None) -> Policy:
        """The ``restart_policy`` section; ConfigError names the first bad key or value."""
        raw = dict(raw or {})
        unknown = sorted(set(raw) - {"xid", "bucket", "alert", "settle_seconds"})
        if unknown:
            raise ConfigError(f"unknown keys in restart_policy: {', '.join(unknown)}")
        names = ", ".join(a.value for a in _RESOLVED)

        def action(where: str, value: Any) -> Action:
            try:
                out = Action(str(value))
            except ValueError:
                out = None
            if out is None or out not in _RESOLVED:
                raise ConfigError(f"restart_policy.{where}: {value!r} is not one of {names}")
            return out

        def table(name: str) -> dict[str, Any]:
            value = raw.get(name) or {}
            if not isinstance(value, Mapping):
                raise ConfigError(f"restart_policy.{name} must be a mapping")
            return dict(value)

        xid: dict[int, Action] = {}
        for code, value in table("xid").items():
            if not str(code).isdigit():
                raise ConfigError(f"restart_policy.xid: {code!r} is not an XID code")
            xid[int(code)] = action(f"xid.{code}", value)
        bucket = {}
        for name, value in table("bucket").items():
            if name not in BUCKETS or not name:
                raise ConfigError(f"restart_policy.bucket: {name!r} is not an NVIDIA bucket "
                                  f"({', '.join(b for b in BUCKETS if b)})")
            bucket[str(name)] = action(f"bucket.{name}", value)
        alert = {}
        for name, value in table("alert").items():
            if name not in ALERTS:
                raise ConfigError(f"restart_policy.alert: {name!r} is not an alert of the "
                                  "catalog")
            alert[str(name)] = action(f"alert.{name}", value)
        try:
            settle = float(raw.get("settle_seconds", DEFAULT_SETTLE))
        except (TypeError, ValueError):
            settle = -1.0
        if settle < 0:
            raise ConfigError("restart_policy.settle_seconds must be a number >= 0")
        return cls(xid, bucket, alert, settle)


@dataclass(frozen=True)
class Need:
    """What an issue's root cause needs. ``subject`` names the fault in prose ("XID 94"),
    ``application`` marks a fault of the job's own code, ``policy`` states a site override."""

    action: Action
    subject: str
    application: bool = False
    policy: str = ""

    @property
    def words(self) -> str:
        """``only an application restart``, ``a GPU reset``, ..."""
        return SPECS[self.action].needs


# An XID alert whose class holds one code names it even without its ``xid`` label (a user's
# Alertmanager may drop labels): GpuContainedEccError is XID 94.
_ONLY_CODE = {alert: codes(cls)[0] for cls, alert in CLASS_ALERT.items() if len(codes(cls)) == 1}


def _xid_code(fact: AlertFact) -> int | None:
    raw = fact.labels.get("xid", "")
    return int(raw) if raw.isdigit() else _ONLY_CODE.get(fact.alertname)


def need_of(fact: AlertFact, policy: Policy) -> Need:
    """The root cause's need from the catalog (per XID code where the alert carries one), with
    the site's policy applied."""
    code = _xid_code(fact)
    known = ALERTS.get(fact.alertname)
    if code is not None and known is not None and "xid" in known.copy_labels:
        xid = XIDS.get(code)
        if xid is None:
            return Need(Action.UNKNOWN, f"XID {code}")
        base = xid.action
        chosen = policy.xid.get(code) or policy.bucket.get(xid.bucket) or base
        note = "" if chosen is base else (
            f"site policy: XID {code} needs {SPECS[chosen].needs} (NVIDIA's catalog: "
            f"{SPECS[base].needs})")
        return Need(chosen, f"XID {code}", xid.cls is XidClass.APPLICATION, note)
    if known is None or known.needs is None:
        return Need(policy.alert.get(fact.alertname, Action.UNKNOWN), fact.alertname)
    base = known.needs
    if base is Action.FOLLOW_DRIVER and fact.labels.get("recovery_action"):
        label = fact.labels["recovery_action"]
        base = from_driver_label(label)
        subject = f"the driver's recovery action ({DRIVER_ACTION_WORDS.get(label, label)})"
    else:
        subject = fact.alertname
    chosen = policy.alert.get(fact.alertname, base)
    note = "" if chosen is base else (
        f"site policy: {fact.alertname} needs {SPECS[chosen].needs} (catalog: "
        f"{SPECS[base].needs})")
    return Need(chosen, subject, False, note)


# --- evidence: plain data read from Prometheus ---------------------------------------------------

@dataclass(frozen=True)
class GpuEvidence:
    """One GPU over the history window: its UUIDs in order of appearance (the last is current,
    empty when it is not reporting now) and the driver's recovery action as (time, value)
    changes, 0 where the sparse record had no series while the GPU reported."""

    uuids: tuple[str, ...] = ()
    reporting: bool = True
    driver: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True)
class HostEvidence:
    """A host's boot time now, its GPU count now and at the start of the window, its GPUs, and
    its hardware-fault episodes in the repeat window when that makes it a repeat offender
    (``HostRepeatOffender``'s own condition; 0 otherwise)."""

    boot_time: float | None = None
    gpus_now: int | None = None
    gpus_before: int | None = None
    gpus: Mapping[str, GpuEvidence] = field(default_factory=dict)
    repeat_episodes: int = 0


@dataclass(frozen=True)
class Change:
    """A host's scheduler state from ``at`` on (``state`` empty: no data then)."""

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


# --- the decision ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Decision:
    """The one answer the advice, the verdict and the quarantine all read."""

    verdict: str
    need: Need
    detail: str
    advice: str
    exclusion: str
    hosts: tuple[str, ...]
    drain: bool  # the quarantine may take ``hosts`` out of the pool


def clock(ts: float) -> str:
    """``2026-12-01 12:40:05 UTC``."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def faulty_hosts(issue: Issue) -> list[str]:
    """The hosts the issue's root event names."""
    return sorted({f.hostname for f in (issue.root, *issue.peers) if f.hostname})


def _gpus(issue: Issue, host: str) -> list[str]:
    return sorted({f.gpu for f in (issue.root, *issue.peers) if f.hostname == host and f.gpu},
                  key=lambda g: (not g.isdigit(), int(g) if g.isdigit() else 0, g))


def onset(issue: Issue) -> float:
    """When the root event began (its earliest alert's onset)."""
    return min(f.onset for f in (issue.root, *issue.peers)).timestamp()


def _driver_seen(ev: HostEvidence | None, gpus: Sequence[str], since: float) -> int:
    """The driver recovery action value, of those ``gpus`` reported from ``since`` on, that
    asks for the most (0: none reported)."""
    values = [v for g in gpus for at, v in ((ev.gpus.get(g) or GpuEvidence()).driver
                                            if ev is not None else ()) if v and at >= since]
    # the value whose action is strongest (recovery.STRENGTH), the first of equals
    return max(values, key=lambda v: -STRENGTH.index(driver_action(v))
               if driver_action(v) in STRENGTH else -len(STRENGTH), default=0)


def resolve(need: Need, issue: Issue, evidence: Mapping[str, HostEvidence] | None) -> Need:
    """The need with the driver's recovery action folded in: an unresolved need (decode, follow
    the driver) takes the driver's; a resolved one takes it where it asks for more."""
    since = onset(issue)
    value = max((_driver_seen((evidence or {}).get(h), _gpus(issue, h), since)
                 for h in faulty_hosts(issue)), default=0)
    if not value:
        return need
    said = driver_action(value)
    if need.action not in _RESOLVED:
        return Need(said, need.subject, False,
                    _and(need.policy, f"the driver's recovery action said {SPECS[said].needs}"))
    combined = stronger(need.action, said)
    if combined is need.action:
        return need
    return Need(combined, need.subject, False,
                _and(need.policy, f"the driver's recovery action asks for {SPECS[said].needs}"))


# a GPU or host flagged as a repeat offender (its Nth hardware fault in the window)
# needs a replacement whatever the fault itself asks: a reset clears the fault, not its cause.
# A GPU's flag reaches the run as an alert; a host's (HostRepeatOffender, an operators' alert
# with no run labels) is read from Prometheus with the host's evidence.


def repeat_offender(need: Need, issue: Issue,
                    evidence: Mapping[str, HostEvidence] | None = None) -> Need:
    """The need raised to a replacement when the issue's own host and GPU are flagged as a
    repeat offender (``GpuRepeatOffender`` among its alerts), or its hardware fault is on a host
    that is one (``repeat_episodes`` in its evidence)."""
    root = issue.root
    if root.alertname == GPU_REPEAT_OFFENDER or need.application:
        return need
    flagged = [f for f in (*issue.peers, *issue.consequences)
               if f.alertname == GPU_REPEAT_OFFENDER and f.hostname == root.hostname
               and (not root.gpu or f.gpu == root.gpu)]
    notes = []
    if flagged:
        gpus = ", ".join(sorted({f.gpu for f in flagged if f.gpu}))
        notes.append(f"GPU {gpus} of {root.hostname} is a repeat offender ({GPU_REPEAT_OFFENDER}): "
                     "replace, not reset")
    host = (evidence or {}).get(root.hostname)
    if host is not None and host.repeat_episodes and root.cause is CauseClass.HARDWARE:
        notes.append(f"{root.hostname} is a repeat offender ({HOST_REPEAT_OFFENDER}: "
                     f"{host.repeat_episodes} hardware-fault episodes in the last "
                     f"{span(REPEAT_WINDOW)}): replace, not reset")
    if not notes:
        return need
    return Need(stronger(need.action, Action.REPLACE), need.subject, False,
                _and(need.policy, "; ".join(notes)))


def _and(a: str, b: str) -> str:
    return f"{a}; {b}" if a and b else a or b


DONE, PENDING, UNSEEN = "done", "pending", "unseen"


def _done(action: Action, issue: Issue, host: str, *, ev: HostEvidence | None, now: float,
          policy: Policy) -> tuple[str, str]:
    """Whether ``action`` was seen done on ``host`` after the onset (DONE), is shown still
    needed (PENDING), or nothing says either way (UNSEEN); and the sentence that says so."""
    since = onset(issue)
    gpus = _gpus(issue, host)
    gpu_words = f"GPU {', '.join(gpus)}" if gpus else "the GPU"
    ended = issue.root_ended_at.timestamp() if issue.root_ended_at else None
    known = ALERTS.get(issue.root.alertname)
    # a replacement is never shown by the fault clearing (a repeat offender's clears each time)
    if known is not None and known.clears_when_fixed and action is not Action.REPLACE:
        if ended is None:
            return PENDING, f"the fault on {host} is still present"
        if action not in (Action.RESTORE_LINK, Action.SERVICE):
            return DONE, f"the fault on {host} cleared at {clock(ended)}"
        if now - ended >= policy.settle_seconds:
            return DONE, f"the fault on {host} cleared at {clock(ended)} and stayed clear"
        return PENDING, (f"the fault on {host} cleared at {clock(ended)}; waiting until "
                         f"{clock(ended + policy.settle_seconds)} to see it stay clear")
    if ev is None:
        return UNSEEN, f"nothing on {host} shows {SPECS[action].needs} yet"
    rebooted = ev.boot_time is not None and ev.boot_time > since
    gpus_back = ev.gpus_now is not None and (ev.gpus_before is None
                                             or ev.gpus_now >= ev.gpus_before)
    if rebooted and action in (Action.REBOOT_NODE, Action.RESET_GPU, Action.DRAIN_P2P):
        if gpus_back:
            return DONE, f"{host} rebooted at {clock(ev.boot_time or 0)} with its GPUs back"
        return PENDING, (f"{host} rebooted at {clock(ev.boot_time or 0)} but reports "
                         f"{ev.gpus_now or 0} of {ev.gpus_before} GPUs")
    for g in gpus:
        gpu = ev.gpus.get(g)
        if gpu is not None and len(gpu.uuids) > 1 and gpu.reporting:
            return DONE, f"GPU {g} of {host} was replaced (new UUID {gpu.uuids[-1]})"
    if action is Action.REBOOT_NODE:
        if ev.boot_time is not None:
            # the boot time is read and predates the fault: whatever the scheduler shows (an
            # operator's drain and return included), the reboot the fault needs has not happened
            return PENDING, (f"{host} has not rebooted since the fault (up since "
                             f"{clock(ev.boot_time)})")
        return UNSEEN, (f"no reboot of {host} seen (no node_boot_time_seconds from its "
                        "node_exporter)")
    if action in (Action.RESET_GPU, Action.DRAIN_P2P):
        cleared = [_cleared_at(ev.gpus.get(g), since) for g in gpus]
        if gpus and all(c is not None for c in cleared):
            when = max(c for c in cleared if c is not None)
            return DONE, (f"{gpu_words} of {host} was reset at {clock(when)} (the driver's "
                          "recovery action cleared)")
        if any(v for g in gpus for _, v in (ev.gpus.get(g) or GpuEvidence()).driver[-1:]):
            return PENDING, f"the driver still asks for {SPECS[action].needs} on {host}"
        return UNSEEN, (f"no reset of {gpu_words} of {host} seen (dcgm-exporter does not "
                        "report the driver's recovery action for it: add "
                        "DCGM_FI_DEV_GPU_RECOVERY_ACTION to its counters file)")
    return UNSEEN, f"nothing on {host} shows {SPECS[action].needs} yet"


def _cleared_at(gpu: GpuEvidence | None, since: float) -> float | None:
    """When the driver's recovery action returned to none after being set at or after
    ``since`` (None: never set then, or still set)."""
    if gpu is None or not gpu.reporting or not gpu.driver:
        return None
    set_after = [at for at, v in gpu.driver if v and at >= since]
    last_at, last_value = gpu.driver[-1]
    if not set_after or last_value:
        return None
    return last_at


def _pool(t: Timeline | None, since: float) -> tuple[str, str]:
    """('out'|'returned'|'in'|'none', sentence) for a host's scheduler state."""
    if t is None or t.current is None:
        return "none", ""
    now = t.current
    reason = f", reason '{now.reason}'" if now.reason else ""
    if not now.in_pool:
        return "out", f"{t.hostname} is out of the pool ({now.state} since {clock(now.at)}{reason})"
    out_after = [c for c in t.changes if c.state and not c.in_pool and c.at >= since]
    if out_after:
        return "returned", (f"{t.hostname} was taken out of the pool at {clock(out_after[0].at)} "
                            f"and returned ({now.state}) at {clock(now.at)}")
    return "in", f"{t.hostname} is schedulable ({now.state})"


def advice(need: Need, hosts: Sequence[str], gpus: Mapping[str, Sequence[str]],
           detail: str = "") -> str:
    """The "what to do" text of a need; ``detail`` is the catalog's specifics for the alert."""
    where = ", ".join(hosts) or "the faulty node"
    without = f"restart the job from its last checkpoint without {where}"
    resets = "; ".join(f"GPU {', '.join(g)} of {h} (nvidia-smi -r -i {','.join(g)})"
                       if g else f"the faulty GPU of {h} (nvidia-smi -r)"
                       for h, g in ((h, gpus.get(h, ())) for h in hosts)) or "the GPU"
    a = need.action
    text = {
        Action.NONE: (f"No hardware action: {need.subject} needs {need.words}; the node can stay "
                      "in service (if it followed another error, act on that one)."),
        Action.RESTART_APP: (
            "Not the hardware: a restart on the same GPUs is fine; look at the application "
            "(the failing kernel: illegal address, out-of-bounds access) before restarting."
            if need.application else
            f"Restart the job from its last checkpoint; the node can stay in service "
            f"({need.subject} needs only an application restart)."),
        Action.RESET_GPU: f"Reset {resets} with no process on it, before a job runs there "
                          f"again; until then {without}.",
        Action.DRAIN_P2P: f"Stop every job on {where} so the driver can drain peer-to-peer "
                          f"traffic, and reuse it once its recovery action clears; {without}.",
        Action.REBOOT_NODE: f"Reboot {where} before it takes a job again; {without}. Open a "
                            "hardware ticket if the fault comes back.",
        Action.RESTORE_LINK: f"{without.capitalize()} until the link is back and stable.",
        Action.SERVICE: f"{without.capitalize()}; the node needs an operator's inspection "
                        "before it takes a job again.",
        Action.REPLACE: f"{without.capitalize()}; " + (
            "the GPU needs field diagnosis (dcgmi diag -r 3) and likely a replacement (NVIDIA "
            "support, RMA)." if any(gpus.values()) else
            "the node needs its failing part replaced (GPU, DIMM, PSU or board), not another "
            "reset, before it takes a job again."),
        Action.DECODE: f"Decode {need.subject}'s fields (NVIDIA's XID catalog) to know whether "
                       f"the GPU needs a reset; {without} until then.",
        Action.FOLLOW_DRIVER: f"Do the recovery action the driver logged with {need.subject} "
                              f"(dmesg: 'GPU recovery action'); {without} until then.",
        Action.UNKNOWN: f"Look {need.subject} up in NVIDIA's XID catalog ({CATALOG_URL}) and do "
                        f"its immediate action; {without} until you know.",
    }[a]
    return f"{text} {detail}".strip() if detail else text


def _symptom(issue: Issue) -> bool:
    """A run-level symptom (a stall, a straggler): it names hosts but no faulty part."""
    known = ALERTS.get(issue.root.alertname)
    if known is not None:
        return known.scope == "run"
    return issue.root.cause is CauseClass.SYMPTOM


ExclusionFn = Callable[[Sequence[str], str], str]


NO_PROMETHEUS = "the bridge has no Prometheus (prometheus.url not set)"
NOT_ANSWERING = "Prometheus is not answering"


def decide(issue: Issue, policy: Policy, *, timelines: Mapping[str, Timeline] | None,
           evidence: Mapping[str, HostEvidence] | None, now: float,
           exclusion_for: ExclusionFn | None = None,
           unread: str = NO_PROMETHEUS) -> Decision | None:
    """The decision for one issue (None when its root event names no host). ``timelines`` and
    ``evidence`` are None when nothing could be read (``unread`` says why); a host missing from
    them has no data. ``exclusion_for(hosts, scheduler)`` writes the exact exclusion."""
    hosts = faulty_hosts(issue)
    if not hosts:
        return None
    exclude: ExclusionFn = exclusion_for or (lambda _h, _s: "")
    gpus = {h: _gpus(issue, h) for h in hosts}
    root = issue.root
    if _symptom(issue):
        need = Need(Action.UNKNOWN, root.alertname)
        detail = (f"{root.alertname} is a symptom: no GPU, node or link fault on "
                  f"{', '.join(hosts)} explains it yet, so no node is known to be faulty; if "
                  "none appears, look at the application")
        return Decision(UNKNOWN, need, detail, root.text("remediation"), "", tuple(hosts), False)
    need = repeat_offender(resolve(need_of(root, policy), issue, evidence), issue, evidence)
    known = ALERTS.get(root.alertname)
    # the catalog's own specifics (an alert's annotations can be forged), or a user's own rule's
    catalog_detail = known.remediation if known is not None and known.needs in (
        Action.SERVICE, Action.RESTORE_LINK, Action.REPLACE) else ""
    if known is None:
        catalog_detail = root.text("remediation")
    text = advice(need, hosts, gpus, catalog_detail)
    spec = SPECS[need.action]
    if spec.out_of_service is False:
        if need.application:
            detail = (f"not the hardware: {need.subject} is an application fault (NVIDIA: "
                      "restart the application), so a restart on the same GPUs is fine; look "
                      "at the application")
        else:
            detail = f"{need.subject} needs {need.words}: the node can stay in service"
        return Decision(SAFE, need, _and(detail, need.policy), text, "", tuple(hosts), False)
    schedulers = [t.current.scheduler for t in (timelines or {}).values() if t.current]
    scheduler = max(set(schedulers), key=schedulers.count) if schedulers else ""
    if timelines is None:
        detail = (f"{need.subject} needs {need.words}; {unread}, so the bridge cannot see "
                  f"whether that happened or whether {', '.join(hosts)} left the pool")
        return Decision(UNKNOWN, need, _and(detail, need.policy), text,
                        exclude(hosts, scheduler), tuple(hosts), spec.out_of_service is True)
    since = onset(issue)
    safe: list[str] = []
    repaired: dict[str, str] = {}  # host -> how it was repaired (or returned by an operator)
    risky: list[tuple[str, str, str]] = []  # (in | none, host, sentence)
    missing: list[str] = []
    for host in hosts:
        state, pool_text = _pool(timelines.get(host), since)
        if spec.out_of_service is None:
            (safe if state == "out" else missing).append(pool_text if state == "out" else host)
            continue
        status, done_text = _done(need.action, issue, host, ev=(evidence or {}).get(host),
                                  now=now, policy=policy)
        if status == DONE:
            safe.append(done_text)
            repaired[host] = done_text
        elif state == "out":
            safe.append(pool_text)
        elif state == "returned" and status != PENDING:
            safe.append(f"{pool_text} (treated as repaired by the operator)")
            repaired[host] = safe[-1]
        elif state == "none":
            risky.append(("none", host, f"{done_text}; no scheduler state for {host} (enable "
                                        "the exporter's node_state source, or scrape "
                                        "kube-state-metrics)"))
        else:
            risky.append(("in", host, f"{pool_text} and {done_text}"))
    head = f"{need.subject} needs {need.words}"
    if spec.out_of_service is None:
        if missing:
            what = {Action.DECODE: "its fields decoded (the driver's recovery action, which "
                                   "would say, is not reported)",
                    Action.FOLLOW_DRIVER: "the action the driver logged (its recovery action "
                                          "is not reported by dcgm-exporter)",
                    }.get(need.action, f"an action NVIDIA's catalog does not publish "
                                       f"({CATALOG_URL})")
            detail = "; ".join([f"{need.subject} needs {what}", *safe])
            return Decision(UNKNOWN, need, _and(detail, need.policy), text,
                            exclude(missing, scheduler), tuple(hosts), False)
        return Decision(SAFE, need, _and("; ".join([head, *safe]), need.policy), text, "",
                        tuple(hosts), False)
    if any(kind == "in" for kind, _, _ in risky):
        names = [h for _, h, _ in risky]
        detail = "; ".join([f"{head}: a restart may land on {', '.join(names)} before it is "
                            "done; exclude "
                            + ("it" if len(names) == 1 else "them"),
                            *(t for _, _, t in risky), *safe])
        return Decision(UNSAFE, need, _and(detail, need.policy), text, exclude(names, scheduler),
                        tuple(hosts), True)
    if risky:
        names = [h for _, h, _ in risky]
        detail = "; ".join([head, *(t for _, _, t in risky), *safe])
        return Decision(UNKNOWN, need, _and(detail, need.policy), text,
                        exclude(names, scheduler), tuple(hosts), True)
    if repaired:  # nothing left to reset, drain or exclude on what was repaired
        rest = [h for h in hosts if h not in repaired]
        text = (f"Done: {'; '.join(repaired.values())}. Restart the job from its last "
                "checkpoint" + (f" without {', '.join(rest)} (out of the pool until repaired)."
                                if rest else "; the repaired node can take it again."))
    return Decision(SAFE, need, _and("; ".join([head, *safe]), need.policy), text, "",
                    tuple(hosts), False)
