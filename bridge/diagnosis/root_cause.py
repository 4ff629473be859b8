"""Root-cause diagnosis: the alerts of one run -> issues, each with a root cause and consequences.

Pure and deterministic (same alerts in any order -> same diagnosis), so the webhook path, the
``/runs`` pages and a post-mortem ``explain`` command that rebuilds alerts from Prometheus history
can all call ``diagnose``.

Rules:

* Alerts are grouped into incidents by time (an alert joins the incident whose activity it starts
  within ``gap`` of).
* Causality: a root cause begins before the alerts it explains, or within ``SIMULTANEOUS`` of
  them (a symptom such as a stall may lead by up to ``SYMPTOM_LEAD``: it is detected from raw
  activity within one cycle, while averaged fault signals cross their thresholds later). An alert
  that begins later can be a consequence or a separate issue, never the cause of what preceded it.
* Rank: severity first, across classes (a critical, job-killing fault outranks a warning whatever
  its class), then the cause class (hardware > node loss > link loss > degradation > symptom, from
  the catalog or the alert's ``category``), then onset. Among the alerts that may lead an
  incident, the best ranked is its root cause; later alerts it outranks (or ties) are its likely
  consequences, later alerts that outrank it are separate issues.
* The same alert on several GPUs of one host within ``SIMULTANEOUS`` is one event (its GPUs are
  listed together); an alert of the same class and severity on the same host at the same moment
  (an XID 94 also bumps the ECC counters) is the same event seen twice, and the one carrying the
  driver's own diagnosis (an ``xid`` label) names it, whichever rule evaluated first.
* An issue starts at its earliest alert (where the slowdown or failure became visible) and ends
  when all of its alerts resolved; the run's headline is its best-ranked issue by the same rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from wandb_infra.catalog.alerts import ALERTS, cause_of
from wandb_infra.catalog.vocabulary import ANNOTATION_FOR_SECONDS, SEVERITIES, CauseClass

DEFAULT_GAP = timedelta(minutes=10)
SIMULTANEOUS = timedelta(seconds=60)
SYMPTOM_LEAD = timedelta(minutes=5)
MAX_PENDING = timedelta(days=1)
# Severity rank: critical 0, warning 1, info 2; an alert without a known severity counts as a
# warning (a user's own rule routed to the bridge) so it neither hides nor headlines a fault.
_SEVERITY_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}
_UNKNOWN_SEVERITY = _SEVERITY_RANK["warning"]

_CAUSE_WORDS = {
    CauseClass.HARDWARE: "a hardware fault",
    CauseClass.MAINTENANCE: "planned maintenance of a node",
    CauseClass.NODE_LOSS: "the loss of a node",
    CauseClass.LINK_LOSS: "the loss of a network link",
    CauseClass.HOST_RESOURCE: "the loss of a host resource (memory, a filesystem)",
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

    @property
    def severity_rank(self) -> int:
        """0 for critical, 1 for warning (and unknown), 2 for info."""
        return _SEVERITY_RANK.get(self.severity, _UNKNOWN_SEVERITY)

    @property
    def strength(self) -> tuple[int, int]:
        """What makes an alert a stronger cause, before time: severity, then cause class."""
        return (self.severity_rank, int(self.cause))

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

    def rank_key(self) -> tuple:
        """Precedence order: severity, cause class, onset, then stable tie-breakers."""
        return (*self.strength, self.onset, self.alertname, self.hostname, self.gpu,
                self.fingerprint)


def gpu_list(gpus: Iterable[str]) -> str:
    """``0-3, 6``: numeric GPU indices as ranges, anything else as given."""
    numeric = sorted({int(g) for g in gpus if g.isdigit()})
    other = sorted({g for g in gpus if g and not g.isdigit()})
    parts: list[str] = []
    for n in numeric:
        if parts and parts[-1].split("-")[-1] == str(n - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{n}"
        else:
            parts.append(str(n))
    return ", ".join(parts + other)


@dataclass(frozen=True)
class Issue:
    """An incident: one root cause (an event, maybe on several GPUs) and what it likely caused."""

    root: AlertFact
    consequences: tuple[AlertFact, ...]
    started_at: datetime
    ended_at: datetime | None
    reasoning: str
    peers: tuple[AlertFact, ...] = ()

    @property
    def open(self) -> bool:
        """True while any of its alerts is still firing."""
        return self.ended_at is None

    @property
    def root_ended_at(self) -> datetime | None:
        """When the root event (root and peers) resolved; None while any of them fires."""
        ends = [f.ends_at for f in (self.root, *self.peers)]
        return None if any(e is None for e in ends) else max(e for e in ends if e is not None)

    @property
    def consequences_firing(self) -> int:
        """How many consequence alerts still fire."""
        return sum(1 for c in self.consequences if c.ends_at is None)

    @property
    def where(self) -> str:
        """The root event's place: ``host GPUs 0-3`` when it hit several GPUs at once."""
        if not self.peers:
            return self.root.where
        gpus = [f.gpu for f in (self.root, *self.peers)]
        host = self.root.hostname or "unknown host"
        return f"{host} GPUs {gpu_list(gpus)}" if all(gpus) else host

    @property
    def title(self) -> str:
        """``<AlertName> on <where>``: how the issue is named everywhere."""
        return f"{self.root.alertname} on {self.where}"

    @property
    def alertnames(self) -> tuple[str, ...]:
        """Root cause first, then consequence names in first-seen order, without repeats."""
        return tuple(dict.fromkeys(f.alertname for f in (self.root, *self.consequences)))

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
        """The run's headline: its best-ranked issue (severity, cause class, onset)."""
        return None if not self.issues else min(self.issues, key=lambda i: i.root.rank_key())

    @property
    def ranked(self) -> tuple[Issue, ...]:
        """The headline first, then the other issues oldest first (how W&B lists them)."""
        head = self.root_cause
        return () if head is None else (head, *(i for i in self.issues if i is not head))

    @property
    def headline_reason(self) -> str:
        """Why the headline outranks the run's other issues (empty with fewer than two)."""
        head = self.root_cause
        others = [i for i in self.issues if i is not head]
        if head is None or not others:
            return ""
        rival = min(others, key=lambda i: i.root.rank_key()).root
        return (f"{head.title} is the most consequential of {len(self.issues)} issues: "
                f"{_decider(head.root, rival)}.")


_PLURAL_WORDS = {
    CauseClass.MAINTENANCE: "node maintenance",
    CauseClass.NODE_LOSS: "node losses",
    CauseClass.LINK_LOSS: "link losses",
    CauseClass.HOST_RESOURCE: "host resource losses",
    CauseClass.DEGRADATION: "performance degradations",
    CauseClass.SYMPTOM: "symptoms such as stalls and stragglers",
}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _severity(fact: AlertFact) -> str:
    return fact.severity or "of unknown severity"


def _decider(root: AlertFact, rival: AlertFact) -> str:
    """Which of severity, cause class or onset puts ``root`` before ``rival`` (say it)."""
    if root.severity_rank != rival.severity_rank:
        return (f"severity decided: it is {_severity(root)} and {rival.alertname} is "
                f"{_severity(rival)} (a critical fault outranks a warning whatever its class)")
    if root.cause != rival.cause:
        return (f"cause class decided: both are {_severity(root)}, and it is "
                f"{_CAUSE_WORDS[root.cause]}, which outranks {_CAUSE_WORDS[rival.cause]}")
    return (f"onset decided: it began first among {_severity(root)} alerts of the same kind "
            f"({_CAUSE_WORDS[root.cause]})")


def _minutes(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


def _reasoning(root: AlertFact, peers: list[AlertFact], consequences: list[AlertFact],
               earlier: AlertFact | None) -> str:
    where = root.where if not peers else f"{root.hostname} ({1 + len(peers)} GPUs at once)"
    text = ""
    if earlier is not None:
        text = (f"{root.alertname} on {where} began {_minutes(root.onset - earlier.onset)} "
                f"after {earlier.alertname} on {earlier.where}: it cannot have caused it (a later "
                f"alert never causes what preceded it), and it is of a stronger kind or "
                f"severity than that alert can cause, so it is a separate issue. ")
    if not consequences:
        return text + (f"{root.alertname} on {where} is the only alert of this issue, "
                       f"so it is the root cause.")
    hosts = {c.hostname for c in consequences if c.hostname}
    later = [c for c in consequences if c.onset >= root.onset]
    names = sorted({c.alertname for c in consequences})
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    scope = f" on {_plural(len(hosts), 'host')}" if hosts else ""
    timing = ("started after it" if len(later) == len(consequences)
              else "started with it (within the detection delay of its signal)")
    rival = min(consequences, key=AlertFact.rank_key)
    if rival.rank_key() < root.rank_key() and rival.strength == root.strength:
        decided = (f"the driver's diagnosis decided: {rival.alertname} is the same event, "
                   f"seen by a counter")
    elif rival.rank_key() < root.rank_key() and root.cause is CauseClass.MAINTENANCE:
        decided = (f"the node was under maintenance before {rival.alertname} began, so the "
                   f"work on it explains that alert, {_severity(rival)} as it is")
    elif rival.rank_key() < root.rank_key():
        decided = f"{rival.alertname} is {_severity(rival)} but a symptom, which explains nothing"
    else:
        decided = _decider(root, rival)
    why = f"{root.alertname} on {where} is the root cause ({decided})"
    weaker = sorted({c.cause for c in consequences if c.cause > root.cause})
    if weaker:
        explained = " and ".join(_PLURAL_WORDS[c] for c in weaker)
        why += (f"; {_CAUSE_WORDS[root.cause]} explains {explained} but not the reverse")
    twins = sorted({c.alertname for c in consequences
                    if c.cause == root.cause and c.hostname == root.hostname
                    and abs(c.onset - root.onset) <= SIMULTANEOUS})
    if twins and root.labels.get("xid"):
        why += (f", and it is the driver's own diagnosis (XID {root.labels['xid']}) of the event "
                f"that {', '.join(twins)} also report")
    one = len(consequences) == 1
    kinds = "is of a kind it explains, so it is a likely consequence" if one else \
        "are of kinds it explains, so they are likely consequences"
    return (f"{text}{why}; the {_plural(len(consequences), 'other alert')} ({shown}){scope} "
            f"{timing} and {kinds}.")


def _incidents(facts: list[AlertFact], gap: timedelta) -> list[list[AlertFact]]:
    groups: list[list[AlertFact]] = []
    active_until: datetime | None = None
    for fact in sorted(facts, key=lambda f: (f.onset, f.rank_key())):
        if groups and active_until is not None and fact.onset <= active_until:
            groups[-1].append(fact)
        else:
            groups.append([fact])
            active_until = None
        end = (fact.ends_at or fact.onset) + gap
        active_until = end if active_until is None else max(active_until, end)
    return groups


def _lead(cause: AlertFact, fact: AlertFact) -> timedelta:
    """How long ``fact`` may begin before ``cause`` and still be explained by it."""
    symptom = fact.cause is CauseClass.SYMPTOM and cause.cause is not CauseClass.SYMPTOM
    return SYMPTOM_LEAD if symptom else SIMULTANEOUS


def _explains(root: AlertFact, fact: AlertFact) -> bool:
    """``fact`` may be a consequence of ``root``: it did not begin before it (beyond ``_lead``)
    and is not of a stronger class or severity (a link loss causes no ECC errors, a warning no
    critical fault); a symptom (stall, straggler) can follow any fault, whatever its severity."""
    if fact.onset < root.onset - _lead(root, fact):
        return False
    if fact.cause is CauseClass.SYMPTOM and root.cause is not CauseClass.SYMPTOM:
        return True
    if root.cause is CauseClass.MAINTENANCE and fact.hostname == root.hostname:
        # A node under maintenance reboots, loses its links and GPUs: whatever its alerts say
        # afterwards, the work on it explains them, whatever their severity.
        return True
    return fact.cause >= root.cause and fact.severity_rank >= root.severity_rank


def _may_lead(remaining: list[AlertFact]) -> list[AlertFact]:
    """Alerts that explain, by time, everything that began before them (see ``_lead``); O(n)
    from the earliest onsets. The earliest alert always qualifies."""
    first = min(f.onset for f in remaining)
    cause_bound = min(f.onset + (SYMPTOM_LEAD if f.cause is CauseClass.SYMPTOM else SIMULTANEOUS)
                      for f in remaining)
    return [f for f in remaining
            if f.onset <= (first + SIMULTANEOUS if f.cause is CauseClass.SYMPTOM
                           else cause_bound)]


def _pick_root(candidates: list[AlertFact]) -> AlertFact:
    """The best-ranked candidate, unless a same-host alert of the same class, severity and
    moment carries the driver's XID diagnosis (rule evaluation order must not decide it)."""
    best = min(candidates, key=AlertFact.rank_key)
    same_event = [f for f in candidates
                  if f.strength == best.strength and f.hostname == best.hostname
                  and abs(f.onset - best.onset) <= SIMULTANEOUS]
    return min(same_event, key=lambda f: (0 if f.labels.get("xid") else 1, f.rank_key()))


def _split(group: list[AlertFact]) -> list[Issue]:
    """One incident's alerts -> issues. Roots in turn: the best of the alerts that may lead
    what is still unexplained; then each other alert goes to the best-ranked root that explains
    it (a stall during an old warning and a new XID is the XID's)."""
    remaining = sorted(group, key=AlertFact.rank_key)
    events: list[tuple[AlertFact, list[AlertFact]]] = []
    while remaining:
        root = _pick_root(_may_lead(remaining))
        peers = [f for f in remaining
                 if f is not root and f.alertname == root.alertname
                 and f.hostname == root.hostname and f.severity == root.severity
                 and abs(f.onset - root.onset) <= SIMULTANEOUS]
        events.append((root, peers))
        taken = {id(root), *(id(f) for f in peers)}
        remaining = [f for f in remaining if id(f) not in taken and not _explains(root, f)]
    in_events = {id(f) for root, peers in events for f in (root, *peers)}
    by_rank = sorted(events, key=lambda e: e[0].rank_key())
    caused: dict[int, list[AlertFact]] = {id(root): [] for root, _ in events}
    for fact in group:
        if id(fact) not in in_events:
            cause = next(root for root, _ in by_rank if _explains(root, fact))
            caused[id(cause)].append(fact)
    issues: list[Issue] = []
    first = events[0][0]
    for root, peers in events:
        rest = sorted(caused[id(root)], key=lambda f: (f.onset, f.rank_key()))
        members = [root, *peers, *rest]
        ends = [f.ends_at for f in members]
        ended = None if any(e is None for e in ends) else max(e for e in ends if e is not None)
        issues.append(Issue(root, tuple(rest), min(f.onset for f in members), ended,
                            _reasoning(root, peers, rest, None if root is first else first),
                            tuple(sorted(peers, key=AlertFact.rank_key))))
    return issues


def diagnose(alerts: Iterable[AlertFact], gap: timedelta = DEFAULT_GAP) -> Diagnosis:
    """Group one run's alerts into issues and name each issue's root cause (see module doc)."""
    unique = {(a.fingerprint, a.starts_at): a for a in alerts}
    issues = [issue for group in _incidents(list(unique.values()), gap)
              for issue in _split(group)]
    issues.sort(key=lambda i: (i.started_at, i.root.rank_key()))
    return Diagnosis(tuple(issues))
