"""What a run should show in W&B for a diagnosis: tags, summary entries, marker rows. Pure.

Tags: the user's tags first and untouched, then ``infra:<AlertName>`` for every issue, the run's
headline first, then the other root causes, then consequences. Summary entries are only written
while the run is not running (a live trainer rewrites its whole summary). Marker rows carry
stable ids so each is written once.
"""

from __future__ import annotations

from typing import Any

from bridge.diagnosis import Diagnosis
from bridge.notes import strip_controls

TAG_PREFIX = "infra:"
MAX_TAG = 64


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
    return out


def merged_tags(current: tuple[str, ...] | list[str], diagnosis: Diagnosis) -> list[str]:
    """The user's tags unchanged, then ours; infra tags the bridge wrote earlier are kept."""
    user = [t for t in current if not t.startswith(TAG_PREFIX)]
    ours = infra_tags(diagnosis)
    earlier = [t for t in current if t.startswith(TAG_PREFIX) and t not in ours]
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


def marker_rows(diagnosis: Diagnosis) -> list[tuple[str, dict[str, Any]]]:
    """(marker id, history row) for every issue start and end: 1 when it starts, 0 when it ends."""
    rows: list[tuple[str, dict[str, Any]]] = []
    for issue in diagnosis.issues:
        base = {"infra/root_cause": issue.root.alertname,
                "infra/cause_class": issue.root.cause.name.lower()}
        rows.append((f"start:{issue.key}",
                     {**base, "infra/issue": 1, "_timestamp": issue.started_at.timestamp()}))
        if issue.ended_at is not None:
            rows.append((f"end:{issue.key}",
                         {**base, "infra/issue": 0, "_timestamp": issue.ended_at.timestamp()}))
    return rows
