"""The issue pages (``/runs`` and ``/runs/<entity>/<project>/<run_id>``) as HTML, rendered from
the typed run view, every value through ``html.escape`` (label text cannot inject markup). The
run page leads with a headline card that fits the first screen, then the incident in time, then
the consequences grouped by alert name: a 64-host cascade is one story, not 65 rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from wandb_infra.bridge.runs.view import (
    UNMEASURED,
    Activity,
    AlertFact,
    Impact,
    Issue,
    IssueView,
    Joined,
    LinkFn,
    Outcome,
    QuarantineView,
    Reading,
    Remediation,
    RunRow,
    RunView,
    Unconfirmed,
    hours_text,
    runbook_url,
    when,
)
from wandb_infra.bridge.web.timeline import (
    CHART_WIDTHS,
    activity_svg,
    by_name,
    clock,
    colour,
    offset_text,
    onset,
    timeline_svg,
)
from wandb_infra.catalog import runbook

_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:0;color:#1d2127;background:#f4f5f7}"
    "main{max-width:1140px;margin:0 auto;padding:12px 20px}"
    "header{display:flex;gap:1em;align-items:baseline;flex-wrap:wrap}"
    "h1{font-size:1.25em;margin:.3em 0}h2{font-size:1.1em;margin:.2em 0}"
    "a{color:#0b57d0}.muted{color:#5f6368}.small{font-size:.85em}"
    ".pill{display:inline-block;border-radius:1em;padding:.1em .7em;font-size:.85em;"
    "background:#e8eaed}.pill.bad{background:#fde7e9;color:#8c0010}"
    ".pill.ok{background:#e6f4ea;color:#1e6b34}.pill.warn{background:#fff4e0;color:#7a4a00}"
    ".card{background:#fff;border-radius:8px;box-shadow:0 1px 3px #0002;padding:14px 18px;"
    "margin:10px 0;border-left:6px solid #c77700}"
    ".card dl{display:grid;grid-template-columns:7.5em 1fr;gap:.35em 1em;margin:.6em 0}"
    ".card dt{font-weight:600;color:#5f6368}.card dd{margin:0}"
    ".badge{font-size:.75em;font-weight:700;letter-spacing:.05em;color:#fff;"
    "border-radius:3px;padding:.15em .5em;vertical-align:middle}"
    ".btn{display:inline-block;padding:.45em 1em;border-radius:5px;background:#0b57d0;"
    "color:#fff;text-decoration:none;font-weight:600;margin-right:.6em}"
    ".btn.alt{background:#fff;color:#0b57d0;border:1px solid #0b57d0}"
    "table{border-collapse:collapse;width:100%;background:#fff}"
    "td,th{border-bottom:1px solid #e3e5e8;padding:.35em .6em;text-align:left;"
    "vertical-align:top}th{background:#f8f9fa;font-weight:600}"
    "td.sev{width:6px;padding:0}details summary{cursor:pointer;color:#0b57d0}"
    # each chart comes laid out for two widths and fills the content box at its own scale:
    # the wide layout from a 1060 px window (text >= 10 px), the narrow one below (11 px at 800)
    "svg{max-width:100%;height:auto;background:#fff;font-size:11px}"
    ".chart svg{display:block;width:100%}.chart svg.narrow{display:none}"
    "@media (max-width:1059px){.chart svg{display:none}.chart svg.narrow{display:block}}"
    "svg .mk{font-size:11px;font-weight:600}svg .ax{fill:#5f6368}"
    "code{background:#f1f3f4;padding:.1em .3em;border-radius:3px}"
    "code.excl{white-space:pre-wrap;display:inline-block;margin:.2em 0}"
    "form.filters{display:flex;gap:.6em;align-items:end;flex-wrap:wrap;margin:.5em 0}"
    "label{font-size:.85em;color:#5f6368;display:flex;flex-direction:column}"
    ".note{background:#fff8e1;padding:.4em .8em;border-radius:4px}"
    "td.n{white-space:nowrap}.login{max-width:26em;border-left-color:#0b57d0}"
    # /runs at 800 px: long run ids wrap, the counts give way to the headline
    "table.runs td.run{overflow-wrap:anywhere;min-width:8em}"
    "@media (max-width:959px){table.runs .wide{display:none}table.runs td.n{white-space:normal}}"
    ".login input{font-size:1em;padding:.3em}"
    "button{font-size:.95em;padding:.3em .9em}")


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{escape(title)}</title><style>{_STYLE}</style></head>"
            f"<body><main>{body}</main></body></html>")


def _back(title: str, extra: str = "") -> str:
    return f"<header><a href='/runs'>&larr; all runs</a><h1>{escape(title)}</h1>{extra}</header>"


def _link(url: str, text: str, cls: str = "") -> str:
    """A link only to http(s) targets or the bridge's own runbook (annotations are untrusted: no
    ``javascript:``)."""
    if not url.startswith(("http://", "https://", f"{runbook.PATH}#")):
        return ""
    c = f" class='{cls}'" if cls else ""
    return (f"<a{c} href='{escape(url, quote=True)}' rel='noopener noreferrer'>"
            f"{escape(text)}</a>")


def wandb_text(status: dict[str, Any]) -> tuple[str, str]:
    """(text, pill class): off / pending / written at T / parked: reason."""
    state = status.get("state")
    if state == "off":
        return "W&B: off (no API key configured)", ""
    if state == "delivered":
        at = status.get("at")
        return f"W&B: written{'' if at is None else ' at ' + when(at)}", "ok"
    if state == "parked":
        return f"W&B: parked: {status.get('reason') or 'unknown reason'}", "bad"
    if state == "pending":
        tries = status.get("attempts") or 0
        err = status.get("last_error")
        extra = f" ({tries} attempt(s), last error: {err})" if tries and err else ""
        return f"W&B: pending{extra}", "warn"
    return f"W&B: {state}", ""


def runs_html(rows: Sequence[RunRow], unattributed: int, *,
              filters: dict[str, str] | None = None, offset: int = 0, limit: int = 0,
              more: bool = False) -> str:
    """The issues column: newest first, a severity colour per headline, filters and paging."""
    filters = filters or {}
    link = (f"<a href='/unattributed'>{unattributed} unattributed alerts</a> "
            "<span class='muted small'>(no run on that host or GPU)</span>"
            if unattributed else "")
    out = [f"<header><h1>Runs with infrastructure issues</h1>{link}</header>",
           _filter_form(filters, limit)]
    out.append("<table class='runs'><tr><th class='sev'></th><th>Run</th>"
               "<th>Headline (root cause)</th><th>Started</th><th class='wide'>Issues</th>"
               "<th class='wide'>Alerts (firing)</th><th>Verdict</th><th>W&amp;B</th></tr>")
    for r in rows:
        name, href = r.run.path(), "/runs/" + "/".join(quote(k, safe="") for k in r.run)
        if r.error:
            head = f"<span class='pill bad'>cannot diagnose: {escape(r.error)}</span>"
        elif r.head is None:
            head = "<span class='muted'>no issue</span>"
        else:
            head = f"<b>{escape(r.head.root.alertname)}</b> on {escape(r.head.where)}"
        if r.gpu_hours is not None:
            head += (f" <span class='muted small'>&middot; {escape(hours_text(r.gpu_hours))} "
                     "GPU-hours lost</span>")
        sev = "" if r.head is None else r.head.root.severity
        bar = "#c9ced6" if r.head is None else colour(sev)
        state = ("open" if r.open_issues else "resolved") if r.issues else ""
        text, cls = wandb_text(r.wandb)
        out.append(
            f"<tr><td class='sev' style='background:{bar}' title='{escape(sev, quote=True)}'>"
            f"</td><td class='run'><a href='{escape(href, quote=True)}'>{escape(name)}</a>"
            "</td>"
            f"<td>{head} <span class='pill{' bad' if state == 'open' else ''}'>{state}</span>"
            f"</td><td class='n'>{'' if r.started_at is None else escape(when(r.started_at))}"
            f"</td><td class='n wide'>{r.issues} ({r.open_issues} open)</td>"
            f"<td class='n wide'>{r.alerts} ({r.firing})</td>"
            f"<td>{verdict_pill(None if r.outcome is None else r.outcome.verdict)}</td>"
            f"<td><span class='pill {cls}'>{escape(text.removeprefix('W&B: '))}</span></td>"
            "</tr>")
    out.append("</table>")
    if not rows:
        out.append("<p class='muted'>No runs match.</p>")
    nav = []
    if offset > 0 and limit:
        nav.append(_page_link(filters, max(0, offset - limit), limit, "&larr; newer"))
    if more and limit:
        nav.append(_page_link(filters, offset + limit, limit, "older &rarr;"))
    if nav:
        out.append(f"<p>{' &middot; '.join(nav)}</p>")
    return _page("Runs with infrastructure issues", "".join(out))


def _page_link(filters: dict[str, str], offset: int, limit: int, text: str) -> str:
    query = urlencode({**{k: v for k, v in filters.items() if v}, "offset": offset,
                       "limit": limit})
    return f"<a href='{escape('/runs?' + query, quote=True)}'>{text}</a>"


def _filter_form(filters: dict[str, str], limit: int) -> str:
    def field(name: str, label: str) -> str:
        return (f"<label>{label}<input name='{name}' "
                f"value='{escape(filters.get(name, ''), quote=True)}'></label>")
    state = filters.get("state", "")
    options = "".join(f"<option value='{v}'{' selected' if v == state else ''}>{t}</option>"
                      for v, t in (("", "open and resolved"), ("open", "open"),
                                   ("resolved", "resolved")))
    hidden = f"<input type='hidden' name='limit' value='{limit}'>" if limit else ""
    verdict = filters.get("verdict", "")
    verdicts = "".join(f"<option value='{v}'{' selected' if v == verdict else ''}>{t}</option>"
                       for v, t in (("", "any"), ("infrastructure", "infrastructure"),
                                    ("clear", "clear"), ("incomplete", "incomplete")))
    return (f"<form class='filters' method='get' action='/runs'>{field('entity', 'entity')}"
            f"{field('project', 'project')}<label>state<select name='state'>{options}"
            f"</select></label><label>verdict (ended runs)<select name='verdict'>{verdicts}"
            f"</select></label>{hidden}<button type='submit'>filter</button></form>")


def _facts_when(fact: AlertFact, ref: float) -> str:
    return f"{when(fact.onset)} ({offset_text(onset(fact) - ref)})"


def _remediation_html(rem: Remediation, quarantine: QuarantineView | None) -> str:
    """Whether restarting the run is safe now (diagnosis/verdict.py: what the fault needs, whether
    it happened, the hosts' scheduler state), with the exclusion to use when it is not."""
    cls = {"safe": "ok", "unsafe": "bad"}.get(rem.verdict, "warn")
    parts = [f"<dt>Restart</dt><dd><span class='pill {cls}'>{escape(rem.verdict)}</span> "
             f"{escape(rem.detail)}"]
    if rem.exclusion:
        parts.append(f"<br><code class='excl'>{escape(rem.exclusion)}</code>")
    if rem.timelines:
        parts.append("<br>" + "; ".join(
            f"{escape(t.hostname)}: {escape(t.current.state if t.current else 'unknown')}"
            + (f" ({escape(t.current.reason)})" if t.current and t.current.reason else "")
            + (f" since {escape(when(t.current.at))}" if t.current else "")
            for t in rem.timelines))
    parts.append("</dd>")
    if quarantine is not None:
        cls = {"acted": "bad", "refused": "warn", "failed": "bad"}.get(quarantine.state, "")
        parts.append(f"<dt>Quarantine</dt><dd><span class='pill {cls}'>"
                     f"{escape(quarantine.state)}</span> {escape(quarantine.text)}</dd>")
    return "".join(parts)


def impact_rows(root: AlertFact, impact: Impact | None) -> list[str]:
    """The card's impact: measured on the run (diagnosis/impact.py) with what it cost, else the
    catalog's prose."""
    prose = escape(root.text("impact"))
    if impact is None or impact.kind == UNMEASURED:
        return [f"<dt>Impact</dt><dd>{prose}"]
    rows = [f"<dt>Impact</dt><dd><b>{escape(impact.headline)}</b>"
            + (f"<br><span class='muted small'>Expected from this fault: {prose}</span>"
               if prose else "")]
    if impact.onset_reason:
        rows.append(f"<br><span class='muted small'>{escape(impact.onset_reason)}</span>")
    rows.append(f"</dd><dt>GPU-hours lost</dt><dd>{escape(impact.cost_text)}")
    return rows


def _card(view: IssueView, headline: bool, link: LinkFn) -> str:
    issue, root = view.issue, view.issue.root
    sev = root.severity
    state = "open" if issue.open else f"resolved {when(issue.ended_at or issue.started_at)}"
    badge = "ROOT CAUSE" if headline else "SEPARATE ISSUE"
    buttons = (_link(link(root, issue.started_at, issue.ended_at), "Open in Grafana", "btn")
               + _link(runbook_url(root), "Runbook", "btn alt"))
    groups = by_name(issue.consequences)
    impact_extra = (f"<br><span class='muted'>{len(issue.consequences)} likely consequence(s): "
                    + "; ".join(f"{escape(name)} on {len({f.hostname for f in facts})} host(s)"
                                for name, facts in groups) + "</span>") if groups else ""
    rows = [
        f"<dt>Where</dt><dd><b>{escape(issue.where)}</b> "
        f"<span class='muted'>{escape(sev)} &middot; {escape(root.category)}</span></dd>",
        f"<dt>When</dt><dd>{escape(when(view.onset))} "
        f"<span class='pill{' bad' if issue.open else ' ok'}'>{escape(state)}</span></dd>",
        f"<dt>What</dt><dd>{escape(root.text('description') or root.text('summary'))}</dd>",
        "".join(impact_rows(root, view.impact)) + f"{impact_extra}</dd>",
        f"<dt>What to do</dt><dd><b>{escape(view.advice)}</b></dd>",
    ]
    if view.remediation is not None:
        rows.append(_remediation_html(view.remediation, view.quarantine))
    return (f"<section class='card issue{' headline' if headline else ''}' "
            f"style='border-left-color:{colour(sev)}'>"
            f"<h2><span class='badge' style='background:{colour(sev)}'>{badge}</span> "
            f"{escape(root.alertname)} <span class='muted'>on</span> {escape(issue.where)}</h2>"
            f"<dl>{''.join(rows)}</dl><p>{buttons}</p>"
            f"<details class='muted small'><summary>Why this is the root cause</summary>"
            f"{escape(issue.reasoning)}</details></section>")


def _consequences_html(issue: Issue, link: LinkFn) -> str:
    """One row per alert name: count, hosts, first/last onset relative to the root cause, the
    host list behind a ``<details>``."""
    if not issue.consequences:
        return ""
    ref = onset(issue.root)
    out = [f"<h2>Likely consequences ({len(issue.consequences)})</h2><table class='consequences'>"
           "<tr><th class='sev'></th><th>Alert</th><th>Count</th><th>First</th><th>Last onset</th>"
           "<th>Still firing</th><th>Where</th><th></th></tr>"]
    for name, group in by_name(issue.consequences):
        facts = sorted(group, key=lambda f: (onset(f), f.where))
        hosts = {f.hostname or "unknown host" for f in facts}
        firing = sum(1 for f in facts if f.ends_at is None)
        items = "".join(f"<li>{escape(f.where)} &middot; {escape(_facts_when(f, ref))}</li>"
                        for f in facts)
        first, sev = facts[0], facts[0].severity
        out.append(
            f"<tr><td class='sev' style='background:{colour(sev)}'></td>"
            f"<td><b>{escape(name)}</b><br><span class='muted small'>{escape(sev)}</span></td>"
            f"<td>{len(facts)}</td><td>{escape(_facts_when(first, ref))}</td>"
            f"<td>{escape(offset_text(onset(facts[-1]) - ref))}</td><td>{firing}</td>"
            f"<td><details><summary>{len(hosts)} host(s)</summary><ul class='small'>{items}"
            f"</ul></details></td><td>"
            f"{_link(link(first, first.onset, first.ends_at), 'Grafana')}</td></tr>")
    out.append("</table>")
    return "".join(out)


def activity_html(activity: Activity | None, issues: Sequence[Issue]) -> str:
    """The GPU-activity plot with the issues' markers, or a note saying why there is none, and
    when the worker read it."""
    if activity is None:
        return ""
    read = (f"<p class='muted small'>Read from Prometheus at {escape(when(activity.read_at))}"
            ".</p>")
    if activity.note:
        return f"<h2>GPU activity</h2><p class='note'>{escape(activity.note)}</p>{read}"
    markers = []
    for issue in issues:
        markers.append((onset(issue.root), f"{issue.root.alertname} {clock(issue.root.onset)}",
                        colour(issue.root.severity)))
        if issue.ended_at is not None:
            markers.append((issue.ended_at.timestamp(), f"resolved {clock(issue.ended_at)}",
                            "#2e7d32"))
    return ("<h2>GPU activity <span class='muted small'>(mean over the run's "
            f"{activity.gpus} GPUs, from Prometheus)</span></h2>"
            + "<div class='chart'>" + "".join(
                activity_svg(activity.series, markers, (activity.start, activity.end),
                             width=width) for width in CHART_WIDTHS) + f"</div>{read}")


def run_html(view: RunView, title: str, link: LinkFn) -> str:
    """The run page: headline card, timeline, activity plot, grouped consequences, then the
    run's other issues the same way."""
    text, cls = wandb_text(view.delivery_status())
    out = [_back(title, f"<span class='pill {cls}'>{escape(text)}</span>")]
    if view.outcome is not None:
        out.append(verdict_html(view.outcome))
    elif not view.issues and view.job_log is None:
        out.append("<p>No issues.</p>")
    joined = view.job_log_joined
    if view.job_log is not None and joined is not None:
        out.append(job_log_html(view.job_log, joined))
    issues = tuple(i.issue for i in view.issues)
    for rank, issue in enumerate(view.ranked):
        out.append(_card(issue, rank == 0, link))
        consequences = issue.issue.consequences
        out.append(f"<h2>Timeline <span class='muted small'>(UTC, offsets from the root cause;"
                   f" {len(consequences)} consequence(s) on "
                   f"{len({c.hostname for c in consequences})} host(s))</span></h2>")
        out.append("<div class='chart'>" + "".join(timeline_svg(issue.issue, width)
                                                    for width in CHART_WIDTHS) + "</div>")
        if rank == 0:
            out.append(activity_html(view.activity, issues))
        out.append(_consequences_html(issue.issue, link))
    if len(view.issues) > 1:
        out.append(f"<p class='muted small'>{escape(view.diagnosis.headline_reason)}</p>")
    for what, at in (("Impacts last measured", view.measured_at),
                     ("Hosts' state last read", view.state_read_at)):
        if at is not None:
            out.append(f"<p class='muted small'>{what} at {escape(when(at))}.</p>")
    out.append(unconfirmed_html(view.unconfirmed))
    return _page(title, "".join(out))


def broken_html(title: str, error: str) -> str:
    """A run whose stored alerts cannot be diagnosed: the error, not a 500."""
    return _page(title, _back(title) + "<p class='note'>This run's alerts cannot be diagnosed: "
                 f"{escape(error)}</p>")


def unconfirmed_html(unconfirmed: Sequence[Unconfirmed]) -> str:
    """Alerts stored for the run that Prometheus did not confirm: listed apart, with why, and
    never part of the issues above."""
    if not unconfirmed:
        return ""
    rows = "".join(f"<tr><td>{escape(u.fact.alertname)}</td><td>{escape(u.fact.where)}</td>"
                   f"<td class='n'>{escape(when(u.fact.starts_at))}</td>"
                   f"<td>{escape(u.reason)}</td></tr>" for u in unconfirmed[:200])
    return (f"<h2>Not confirmed by Prometheus ({len(unconfirmed)})</h2><p class='muted small'>"
            "Not part of this run's issues, its W&amp;B notes or any quarantine.</p><table>"
            f"<tr><th>Alert</th><th>Where</th><th>Started</th><th>Why</th></tr>{rows}</table>")


def empty_html(title: str) -> str:
    """A run the bridge holds neither alerts nor a verdict for: not an answer, and said so."""
    return _page(title, _back(title) + (
        "<section class='card' style='border-left-color:#9aa0a6'><h2>No verdict yet</h2><p>The "
        "bridge holds no alerts and no verdict for this run. Every run the exporter published "
        "gets one when it ends (its join series gone for endings.grace_seconds, or W&amp;B says "
        "it finished, failed or crashed), with Prometheus configured. So this run is still "
        "running, ended moments ago, ended before endings.lookback_hours, or its id is not one "
        "the exporter published. This is not a clean bill of health.</p></section>"))


_VERDICT_STYLE = {"infrastructure": ("bad", "#c5221f"), "clear": ("ok", "#2e7d32"),
                  "incomplete": ("warn", "#c77700")}


def verdict_pill(verdict: str | None) -> str:
    """The verdict as a coloured pill (empty for a run without one)."""
    if not verdict:
        return ""
    cls = _VERDICT_STYLE.get(verdict, ("", ""))[0]
    return f"<span class='pill {cls}'>{escape(verdict)}</span>"


def verdict_html(outcome: Outcome) -> str:
    """The ended run's verdict card: the verdict, its reason and what the rules saw."""
    colour_ = _VERDICT_STYLE.get(outcome.verdict, ("", "#9aa0a6"))[1]
    blind = () if outcome.coverage is None else outcome.coverage.blind
    rows = "".join(f"<tr><td>{escape(b.host)}</td><td>{escape(b.what)}</td>"
                   f"<td class='n'>{escape(when(b.start))}</td>"
                   f"<td class='n'>{escape(when(b.end))}</td></tr>" for b in blind[:200])
    table = ("<table><tr><th>Host</th><th>Not seen</th><th>From</th><th>To</th></tr>"
             f"{rows}</table>") if rows else ""
    return (f"<section class='card' style='border-left-color:{colour_}'><h2>Verdict: "
            f"{verdict_pill(outcome.verdict)}</h2><p>{escape(outcome.text)}</p>"
            f"<p class='muted small'>{escape(outcome.coverage_line)}; ended "
            f"({escape(outcome.how)}) at {escape(when(outcome.ended_at))}</p>{table}</section>")


def job_log_html(reading: Reading, joined: Joined) -> str:
    """The job's own log: the joined statement and the lines it quotes (each escaped)."""
    quotes = "".join(f"<li><code>{escape(q)}</code></li>" for q in reading.quotes[:5])
    missed = "".join(f"<li>{escape(s.name)}: {escape(s.error)}</li>"
                     for s in reading.sources if s.error)
    return (f"<section class='card'><h2>Job log: {escape(str(joined.verdict))}</h2>"
            f"<p>{escape(joined.statement)}</p>"
            + (f"<ul class='small'>{quotes}</ul>" if quotes else "")
            + (f"<p class='muted small'>Not read:</p><ul class='small muted'>{missed}</ul>"
               if missed else "") + "</section>")


def login_html(next_path: str, failed: bool, configured: bool) -> str:
    """The page token form; the token becomes an HttpOnly cookie (see ``bridge.webhook``)."""
    if not configured:
        body = ("<p>These pages need credentials. No page token is configured, so only the "
                "webhook's credentials open them (an API client, or the browser's basic-auth "
                "prompt when the webhook uses basic auth).</p><p>Operators: set "
                "<code>auth.pages_token_file</code> in the bridge's configuration to sign in "
                "here with a read-only token.</p>")
    else:
        body = (("<p class='note'>Wrong token.</p>" if failed else "")
                + "<p>The bridge's pages need the page token your operator configured.</p>"
                + "<form method='post' action='/login'>"
                f"<input type='hidden' name='next' value='{escape(next_path, quote=True)}'>"
                "<label>page token<input type='password' name='token' autocomplete='off' "
                "autofocus required></label><p><button type='submit'>Sign in</button></p>"
                "</form>")
    return _page("Sign in", f"<section class='card login'><h1>wandb-infra-bridge: sign in</h1>"
                            f"{body}</section>")
