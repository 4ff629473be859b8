"""Is it safe to restart? One decision per issue, from what the fault needs (``need.py``),
whether that has been seen to happen, and where the scheduler stands.

Pure: plain data in (the issue, the site's policy, each faulty host's scheduler timeline and GPU
evidence, ``evidence.py``), a ``Decision`` out. The "what to do" text, the verdict and the
quarantine's permission are all fields of that one decision, so they cannot disagree. The need
is **done** when telemetry shows it after the fault's onset: the driver's recovery action
cleared, the node rebooted with its GPUs back, a new GPU, a fault that clears by itself quiet
for the settle time. **safe**: nothing to do, done, or the host is out of the pool (or was taken
out after the onset and returned, unless telemetry shows the action still needed); **unsafe**:
not done and schedulable; **unknown**: what is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from wandb_infra.bridge.diagnosis.evidence import GpuEvidence, HostEvidence, Timeline
from wandb_infra.bridge.diagnosis.need import (
    Need,
    Policy,
    and_,
    faulty_hosts,
    gpus_of,
    need_of,
    onset,
    repeat_offender,
    resolve,
)
from wandb_infra.bridge.diagnosis.root_cause import Issue
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.catalog.recovery import SPECS, Action
from wandb_infra.catalog.vocabulary import CauseClass
from wandb_infra.catalog.xid import CATALOG_URL

SAFE, UNSAFE, UNKNOWN = "safe", "unsafe", "unknown"


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


DONE, PENDING, UNSEEN = "done", "pending", "unseen"


def _done(action: Action, issue: Issue, host: str, *, ev: HostEvidence | None, now: float,
          policy: Policy) -> tuple[str, str]:
    """Whether ``action`` was seen done on ``host`` after the onset (DONE), is shown still
    needed (PENDING), or nothing says either way (UNSEEN); and the sentence that says so."""
    since = onset(issue)
    gpus = gpus_of(issue, host)
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
    return None if not set_after or last_value else last_at


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
    return known.scope == "run" if known is not None else issue.root.cause is CauseClass.SYMPTOM


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
    gpus = {h: gpus_of(issue, h) for h in hosts}
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
        return Decision(SAFE, need, and_(detail, need.policy), text, "", tuple(hosts), False)
    schedulers = [t.current.scheduler for t in (timelines or {}).values() if t.current]
    scheduler = max(set(schedulers), key=schedulers.count) if schedulers else ""
    if timelines is None:
        detail = (f"{need.subject} needs {need.words}; {unread}, so the bridge cannot see "
                  f"whether that happened or whether {', '.join(hosts)} left the pool")
        return Decision(UNKNOWN, need, and_(detail, need.policy), text,
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
            return Decision(UNKNOWN, need, and_(detail, need.policy), text,
                            exclude(missing, scheduler), tuple(hosts), False)
        return Decision(SAFE, need, and_("; ".join([head, *safe]), need.policy), text, "",
                        tuple(hosts), False)
    if any(kind == "in" for kind, _, _ in risky):
        names = [h for _, h, _ in risky]
        detail = "; ".join([f"{head}: a restart may land on {', '.join(names)} before it is "
                            "done; exclude "
                            + ("it" if len(names) == 1 else "them"),
                            *(t for _, _, t in risky), *safe])
        return Decision(UNSAFE, need, and_(detail, need.policy), text, exclude(names, scheduler),
                        tuple(hosts), True)
    if risky:
        names = [h for _, h, _ in risky]
        detail = "; ".join([head, *(t for _, _, t in risky), *safe])
        return Decision(UNKNOWN, need, and_(detail, need.policy), text,
                        exclude(names, scheduler), tuple(hosts), True)
    if repaired:  # nothing left to reset, drain or exclude on what was repaired
        rest = [h for h in hosts if h not in repaired]
        text = (f"Done: {'; '.join(repaired.values())}. Restart the job from its last "
                "checkpoint" + (f" without {', '.join(rest)} (out of the pool until repaired)."
                                if rest else "; the repaired node can take it again."))
    return Decision(SAFE, need, and_("; ".join([head, *safe]), need.policy), text, "",
                    tuple(hosts), False)
