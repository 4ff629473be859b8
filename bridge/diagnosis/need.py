"""What an issue's root cause needs before its host takes a job again: the catalog's recovery
action (``catalog/recovery.py``: the XID's bucket in NVIDIA's catalog, the alert's own, or the
driver's recovery action, DCGM field 1523, when it asks for more), a site policy's override per
code, bucket or alert, and a replacement for a repeat offender."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from wandb_infra.bridge.diagnosis.evidence import GpuEvidence, HostEvidence
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
from wandb_infra.catalog.xid import XIDS, XidClass, codes
from wandb_infra.common.configfile import ConfigError

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
            if str(value) not in {a.value for a in _RESOLVED}:
                raise ConfigError(f"restart_policy.{where}: {value!r} is not one of {names}")
            return Action(str(value))

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


def faulty_hosts(issue: Issue) -> list[str]:
    """The hosts the issue's root event names."""
    return sorted({f.hostname for f in (issue.root, *issue.peers) if f.hostname})


def gpus_of(issue: Issue, host: str) -> list[str]:
    """The GPUs of ``host`` the issue's root event names, in numeric order."""
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
    value = max((_driver_seen((evidence or {}).get(h), gpus_of(issue, h), since)
                 for h in faulty_hosts(issue)), default=0)
    if not value:
        return need
    said = driver_action(value)
    if need.action not in _RESOLVED:
        return Need(said, need.subject, False,
                    and_(need.policy, f"the driver's recovery action said {SPECS[said].needs}"))
    combined = stronger(need.action, said)
    if combined is need.action:
        return need
    return Need(combined, need.subject, False,
                and_(need.policy, f"the driver's recovery action asks for {SPECS[said].needs}"))


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
                and_(need.policy, "; ".join(notes)))


def and_(a: str, b: str) -> str:
    """Two notes joined with "; " (either may be empty)."""
    return f"{a}; {b}" if a and b else a or b
