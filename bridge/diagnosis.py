"""Root-cause diagnosis: the alerts of one run -> issues, each with a root cause and consequences.

Pure and deterministic (same alerts in any order -> same diagnosis), so the webhook path, the
``/runs`` pages and a post-mortem ``explain`` command that rebuilds alerts from Prometheus history
can all call ``diagnose``.

Rules: alerts are grouped into incidents by time (an alert joins the incident whose activity it
starts within ``gap`` of); inside an incident the root cause is the alert with the strongest cause
class (hardware > node loss > link loss > degradation > symptom, from the catalog or the alert's
``category``), earliest first; every other alert is a likely consequence. Alerts of the same
class on the same host that start within ``SIMULTANEOUS`` of each other are one event seen twice
(an XID 94 also bumps the ECC counters); the one carrying the driver's own diagnosis (an ``xid``
label) names it, whichever rule evaluated first. An issue starts at its
earliest alert (where the slowdown or failure became visible) and ends when all of its alerts
resolved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from bridge.catalog.alerts import ALERTS, cause_of
from bridge.catalog.vocabulary import ANNOTATION_FOR_SECONDS, CauseClass

DEFAULT_GAP = timedelta(minutes=10)
SIMULTANEOUS = timedelta(seconds=60)
MAX_PENDING = timedelta(days=1)

_CAUSE_WORDS = {
    CauseClass.HARDWARE: "a hardware fault",
    CauseClass.NODE_LOSS: "the loss of a node",
    CauseClass.LINK_LOSS: "the loss of a network link",
    CauseClass.DEGRADATION: "a performance degradation",
    CauseClass.SYMPTOM: "a symptom",
}


@dataclass(frozen=True)
class AlertFact:
    """One alert as diagnosis needs it: plain data, no storage or transport details."""

    fingerprint: str
    alertname: str
    starts_at: datetime
    ends_at: datetime | None = None
    severity: str = ""
    category: str = ""
    hostname: str = ""
    gpu: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def cause(self) -> CauseClass:
        """Cause class from the catalog, else from the category label."""
        return cause_of(self.alertname, self.category or None)

    def text(self, key: str) -> str:
        """An annotation, else the catalog's static text for ``summary``/``impact``/
        ``remediation`` (so a user's Alertmanager stripping annotations still gets advice)."""
        value = self.annotations.get(key, "")
        if value or key not in ("summary", "impact", "remediation"):
            return value
        known = ALERTS.get(self.alertname)
        return getattr(known, key, "") if known is not None else ""

    @property
    def onset(self) -> datetime:
        """When the fault's condition began: Prometheus reports ``startsAt`` when the alert
        *fired*, after its rule's ``for``; the rule states that delay in the ``for_seconds``
        annotation, so the issue (and its plot marker) sits where the slowdown started."""
        raw = self.annotations.get(ANNOTATION_FOR_SECONDS, "")
        try:
            pending = float(raw) if raw else 0.0
        except ValueError:
            pending = 0.0
        if not 0.0 < pending <= MAX_PENDING.total_seconds():
            return self.starts_at
        return self.starts_at - timedelta(seconds=pending)

    @property
    def where(self) -> str:
        """``host`` or ``host GPU n`` (or "unknown host")."""
        host = self.hostname or "unknown host"
        return f"{host} GPU {self.gpu}" if self.gpu else host

    def sort_key(self) -> tuple:
        """Precedence order: cause class, then time, then stable tie-breakers."""
        return (int(self.cause), self.onset, self.alertname, self.hostname, self.gpu,
                self.fingerprint)


@dataclass(frozen=True)
class Issue:
    """An incident: one root cause and the alerts it likely caused."""

    root: AlertFact
    consequences: tuple[AlertFact, ...]
    started_at: datetime
    ended_at: datetime | None
    reasoning: str

    @property
    def open(self) -> bool:
        """True while any of its alerts is still firing."""
        return self.ended_at is None

    @property
    def alertnames(self) -> tuple[str, ...]:
        """Root cause first, then consequence names in first-seen order, without repeats."""
        names = [self.root.alertname]
        for fact in self.consequences:
            if fact.alertname not in names:
                names.append(fact.alertname)
        return tuple(names)

    @property
    def key(self) -> str:
        """Stable identity of the issue (its root alert instance)."""
        return f"{self.root.fingerprint}@{self.root.starts_at.isoformat()}"


@dataclass(frozen=True)
class Diagnosis:
    """All issues of one run, oldest first."""

    issues: tuple[Issue, ...]

    @property
    def open_issues(self) -> tuple[Issue, ...]:
        """Issues with an alert still firing."""
        return tuple(i for i in self.issues if i.open)

    @property
    def root_cause(self) -> Issue | None:
        """The most severe issue by cause class, earliest first (the run's headline)."""
        if not self.issues:
            return None
        return min(self.issues, key=lambda i: i.root.sort_key())


_PLURAL_WORDS = {
    CauseClass.NODE_LOSS: "node losses",
    CauseClass.LINK_LOSS: "link losses",
    CauseClass.DEGRADATION: "performance degradations",
    CauseClass.SYMPTOM: "symptoms such as stalls and stragglers",
}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _reasoning(root: AlertFact, consequences: list[AlertFact]) -> str:
    if not consequences:
        return (f"{root.alertname} on {root.where} is the only alert in this incident, "
                f"so it is the root cause.")
    hosts = {c.hostname for c in consequences if c.hostname}
    later = [c for c in consequences if c.onset >= root.onset]
    names = sorted({c.alertname for c in consequences})
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    scope = f" on {_plural(len(hosts), 'host')}" if hosts else ""
    timing = ("started after it" if len(later) == len(consequences)
              else "overlap it in time")
    weaker = sorted({c.cause for c in consequences if c.cause > root.cause})
    if weaker:
        explained = " and ".join(_PLURAL_WORDS[c] for c in weaker)
        why = (f"{root.alertname} on {root.where} is {_CAUSE_WORDS[root.cause]}, which explains "
               f"{explained} but not the reverse")
    else:
        why = (f"{root.alertname} on {root.where} is the earliest of alerts of the same kind "
               f"({_CAUSE_WORDS[root.cause]})")
    twins = sorted({c.alertname for c in consequences
                    if c.cause == root.cause and c.hostname == root.hostname
                    and abs(c.onset - root.onset) <= SIMULTANEOUS})
    if twins and root.labels.get("xid"):
        why += (f", and it is the driver's own diagnosis (XID {root.labels['xid']}) of the event "
                f"that {', '.join(twins)} also report")
    return (f"{why}; the "
            f"{_plural(len(consequences), 'other alert')} ({shown}){scope} {timing}, so they "
            f"are likely consequences.")


def _incidents(facts: list[AlertFact], gap: timedelta) -> list[list[AlertFact]]:
    groups: list[list[AlertFact]] = []
    active_until: datetime | None = None
    for fact in sorted(facts, key=lambda f: (f.onset, f.sort_key())):
        if groups and active_until is not None and fact.onset <= active_until:
            groups[-1].append(fact)
        else:
            groups.append([fact])
            active_until = None
        end = (fact.ends_at or fact.onset) + gap
        active_until = end if active_until is None else max(active_until, end)
    return groups


def _pick_root(ordered: list[AlertFact]) -> AlertFact:
    """The strongest, earliest alert, unless a same-host, same-class alert of the same moment
    carries the driver's XID diagnosis (rule evaluation order must not decide the headline)."""
    first = ordered[0]
    same_event = [f for f in ordered
                  if f.cause == first.cause and f.hostname == first.hostname
                  and f.onset - first.onset <= SIMULTANEOUS]
    return min(same_event, key=lambda f: (0 if f.labels.get("xid") else 1, f.sort_key()))


def diagnose(alerts: Iterable[AlertFact], gap: timedelta = DEFAULT_GAP) -> Diagnosis:
    """Group one run's alerts into issues and name each issue's root cause (see module doc)."""
    unique = {(a.fingerprint, a.starts_at): a for a in alerts}
    issues = []
    for group in _incidents(list(unique.values()), gap):
        ordered = sorted(group, key=AlertFact.sort_key)
        root = _pick_root(ordered)
        rest = [f for f in ordered if f is not root]
        rest.sort(key=lambda f: (f.onset, f.sort_key()))
        ends = [f.ends_at for f in group]
        ended = None if any(e is None for e in ends) else max(e for e in ends if e is not None)
        issues.append(Issue(root, tuple(rest), min(f.onset for f in group), ended,
                            _reasoning(root, rest)))
    issues.sort(key=lambda i: (i.started_at, i.root.sort_key()))
    return Diagnosis(tuple(issues))
