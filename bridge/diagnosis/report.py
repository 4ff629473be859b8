"""Plain-text rendering of a run's issues, for terminals (the demo, ``explain``).

Input is the JSON view the bridge serves at ``/runs/<entity>/<project>/<run_id>``, so the terminal,
the HTML page and W&B all tell the same story: root cause first, then what it means for the run,
what to do, the Grafana link, and the consequences grouped by alert. When the view names the run's
headline (``explain`` does), the other issues are labelled as separate issues, not root causes.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

_MAX_WHERE = 6


def _when(fact: dict[str, Any]) -> str:
    start = (fact.get("onset") or fact.get("starts_at") or "?").replace("T", " ")
    end = fact.get("ends_at")
    return f"{start} -> {end.replace('T', ' ')}" if end else f"{start} (firing)"


def _consequence_lines(consequences: list[dict[str, Any]]) -> list[str]:
    by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for fact in consequences:
        by_name[fact["alertname"]].append(fact)
    lines = []
    for name, facts in sorted(by_name.items(), key=lambda kv: min(f["starts_at"] for f in kv[1])):
        places = sorted({f.get("hostname") or "?" for f in facts})
        shown = ", ".join(places[:_MAX_WHERE])
        more = f" and {len(places) - _MAX_WHERE} more" if len(places) > _MAX_WHERE else ""
        first = min(f.get("onset") or f["starts_at"] for f in facts).replace("T", " ")
        lines.append(f"      - {name} on {len(places)} host(s) ({shown}{more}), from {first}")
    return lines


def _impact_lines(root: dict[str, Any], impact: dict[str, Any] | None) -> list[str]:
    """The measured effect and its cost (bridge/diagnosis/impact.py), else the catalog's prose."""
    if not impact or impact.get("kind") == "unmeasured":
        return [f"    impact      {root.get('impact') or ''}"]
    lines = [f"    effect      {impact.get('headline')}",
             f"    expected    {root.get('impact') or ''}",
             f"    lost        {impact.get('cost_text')}"]
    if impact.get("onset_reason"):
        lines.append(f"    onset       {impact['onset_reason']}")
    return lines


def render_run(view: dict[str, Any]) -> str:
    """The issues of one run, root cause first, as the user would read them."""
    run = f"{view.get('entity')}/{view.get('project')}/{view.get('run_id')}"
    issues = view.get("issues") or []
    lines = [f"Run {run}: {len(issues)} infrastructure issue(s)"]
    head = view.get("headline") or {}
    if view.get("impacts"):
        lines.append(f"  GPU-hours lost: {view.get('gpu_hours_lost')}")
    if head:
        lines.append(f"  Headline: {head.get('title')}. {head.get('reason') or ''}".rstrip())
    for number, issue in enumerate(issues, 1):
        root = issue["root_cause"]
        leads = not head or head.get("issue") == number - 1
        restart = (view.get("remediations") or {}).get(issue.get("key")) or (
            view.get("remediation") if leads else None)
        where = root.get("hostname") or "unknown host"
        if root.get("gpu"):
            where += f" GPU {root['gpu']}"
        state = "open" if issue.get("open") else f"closed at {issue.get('ended_at')}"
        lines += [
            "",
            f"  Issue {number} ({state}), started {issue.get('started_at')}"
            + ("" if leads else ", a separate issue, not the headline"),
            f"    {'ROOT CAUSE' if leads else 'CAUSE     '}  {root['alertname']} on {where} "
            f"[{root.get('severity')}, "
            f"{root.get('category')}]",
            f"    when        {_when(root)}",
            f"    what        {root.get('description') or root.get('summary') or ''}",
            *_impact_lines(root, (view.get("impacts") or {}).get(issue.get("key"))),
            f"    do now      {(restart or {}).get('advice') or root.get('remediation') or ''}",
            f"    why         {issue.get('reasoning') or ''}",
        ]
        if restart:
            lines.append(f"    restart?    {restart.get('verdict')}: {restart.get('detail')}")
            if restart.get("exclusion"):
                lines.append(f"    exclude     {restart['exclusion']}")
            for host in restart.get("hosts") or []:
                reason = f", reason '{host['reason']}'" if host.get("reason") else ""
                lines.append(f"    node        {host.get('hostname')} {host.get('state')} "
                             f"since {host.get('since')}{reason}")
        if root.get("grafana"):
            lines.append(f"    grafana     {root['grafana']}")
        if root.get("runbook_url"):
            lines.append(f"    runbook     {root['runbook_url']}")
        consequences = issue.get("consequences") or []
        if consequences:
            lines.append(f"    likely consequences ({len(consequences)} alert(s)):")
            lines += _consequence_lines(consequences)
    return "\n".join(lines)
