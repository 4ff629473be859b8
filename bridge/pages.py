"""The embedded issue views (``/runs`` and ``/runs/<entity>/<project>/<run_id>``) as JSON and HTML.

JSON builders turn diagnoses into plain dicts; the HTML renderers only format those dicts, and
every value passes through ``html.escape`` so label text cannot inject markup or script.
"""

from __future__ import annotations

from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote

from bridge.diagnosis import AlertFact, Diagnosis, Issue
from bridge.identity import RunKey
from bridge.notes import LinkFn
from bridge.store import OutboxRow

_STYLE = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}"
          "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;"
          "text-align:left;vertical-align:top}.root{color:#b00020;font-weight:600}"
          ".muted{color:#666}")


def _t(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def delivery_status(row: OutboxRow | None) -> dict[str, Any]:
    """Where the run's W&B projection stands."""
    if row is None:
        return {"state": "not queued"}
    if row.parked:
        return {"state": "parked", "reason": row.parked}
    if row.dirty_seq > row.delivered_seq:
        return {"state": "pending", "attempts": row.attempts, "last_error": row.last_error}
    return {"state": "delivered", "at": row.delivered_at}


def _fact(fact: AlertFact, link: str) -> dict[str, Any]:
    return {
        "alertname": fact.alertname, "severity": fact.severity, "category": fact.category,
        "hostname": fact.hostname, "gpu": fact.gpu, "cause_class": fact.cause.name.lower(),
        "onset": _t(fact.onset), "starts_at": _t(fact.starts_at), "ends_at": _t(fact.ends_at),
        "summary": fact.text("summary"), "description": fact.text("description"),
        "impact": fact.text("impact"), "remediation": fact.text("remediation"),
        "runbook_url": fact.annotations.get("runbook_url", ""), "grafana": link,
    }


def _issue(issue: Issue, link_for: LinkFn) -> dict[str, Any]:
    return {
        "started_at": _t(issue.started_at), "ended_at": _t(issue.ended_at), "open": issue.open,
        "reasoning": issue.reasoning,
        "root_cause": _fact(issue.root, link_for(issue.root, issue.started_at, issue.ended_at)),
        "consequences": [_fact(c, link_for(c, c.onset, c.ends_at))
                         for c in issue.consequences],
    }


def run_summary(run: RunKey, diagnosis: Diagnosis, alerts: int, firing: int,
                outbox: OutboxRow | None) -> dict[str, Any]:
    """One row of the issues column."""
    root = diagnosis.root_cause
    return {
        "entity": run.entity, "project": run.project, "run_id": run.run_id,
        "alerts": alerts, "firing": firing, "issues": len(diagnosis.issues),
        "open_issues": len(diagnosis.open_issues),
        "root_cause": None if root is None else {"alertname": root.root.alertname,
                                                 "where": root.root.where},
        "wandb": delivery_status(outbox),
    }


def run_detail(run: RunKey, diagnosis: Diagnosis, link_for: LinkFn,
               outbox: OutboxRow | None) -> dict[str, Any]:
    """The drawer: every issue with its root cause, consequences and links."""
    return {"entity": run.entity, "project": run.project, "run_id": run.run_id,
            "wandb": delivery_status(outbox),
            "issues": [_issue(i, link_for) for i in diagnosis.issues]}


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>{body}</body></html>")


def _link(url: str, text: str) -> str:
    if not url.startswith(("http://", "https://")):
        return escape(text) if not url else ""
    return f"<a href='{escape(url, quote=True)}' rel='noopener noreferrer'>{escape(text)}</a>"


def runs_html(rows: list[dict[str, Any]], unattributed: int) -> str:
    """The issues column: one table row per run."""
    out = ["<h1>Runs with infrastructure issues</h1><table><tr><th>Run</th><th>Issues</th>"
           "<th>Open</th><th>Root cause</th><th>Alerts (firing)</th><th>W&amp;B</th></tr>"]
    for r in rows:
        href = "/runs/" + "/".join(quote(r[k], safe="") for k in ("entity", "project", "run_id"))
        name = f"{r['entity']}/{r['project']}/{r['run_id']}"
        root = r["root_cause"]
        out.append(
            f"<tr><td><a href='{escape(href, quote=True)}'>{escape(name)}</a></td>"
            f"<td>{r['issues']}</td><td>{r['open_issues']}</td>"
            f"<td>{'' if root is None else escape(root['alertname'] + ' on ' + root['where'])}"
            f"</td><td>{r['alerts']} ({r['firing']})</td>"
            f"<td>{escape(r['wandb']['state'])}</td></tr>")
    out.append("</table>")
    if unattributed:
        out.append(f"<p><a href='/unattributed'>{unattributed} unattributed alerts</a> "
                   "(no run on that host or GPU)</p>")
    return _page("Runs with infrastructure issues", "".join(out))


def _fact_html(f: dict[str, Any], role: str) -> str:
    where = f["hostname"] + (f" GPU {f['gpu']}" if f["gpu"] else "")
    parts = [f"<td class='{'root' if role == 'root cause' else ''}'>{escape(role)}</td>",
             f"<td>{escape(f['alertname'])}<br><span class='muted'>{escape(f['severity'])} "
             f"{escape(f['category'])}</span></td>",
             f"<td>{escape(where)}</td>",
             f"<td>{escape(f['onset'] or '')} - {escape(f['ends_at'] or 'ongoing')}</td>",
             f"<td>{escape(f['description'] or f['summary'])}</td>",
             f"<td>{_link(f['grafana'], 'Grafana')}</td>"]
    return "<tr>" + "".join(parts) + "</tr>"


def run_html(detail: dict[str, Any], title: str) -> str:
    """The drawer of one run."""
    out = [f"<h1>{escape(title)}</h1><p><a href='/runs'>all runs</a> &middot; W&amp;B: "
           f"{escape(str(detail['wandb'].get('state')))} "
           f"{escape(str(detail['wandb'].get('reason') or ''))}</p>"]
    if not detail["issues"]:
        out.append("<p>No issues.</p>")
    for n, issue in enumerate(detail["issues"], start=1):
        root = issue["root_cause"]
        state = "open" if issue["open"] else "resolved"
        out.append(
            f"<h2>{n}. {escape(root['alertname'])} ({state})</h2>"
            f"<p>{escape(issue['started_at'] or '')} - {escape(issue['ended_at'] or 'ongoing')}"
            f"</p><p><b>Why:</b> {escape(issue['reasoning'])}</p>"
            f"<p><b>Impact:</b> {escape(root['impact'])}</p>"
            f"<p><b>What to do:</b> {escape(root['remediation'])}</p>"
            "<table><tr><th>Role</th><th>Alert</th><th>Where</th><th>When</th>"
            "<th>Description</th><th>Link</th></tr>")
        out.append(_fact_html(root, "root cause"))
        out.extend(_fact_html(c, "consequence") for c in issue["consequences"])
        out.append("</table>")
    return _page(title, "".join(out))
