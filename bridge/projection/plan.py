"""What a run should show in W&B for a diagnosis: tags, summary entries, marker rows. Pure.

Tags: the user's tags first and untouched, then ``infra:<AlertName>`` for every issue, the run's
headline first, then the other root causes, then consequences. Summary entries are only written
while the run is not running (a live trainer rewrites its whole summary). Marker rows carry
stable ids so each is written once, and wait until the issue's root cause has settled.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from wandb_infra.bridge.diagnosis.impact import UNMEASURED, Impact, run_gpu_hours
from wandb_infra.bridge.diagnosis.root_cause import Diagnosis
from wandb_infra.bridge.ingest.schema import Mark
from wandb_infra.bridge.projection.notes import strip_controls
from wandb_infra.catalog.vocabulary import (
    MARKER_ALERT,
    MARKER_CAUSE,
    MARKER_ISSUE,
    MARKER_SUPERSEDED,
)

TAG_PREFIX = "infra:"
MAX_TAG = 64
# At most this many infra tags on a run (the last says how many more): a run hit by thousands of
# distinct alert names must not get thousands of tags.
MAX_INFRA_TAGS = 20
# The kinds of the marks kept per run (ingest/store.py): a tag the bridge wrote (only those are
# ever removed), when an issue was first seen (with its root's name), its start and end rows,
# its W&B alert, and the signature of the restart verdicts last written (one row, the latest).
TAG, SEEN, START, END, ALERT, RESTART = "tag", "seen", "start", "end", "alert", "restart"


def infra_tags(diagnosis: Diagnosis) -> list[str]:
    """``infra:<AlertName>`` tags: the headline's root cause first, then the other issues' root
    causes (oldest first), then consequences (the runs table shows the first tags)."""
    ranked = diagnosis.ranked
    roots = [i.root.alertname for i in ranked]
    rest = [name for i in ranked for name in i.alertnames[1:]]
    out: list[str] = []
    for raw in [*roots, *rest]:
        name = " ".join(strip_controls(raw).split())
        tag = (TAG_PREFIX + name)[:MAX_TAG]
        if name and tag not in out:
            out.append(tag)
    if len(out) > MAX_INFRA_TAGS:
        out = [*out[:MAX_INFRA_TAGS - 1], f"{TAG_PREFIX}+{len(out) - MAX_INFRA_TAGS + 1} more"]
    return out


_MORE = re.compile(re.escape(TAG_PREFIX) + r"\+\d+ more")


def merged_tags(current: tuple[str, ...] | list[str], diagnosis: Diagnosis,
                written: set[str] | frozenset[str] | None = None) -> list[str]:
    """The user's tags unchanged, then ours; infra tags the bridge wrote earlier are kept.

    ``written`` is every tag the bridge itself has written to the run (the store remembers
    them): only those are ever dropped (an old ``+N more`` count, tags beyond the cap), so a
    user's own ``infra:needs more`` survives. Without it (None) every ``infra:`` tag is taken
    for the bridge's, but only an exact ``infra:+<N> more`` count is dropped."""
    def bridge_wrote(tag: str) -> bool:
        return tag.startswith(TAG_PREFIX) if written is None else tag in written

    user = [t for t in current if not bridge_wrote(t)]
    ours = [t for t in infra_tags(diagnosis) if t not in user]
    room = max(0, MAX_INFRA_TAGS - len(ours))
    earlier = [t for t in current if bridge_wrote(t) and t not in ours
               and not _MORE.fullmatch(t)][:room]
    return [*user, *ours, *earlier]


def summary_entries(diagnosis: Diagnosis) -> dict[str, Any]:
    """Summary keys for the runs table: issue counts and the headline (its root cause)."""
    head = diagnosis.root_cause
    return {
        "infra/issues": len(diagnosis.issues),
        "infra/open_issues": len(diagnosis.open_issues),
        "infra/root_cause": "" if head is None else head.title,
        "infra/root_cause_alert": "" if head is None else head.root.alertname,
        "infra/root_cause_severity": "" if head is None else head.root.severity,
    }


def impact_entries(diagnosis: Diagnosis, impacts: Mapping[str, Impact] | None) -> dict[str, Any]:
    """``infra/gpu_hours_lost`` (the run's total) and ``infra/impact`` (the headline's measured
    effect), only when something was measured."""
    measured = {k: v for k, v in (impacts or {}).items() if v.kind != UNMEASURED}
    if not measured:
        return {}
    head = diagnosis.root_cause
    found = None if head is None else measured.get(head.key)
    return {"infra/gpu_hours_lost": round(run_gpu_hours(measured.values()), 3),
            "infra/impact": "" if found is None else found.kind}


@dataclass(frozen=True)
class MarkerPlan:
    """What the marker writer should do now for one run."""

    rows: list[tuple[Mark, dict[str, Any]]]
    seen: list[Mark]  # issues seen now for the first time (with the root's name, for an end
    wake_at: float | None  # row if the issue is superseded)


def _row(name: str, cause: str, value: int, at: float) -> dict[str, Any]:
    return {MARKER_ALERT: name, MARKER_CAUSE: cause, MARKER_ISSUE: value, "_timestamp": at}


def plan_markers(diagnosis: Diagnosis, marks: Sequence[Mark], now: float, settle: float,
                 onsets: Mapping[str, float] | None = None) -> MarkerPlan:
    """History rows are append-only, so an issue's rows wait until its root cause has been the
    same for ``settle`` seconds (a later notification may still bring the real cause), and are
    batched: written once the run's issues have all settled, or, so a run with ever-new issues
    still gets markers, once one has waited ``2 * settle``. The batch holds start rows, end rows
    of issues that ended, and an end row at ``now`` for an issue whose start row was written but
    which no longer exists (superseded by a better root cause). A start row sits at the
    issue's onset as every surface shows it (``onsets``: the measured change where the impact
    moved it), else where the issue started."""
    done = {(m.kind, m.key) for m in marks}
    first_seen = {m.key: (m.at, m.name) for m in marks if m.kind == SEEN}
    seen = [Mark(SEEN, i.key, now, i.root.alertname) for i in diagnosis.issues
            if i.key not in first_seen]
    since = {i.key: first_seen[i.key][0] if i.key in first_seen else now
             for i in diagnosis.issues}
    pending = [i for i in diagnosis.issues if (START, i.key) not in done
               or (i.ended_at is not None and (END, i.key) not in done)]
    settled_at = max(since.values(), default=now - settle) + settle
    overdue_at = min((since[i.key] + 2 * settle for i in pending), default=settled_at)
    if now < min(settled_at, overdue_at):
        return MarkerPlan([], seen, min(settled_at, overdue_at) if pending else None)
    rows: list[tuple[Mark, dict[str, Any]]] = []
    waits: list[float] = []
    for issue in pending:
        if now < since[issue.key] + settle:
            waits.append(since[issue.key] + settle)
            continue
        name, cause = issue.root.alertname, issue.root.cause.name.lower()
        if (START, issue.key) not in done:
            start = (onsets or {}).get(issue.key, issue.started_at.timestamp())
            rows.append((Mark(START, issue.key, now), _row(name, cause, 1, start)))
        if issue.ended_at is not None and (END, issue.key) not in done:
            rows.append((Mark(END, issue.key, now),
                         _row(name, cause, 0, issue.ended_at.timestamp())))
    for mark in marks:
        if mark.kind == START and mark.key not in since and (END, mark.key) not in done:
            name = first_seen.get(mark.key, (0.0, ""))[1]
            rows.append((Mark(END, mark.key, now),
                         {**_row(name, "", 0, now), MARKER_SUPERSEDED: 1}))
    return MarkerPlan(rows, seen, min(waits) if waits else None)
