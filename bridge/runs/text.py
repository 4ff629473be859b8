"""A run view as plain text, for terminals (``explain``, the bridge's ``?format=text`` page the
demo prints): root cause first, then what it means for the run, what to do, the Grafana link,
and the consequences grouped by alert. Issues other than the headline are labelled as separate
issues, not root causes."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from wandb_infra.bridge.runs.view import (
    UNMEASURED,
    AlertFact,
    Impact,
    IssueView,
    LinkFn,
    RunView,
    runbook_url,
    stamp,
)

_MAX_WHERE = 6


def _at(value: datetime) -> str:
    return str(stamp(value)).replace("T", " ")


def _consequence_lines(consequences: tuple[AlertFact, ...]) -> list[str]:
    by_name: dict[str, list[AlertFact]] = defaultdict(list)
    for fact in consequences:
        by_name[fact.alertname].append(fact)
    lines = []
    for name, facts in sorted(by_name.items(), key=lambda kv: min(f.starts_at for f in kv[1])):
        places = sorted({f.hostname or "?" for f in facts})
        shown = ", ".join(places[:_MAX_WHERE])
        more = f" and {len(places) - _MAX_WHERE} more" if len(places) > _MAX_WHERE else ""
        first = _at(min(f.onset for f in facts))
        lines.append(f"      - {name} on {len(places)} host(s) ({shown}{more}), from {first}")
    return lines


def _impact_lines(root: AlertFact, impact: Impact | None) -> list[str]:
    """The measured effect and its cost (diagnosis/impact.py), else the catalog's prose."""
    if impact is None or impact.kind == UNMEASURED:
        return [f"    impact      {root.text('impact')}"]
    lines = [f"    effect      {impact.headline}", f"    expected    {root.text('impact')}",
             f"    lost        {impact.cost_text}"]
    return lines + ([f"    onset       {impact.onset_reason}"] if impact.onset_reason else [])


def _issue_lines(number: int, view: IssueView, leads: bool, link_for: LinkFn) -> list[str]:
    issue, root, rem = view.issue, view.issue.root, view.remediation
    where = (root.hostname or "unknown host") + (f" GPU {root.gpu}" if root.gpu else "")
    state = "open" if issue.open else f"closed at {stamp(issue.ended_at)}"
    end = f" -> {_at(root.ends_at)}" if root.ends_at else " (firing)"
    lines = [
        "",
        f"  Issue {number} ({state}), started {stamp(issue.started_at)}"
        + ("" if leads else ", a separate issue, not the headline"),
        f"    {'ROOT CAUSE' if leads else 'CAUSE     '}  {root.alertname} on {where} "
        f"[{root.severity}, {root.category}]",
        f"    when        {_at(view.onset)}{end}",
        f"    what        {root.text('description') or root.text('summary')}",
        *_impact_lines(root, view.impact),
        f"    do now      {view.advice}",
        f"    why         {issue.reasoning}",
    ]
    if rem is not None:
        lines.append(f"    restart?    {rem.verdict}: {rem.detail}")
        if rem.exclusion:
            lines.append(f"    exclude     {rem.exclusion}")
        for host in rem.as_dict()["hosts"]:
            reason = f", reason '{host['reason']}'" if host["reason"] else ""
            lines.append(f"    node        {host['hostname']} {host['state']} "
                         f"since {host['since']}{reason}")
    for name, url in (("grafana", link_for(root, issue.started_at, issue.ended_at)),
                      ("runbook", runbook_url(root))):
        if url:
            lines.append(f"    {name:<12}{url}")
    if issue.consequences:
        lines.append(f"    likely consequences ({len(issue.consequences)} alert(s)):")
        lines += _consequence_lines(issue.consequences)
    return lines


def render_text(view: RunView, link_for: LinkFn) -> str:
    """The issues of one run, in the diagnosis' order, as the user would read them."""
    lines = [f"Run {view.run.path()}: {len(view.issues)} infrastructure issue(s)"]
    if view.impacts:
        lines.append(f"  GPU-hours lost: {view.gpu_hours}")
    head = view.head
    if head is not None:
        lines.append(f"  Headline: {head.issue.title}. {view.diagnosis.headline_reason}".rstrip())
    for number, issue in enumerate(view.issues, 1):
        lines += _issue_lines(number, issue, head is None or issue is head, link_for)
    return "\n".join(lines)
