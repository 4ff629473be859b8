"""The bridge's section of a run's notes: rendered from the run's view, replaced idempotently.

The section sits between two HTML-comment delimiters. Everything outside them (the user's own
notes) is preserved byte for byte; label and annotation text is markdown- and HTML-escaped so an
alert cannot inject links, images, headings or markup into the drawer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime

from wandb_infra.bridge.diagnosis.impact import UNMEASURED, Impact, hours_text
from wandb_infra.bridge.diagnosis.root_cause import AlertFact, Issue
from wandb_infra.bridge.joblog.sources import NOT_CONFIGURED
from wandb_infra.bridge.projection.wandb_client import RunStep
from wandb_infra.bridge.prometheus.remediation import Remediation
from wandb_infra.bridge.runs.view import IssueView, LinkFn, RunView
from wandb_infra.catalog.vocabulary import CauseClass

BEGIN = "<!-- wandb-infra-bridge:begin -->"
END = "<!-- wandb-infra-bridge:end -->"
TITLE = "### Infrastructure issues"

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# What Markdown needs escaped inline (every field follows a "- Label: " prefix, so block syntax
# such as "#", "-" or "1." at a line start cannot occur): emphasis, code, links and images
# ("[", "]": no "](url)" can form), strikethrough, table pipes and the escape itself. "<", ">"
# and "&" become entities. Host names and times stay readable ("gpu-node-017", "18:47:23").
_MD_SPECIAL = re.compile(r"([\\`*_\[\]~|])")
# What GitHub-flavoured Markdown would turn into a link by itself (a URL or "www."): an alert's
# text never becomes a clickable link in the run's notes.
_AUTOLINK = re.compile(r"(?i)(?<=[a-z0-9])://|(?<![\w.])www\.")
MAX_FIELD = 600
MAX_PLACES = 8
# What one run's notes may receive, however many alerts hit it: issues and consequence groups
# beyond these are counted, not listed (the bridge's run page lists everything).
MAX_ISSUES = 20
MAX_GROUPS = 20
MAX_SECTION_CHARS = 60_000


def strip_controls(text: str) -> str:
    """Control, line-separator and bidi-override characters (and newlines) become spaces."""
    return _CONTROL.sub(" ", text.replace("\r\n", " ").replace("\n", " "))


def md_escape(text: str, limit: int = MAX_FIELD) -> str:
    """Inline-safe markdown: no control characters or newlines, HTML entities, escaped syntax."""
    text = strip_controls(text)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _MD_SPECIAL.sub(r"\\\1", text)
    return _AUTOLINK.sub(lambda m: ":\\/\\/" if m.group(0) == "://" else m.group(0)[:-1] + "\\.",
                         text)


def _url(url: str) -> str:
    """A link target we built ourselves; still refuse anything that could break out of ()."""
    return url if url.startswith(("http://", "https://")) and not re.search(
        r"[\s()<>\"'`]", url) else ""


def _upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]


def _time(value: datetime | None) -> str:
    return "ongoing" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _group_line(facts: list[AlertFact], link: str) -> str:
    """One line per consequence alert name: count, where (first few), when, one link."""
    first = facts[0]
    places = sorted({f.where for f in facts})
    where = ", ".join(md_escape(p) for p in places[:MAX_PLACES])
    if len(places) > MAX_PLACES:
        where += f" and {len(places) - MAX_PLACES} more"
    still = sum(1 for f in facts if f.ends_at is None)
    line = (f"  - **{md_escape(first.alertname)}** ×{len(facts)} on {where}; first at "
            f"{_time(first.onset)}, {still} still firing")
    return line + (f" ([Grafana]({link}))" if link else "")


def state_text(issue: Issue) -> str:
    """``open``, ``resolved``, or ``open: root cause resolved at ..., N consequences still
    firing`` (the fault is gone but the run has not recovered)."""
    if not issue.open:
        return "resolved"
    root_end = issue.root_ended_at
    if root_end is None:
        return "open"
    firing = issue.consequences_firing
    return (f"open: root cause resolved at {_time(root_end)}, "
            f"{firing} {'consequence' if firing == 1 else 'consequences'} still firing")


def _seen(issue: Issue) -> str:
    """The run-level effect already visible (a stall or straggler among the consequences), so
    an impact worded as a risk ("may slow down") is not read as something still to come."""
    symptoms: dict[str, datetime] = {}
    for fact in issue.consequences:
        if fact.cause is CauseClass.SYMPTOM:
            symptoms[fact.alertname] = min(fact.onset, symptoms.get(fact.alertname, fact.onset))
    return "; ".join(f"{name} since {_time(when)}" for name, when in sorted(
        symptoms.items(), key=lambda kv: kv[1]))


def _remediation_lines(rem: Remediation) -> list[str]:
    """The restart verdict, the exclusion as a code block (host names are plain DNS labels,
    see remediation.exclusion) and each faulty host's state history."""
    lines = [f"- Safe to restart? **{rem.verdict}**: {md_escape(rem.detail, 1000)}"]
    if rem.exclusion:
        lines += ["", "  ```", *(f"  {line}" for line in rem.exclusion.splitlines()), "  ```", ""]
    return lines + [f"- Node state: {md_escape(line, 1000)}" for line in rem.history_lines()]


def impact_lines(root: AlertFact, impact: Impact | None) -> list[str]:
    """The impact as measured on the run (diagnosis/impact.py), what it cost and why the onset
    moved; the catalog's prose stays for what cannot be measured."""
    prose = root.text("impact")
    if impact is None or impact.kind == UNMEASURED:
        return [f"- Impact on this run: {md_escape(prose)}"] if prose else []
    lines = [f"- Impact on this run (measured): {md_escape(impact.headline, 1000)}"]
    if prose:
        lines.append(f"- Expected from this fault: {md_escape(prose)}")
    lines.append(f"- GPU-hours lost: {md_escape(impact.cost_text, 1000)}")
    if impact.onset_reason:
        lines.append(f"- Onset: {md_escape(_upper_first(impact.onset_reason), 1000)}")
    return lines


def issue_onsets(view: RunView) -> dict[str, float]:
    """Issue key -> the issue's onset (the measured change where the impact moved it), in
    epoch seconds: where to look up the run's step."""
    return {i.issue.key: i.onset.timestamp() for i in view.issues}


def step_line(step: RunStep | None) -> list[str]:
    """At which of the run's own steps the issue began, when its W&B history shows it."""
    return [] if step is None else [
        f"- Began at step {step.step} of the run (its last step logged before the onset, at "
        f"{_time(datetime.fromtimestamp(step.at, UTC))})"]


def _issue_block(n: int, view: IssueView, headline: bool, link_for: LinkFn, *,
                 seen_through: str = "", step: RunStep | None = None) -> list[str]:
    issue, rem, root = view.issue, view.remediation, view.issue.root
    role = "headline" if headline else "separate issue, not the headline"
    link = _url(link_for(root, issue.started_at, issue.ended_at))
    lines = [
        f"**{n}. {md_escape(issue.title)}** ({state_text(issue)}, "
        f"{_time(view.onset)} to {_time(issue.ended_at)}; {role})",
        "",
        f"- {'Root cause' if headline else 'Cause'}: "
        f"{md_escape(root.text('summary') or root.alertname)} "
        f"({md_escape(root.severity or 'unknown severity')})",
    ]
    if root.text("description"):
        lines.append(f"- What happened: {md_escape(root.text('description'))}")
    lines += impact_lines(root, view.impact)
    lines += step_line(step)
    if view.advice:  # the restart decision's, so advice and verdict agree
        lines.append(f"- What to do: {md_escape(view.advice)}")
    if rem is not None:
        lines += _remediation_lines(rem)
    if view.quarantine is not None:
        lines.append(f"- Quarantine: {md_escape(view.quarantine.text, 1000)}")
    if seen := _seen(issue):
        lines.append(f"- Already seen on this run: {md_escape(seen)}")
    label = "Why this is the root cause" if headline else "Why this alert leads this issue"
    lines.append(f"- {label}: {md_escape(issue.reasoning, 1000)}")
    if seen_through:
        lines.append(f"- {md_escape(_upper_first(seen_through), 1000)}")
    if link:
        lines.append(f"- [Open in Grafana]({link})")
    if issue.consequences:
        lines.append(f"- Likely consequences ({len(issue.consequences)} alerts):")
        groups: dict[str, list[AlertFact]] = {}
        for fact in issue.consequences:
            groups.setdefault(fact.alertname, []).append(fact)
        for facts in list(groups.values())[:MAX_GROUPS]:
            first = facts[0]
            lines.append(_group_line(facts, _url(link_for(first, first.onset, first.ends_at))))
        if len(groups) > MAX_GROUPS:
            more = list(groups.values())[MAX_GROUPS:]
            lines.append(f"  - and {len(more)} more alert names "
                         f"({sum(map(len, more))} alerts)")
    lines.append("")
    return lines


def render_section(view: RunView, link_for: LinkFn, *,
                   steps: Mapping[str, RunStep] | None = None) -> str:
    """The delimited notes section (BEGIN..END): the ended run's verdict, the headline, then
    the other issues, each with its restart verdict, node state, quarantine decision and
    measured impact as the view has them, the run's step at its onset where ``steps`` has it,
    and what the rules saw of the run (the verdict's coverage)."""
    steps = steps or {}
    diagnosis, outcome = view.diagnosis, view.outcome
    lines = [BEGIN, TITLE, ""]
    head = diagnosis.root_cause
    seen_through = "" if outcome is None else outcome.coverage_line
    if outcome is not None:
        lines += [f"**Verdict: {outcome.verdict}**: {md_escape(outcome.text, 1500)}", "",
                  f"- {md_escape(_upper_first(seen_through), 1500)}", ""]
    lines += job_log_lines(view)
    if head is None:
        if outcome is None:
            lines += ["No infrastructure issues recorded.", ""]
    else:
        lines += [f"**Headline: {md_escape(head.title)}** ({state_text(head)})", ""]
        if diagnosis.headline_reason:
            lines += [md_escape(diagnosis.headline_reason, 1000), ""]
        measured = view.impacts or {}
        if view.gpu_hours is not None and any(i.kind != UNMEASURED for i in measured.values()):
            lines += [f"GPU-hours lost by this run: **{hours_text(view.gpu_hours)}**", ""]
    ranked = view.ranked
    size = sum(map(len, lines))
    shown = 0
    for n, issue in enumerate(ranked[:MAX_ISSUES], start=1):
        block = _issue_block(n, issue, issue.issue is head, link_for,
                             seen_through=seen_through, step=steps.get(issue.issue.key))
        block_size = sum(map(len, block)) + len(block)
        if shown and size + block_size > MAX_SECTION_CHARS:
            break
        lines += block
        size += block_size
        shown += 1
    if shown < len(ranked):
        lines += [f"_... and {len(ranked) - shown} more issues, listed on the bridge's run page._",
                  ""]
    lines += ["_Written by wandb-infra-bridge; edit outside this section only._", END]
    return "\n".join(lines)


def job_log_lines(view: RunView) -> list[str]:
    """The job's own log joined with the diagnosis, and the lines it quotes (at most five,
    each escaped; never the whole log)."""
    joined = view.job_log_joined
    if view.job_log is None or joined is None:
        return []
    lines = [f"**Job log: {joined.verdict}**: {md_escape(joined.statement, 1500)}"]
    lines += [f"- Log line: {md_escape(q, 400)}" for q in view.job_log.quotes[1:]]
    lines += [f"- Log not read: {md_escape(s.name)}: {md_escape(s.error)}"
              for s in view.job_log.sources if s.error and NOT_CONFIGURED not in s.error]
    return [*lines, ""]


def replace_section(notes: str | None, section: str) -> str:
    """``notes`` with the bridge's section replaced (or appended); other bytes unchanged."""
    notes = notes or ""
    start = notes.rfind(BEGIN)
    if start != -1:
        end = notes.find(END, start)
        if end != -1:
            return notes[:start] + section + notes[end + len(END):]
    if not notes:
        return section
    sep = "" if notes.endswith("\n\n") else ("\n" if notes.endswith("\n") else "\n\n")
    return notes + sep + section

