"""Server-rendered SVG for the run page: an issue's timeline and a GPU-activity plot, as inline
``<svg>`` text (no script, nothing external, every label through ``html.escape``). Hosts that saw
the same alerts share one lane with a count, so a cascade on many hosts stays readable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape

from wandb_infra.bridge.runs.view import AlertFact, Issue, duration

WIDTH = 1100  # the wide layout: the page's content box in a window of at least 1060 px
NARROW_WIDTH = 720  # the narrow layout, drawn about 1:1 in an 800 px window
CHART_WIDTHS = (WIDTH, NARROW_WIDTH)  # the layouts the page sends; its CSS shows one
MARK_ROW = 14  # px between the marker label rows above the lanes (a text box is 13 px high)
LABEL_W = 250  # the lane-label column of the wide layout; a narrower one gets 30% of it
TICK_GAP = 110  # px of axis per time tick: room for "+4 min 30 s" and a gap
# Advance widths (px) of 11 px text in DejaVu Sans, the widest of the common default sans fonts
# (Debian's fonts-dejavu-core 2.37, measured with Chromium's canvas measureText): each class's
# widest glyph, regular and bold, so an estimate bounds that font and the narrower ones.
_NARROW_CHARS = frozenset(" fijlrtIJ!'(),-./:;[]\\|‹›")
_WIDE_CHARS = frozenset("mwMW%@…")
_UPPER_CHARS = frozenset("ABCDEFGHKLNOPQRSTUVXYZ#&+<=>^~{}×")
_WIDTHS = {False: (4.6, 11.0, 9.3, 7.0), True: (5.5, 12.2, 9.4, 7.9)}  # narrow, wide, upper, other
ROW_H = 18  # one bar row per alert name in a lane
MAX_HOST_LANES = 8  # up to this many consequence hosts get a lane each; more are grouped
MAX_LANES = 10
MAX_TICKS = 300  # onset ticks drawn per bar in a grouped lane
SEVERITY_COLOURS = {"critical": "#b00020", "warning": "#c77700", "info": "#1f6feb"}
_NICE_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
               43200, 86400)


def onset(fact: AlertFact) -> float:
    """When the fact's condition began, unix seconds."""
    return fact.onset.timestamp()


def offset_text(seconds: float) -> str:
    """``+13 s``, ``+4 min 10 s``, ``+2 h 5 min``: how far after the root cause."""
    return ("-" if seconds < 0 else "+") + duration(seconds)


def clock(value: datetime) -> str:
    """``12:00:40`` in UTC, to the second."""
    return value.astimezone(UTC).strftime("%H:%M:%S")


def colour(severity: str) -> str:
    """The page's colour for a severity (unknown severities count as warnings)."""
    return SEVERITY_COLOURS.get(severity, SEVERITY_COLOURS["warning"])


@dataclass
class Lane:
    """One row of the timeline: a host, a group of hosts, or the root cause."""

    label: str
    hosts: list[str]
    facts: list[AlertFact] = field(default_factory=list)
    root: bool = False


def _host(fact: AlertFact) -> str:
    return fact.hostname or "unknown host"


def lanes(issue: Issue) -> list[Lane]:
    """Root cause first, then one lane per host, or per group of hosts that saw the same alerts
    when there are more than ``MAX_HOST_LANES`` hosts (64 stalled hosts: one lane, count 64)."""
    root = issue.root
    out = [Lane(f"{issue.where} (root cause)", [_host(root)], [root], root=True)]
    by_host: dict[str, list[AlertFact]] = {}
    for fact in issue.consequences:
        by_host.setdefault(_host(fact), []).append(fact)
    first = {h: min(onset(f) for f in fs) for h, fs in by_host.items()}
    hosts = sorted(by_host, key=lambda h: (first[h], h))
    if len(hosts) <= MAX_HOST_LANES:
        out += [Lane(h, [h], by_host[h]) for h in hosts]
        return out
    groups: dict[tuple[str, ...], list[str]] = {}
    for h in hosts:
        groups.setdefault(tuple(sorted({f.alertname for f in by_host[h]})), []).append(h)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), first[kv[1][0]]))
    keep, rest = ordered[:MAX_LANES - 2], ordered[MAX_LANES - 2:]
    for _names, members in keep:
        label = members[0] if len(members) == 1 else f"{len(members)} hosts"
        out.append(Lane(label, members, [f for h in members for f in by_host[h]]))
    if rest:
        members = [h for _, ms in rest for h in ms]
        out.append(Lane(f"{len(members)} other hosts", members,
                        [f for h in members for f in by_host[h]]))
    return out


def _nice_step(span: float, ticks: int = 8) -> int:
    return next((s for s in _NICE_STEPS if span / s <= ticks), _NICE_STEPS[-1])


class _Axis:
    """Maps times of [t0, t1] to x pixels of the plot area."""

    def __init__(self, t0: float, t1: float, x0: float, x1: float) -> None:
        self.t0, self.t1, self.x0, self.x1 = t0, max(t1, t0 + 1.0), x0, x1

    def x(self, t: float) -> float:
        frac = (t - self.t0) / (self.t1 - self.t0)
        return round(self.x0 + min(max(frac, 0.0), 1.0) * (self.x1 - self.x0), 1)

    def ticks(self) -> int:
        """How many time ticks the plot's width has room to label."""
        return max(2, int((self.x1 - self.x0) / TICK_GAP))


def _text(x: float, y: float, body: str, *, anchor: str = "start", cls: str = "",
          fill: str = "#333") -> str:
    c = f" class='{cls}'" if cls else ""
    return (f"<text x='{x}' y='{y}' text-anchor='{anchor}' fill='{fill}'{c}>"
            f"{escape(body)}</text>")


def text_width(text: str, bold: bool = False) -> float:
    """The drawn width of ``text`` at the charts' 11 px font, an upper bound (see the glyph
    classes above), so labels are placed and cut before the browser would clip them."""
    narrow, wide, upper, other = _WIDTHS[bold]
    return sum(narrow if c in _NARROW_CHARS else wide if c in _WIDE_CHARS
               else upper if c in _UPPER_CHARS else other if c.isascii() else wide
               for c in text)


def fit(text: str, room: float, bold: bool = False) -> str:
    """``text`` cut with "…" to fit ``room`` pixels."""
    if text_width(text, bold) <= room:
        return text
    keep = len(text)
    while keep > 1 and text_width(text[:keep] + "…", bold) > room:
        keep -= 1
    return text[:keep] + "…"


def _label(x: float, y: float, body: str, room: float, **style: str) -> str:
    """A label cut to ``room`` px; a cut one carries the full text as its tooltip (the SVG
    ``<title>`` of a group around it), so nothing said is lost, only folded. Marker labels
    (class ``mk``) are bold."""
    shown = fit(body, room, style.get("cls") == "mk")
    if shown == body:
        return _text(x, y, body, **style)
    return f"<g class='cut'><title>{escape(body)}</title>{_text(x, y, shown, **style)}</g>"


def _vline(axis: _Axis, t: float, span: tuple[float, float], colour_: str, label: str, *,
           bounds: tuple[float, float], dash: bool = False, row: int = 0,
           left: bool = False) -> str:
    """A marker line with its label in ``row`` of the band above the lanes (one row per marker,
    so "issue start" and "root cause" never overlap), on the preferred side of the line (the
    right unless ``left``: a marker that comes first keeps its label clear of the later
    lines) if it fits inside ``bounds`` (the chart's drawable x range), else the wider side."""
    x, (y0, y1) = axis.x(t), span
    style = " stroke-dasharray='4 3'" if dash else ""
    room_right, room_left = bounds[1] - x - 3, x - 3 - bounds[0]
    fits_right, fits_left = (text_width(label, bold=True) <= room
                             for room in (room_right, room_left))
    right = (fits_right and not (left and fits_left)) or (
        not fits_left and not fits_right and room_right >= room_left)
    return (f"<line x1='{x}' y1='{y0}' x2='{x}' y2='{y1}' stroke='{colour_}' stroke-width='1.5'"
            f"{style}/>" + _label(x + 3 if right else x - 3, y0 + 10 + MARK_ROW * row, label,
                                  room_right if right else room_left, fill=colour_, cls="mk",
                                  anchor="start" if right else "end"))


def _tick_labels(marks: list[tuple[float, str]], y: float, bounds: tuple[float, float]
                 ) -> list[str]:
    """Centred tick labels, left to right, each drawn only if it lies inside ``bounds`` and
    clear of the one before (a crowded axis loses labels, never legibility)."""
    out, last_right = [], bounds[0]
    for x, body in marks:
        half = text_width(body) / 2
        if x - half >= last_right and x + half <= bounds[1]:
            out.append(_text(x, y, body, anchor="middle", cls="ax"))
            last_right = x + half + 6
    return out


def _time_axis(axis: _Axis, ref: float, y: float, right: float) -> list[str]:
    """Ticks every nice step from the reference (root cause) time, labelled ``+N s``."""
    step = _nice_step(axis.t1 - axis.t0, axis.ticks())
    out = [f"<line x1='{axis.x0}' y1='{y}' x2='{axis.x1}' y2='{y}' stroke='#999'/>"]
    marks = []
    k = -int((ref - axis.t0) // step)
    while ref + k * step <= axis.t1:
        t = ref + k * step
        if t >= axis.t0:
            x = axis.x(t)
            out.append(f"<line x1='{x}' y1='{y}' x2='{x}' y2='{y + 4}' stroke='#999'/>")
            marks.append((x, clock(datetime.fromtimestamp(t, UTC)) if k == 0
                          else offset_text(t - ref)))
        k += 1
    return out + _tick_labels(marks, y + 16, (axis.x0 - 40, right))


def _window(issue: Issue) -> tuple[float, float, float]:
    """(axis start, axis end, root onset) in unix seconds; an open issue's axis ends a little
    after its last known change, so a days-old open issue is not squashed against 'now'."""
    facts = (issue.root, *issue.consequences)
    ref = onset(issue.root)
    stamps = [onset(f) for f in facts] + [d.timestamp() for d in (
        *(f.ends_at for f in facts), issue.started_at, issue.ended_at) if d is not None]
    lo, hi = min(stamps), max(stamps)
    pad = max(5.0, (hi - lo) * 0.08)
    return lo - pad, hi + pad, ref


def _svg_open(kind: str, width: int, height: float, title: str) -> str:
    """The chart's root element: the wide layout is ``class=kind``, others add ``narrow``; its
    viewBox lets the page scale it to the content box (see the page's CSS)."""
    cls = kind if width >= WIDTH else f"{kind} narrow"
    return (f"<svg class='{cls}' role='img' xmlns='http://www.w3.org/2000/svg' "
            f"viewBox='0 0 {width} {height}' width='{width}' height='{height}'>"
            f"<title>{escape(title)}</title>")


def timeline_svg(issue: Issue, width: int = WIDTH) -> str:
    """One issue as lanes of bars over time, laid out for ``width`` px: root cause
    highlighted, start/end marked, every label whole or cut with its full text as tooltip."""
    t0, t1, ref = _window(issue)
    rows = lanes(issue)
    label_w = min(LABEL_W, int(width * 0.3))
    top = 6 + 3 * MARK_ROW  # one label row for each of: issue start, root cause, resolved
    heights = [ROW_H * max(1, len(by_name(lane.facts))) + 4 for lane in rows]
    y_axis = top + sum(heights) + 4
    height = y_axis + 26
    axis = _Axis(t0, t1, label_w, width - 12)
    out = [_svg_open("timeline", width, height,
                     f"Timeline of {issue.root.alertname}")]
    y = top
    for i, lane in enumerate(rows):
        fill = "#fdecee" if lane.root else ("#f6f7f9" if i % 2 else "#fff")
        out.append(f"<g class='lane{' root' if lane.root else ''}' data-hosts='{len(lane.hosts)}'>"
                   f"<title>{escape(', '.join(lane.hosts[:40]))}"
                   f"{' …' if len(lane.hosts) > 40 else ''}</title>"
                   f"<rect x='0' y='{y}' width='{width}' height='{heights[i]}' fill='{fill}'/>")
        out.append(_label(6, y + 14, lane.label, label_w - 12,
                          cls="root-label" if lane.root else "lbl",
                          fill="#b00020" if lane.root else "#333"))
        out += _bars(lane, axis, y, t1)
        out.append("</g>")
        y += heights[i]
    out += _time_axis(axis, ref, y_axis, width - 2)
    bounds = (2.0, width - 2.0)
    start, end = issue.started_at, issue.ended_at
    if abs(start.timestamp() - ref) >= 1:
        out.append(_vline(axis, start.timestamp(), (2, y_axis), "#555",
                          f"issue start {clock(start)}", bounds=bounds, dash=True, row=1,
                          left=start.timestamp() < ref))
    out.append(_vline(axis, ref, (2, y_axis), "#b00020",
                      f"root cause {clock(datetime.fromtimestamp(ref, UTC))}", bounds=bounds))
    if end is not None:
        out.append(_vline(axis, end.timestamp(), (2, y_axis), "#2e7d32",
                          f"resolved {clock(end)}", bounds=bounds, dash=True, row=2))
    out.append("</svg>")
    return "".join(out)


def by_name(facts: Sequence[AlertFact]) -> list[tuple[str, list[AlertFact]]]:
    """The facts grouped by alert name, the earliest onset first."""
    groups: dict[str, list[AlertFact]] = {}
    for fact in facts:
        groups.setdefault(fact.alertname, []).append(fact)
    return sorted(groups.items(), key=lambda kv: min(onset(f) for f in kv[1]))


def _bars(lane: Lane, axis: _Axis, y: float, t_end: float) -> list[str]:
    """Per alert name in the lane: one bar from its first onset to its last end (to the right
    edge while any still fires), named, with a tick at every distinct onset of a grouped lane."""
    h = ROW_H - 3
    out = []
    for j, (name, facts) in enumerate(by_name(lane.facts)):
        onsets = sorted(onset(f) for f in facts)
        ends = [t_end if f.ends_at is None else f.ends_at.timestamp() for f in facts]
        x0, x1 = axis.x(onsets[0]), axis.x(max(ends))
        yy = y + 3 + j * ROW_H
        col = colour(facts[0].severity)
        stroke = " stroke='#5c0010' stroke-width='2'" if lane.root else ""
        tip = f"{name} ×{len(facts)}: first {clock(datetime.fromtimestamp(onsets[0], UTC))}"
        out.append(f"<rect class='bar' x='{x0}' y='{yy}' width='{max(2.0, x1 - x0):.1f}' "
                   f"height='{h}' fill='{col}' fill-opacity='{0.9 if lane.root else 0.55}'"
                   f"{stroke}><title>{escape(tip)}</title></rect>")
        count = f" ×{len(facts)}" if len(facts) > 1 else ""
        name_text = f"{name}{count}"
        # from the bar's start when it fits before the plot's edge, else to the bar's left
        # (its row is its own) when there is more room there; cut to the room either way
        room_right, room_left = axis.x1 - x0 - 4, x0 - 4 - axis.x0
        if text_width(name_text) <= room_right or room_right >= room_left:
            out.append(_label(x0 + 4, yy + h - 3, name_text, room_right, cls="bn",
                              fill="#fff" if lane.root else "#1d2127"))
        else:
            out.append(_label(x0 - 4, yy + h - 3, name_text, room_left, cls="bn",
                              anchor="end", fill="#1d2127"))
        if len(lane.hosts) > 1:
            for t in sorted(set(onsets))[:MAX_TICKS]:
                x = axis.x(t)
                out.append(f"<line x1='{x}' y1='{yy + h - 4}' x2='{x}' y2='{yy + h}' "
                           f"stroke='{col}' stroke-width='1'/>")
    return out


def activity_svg(series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
                 markers: Sequence[tuple[float, str, str]], window: tuple[float, float], *,
                 width: int = WIDTH, height: int = 190) -> str:
    """Lines of 0..1 ratios over [t0, t1] (e.g. tensor activity averaged over the run's GPUs)
    with vertical issue markers ``(time, label, colour)``, the way W&B marks a degradation;
    the legend has its own row above the plot, clear of the markers' labels."""
    t0, t1 = window
    left, right, top, bottom = 50, width - 12, 24, height - 26
    axis = _Axis(t0, t1, left, right)
    palette = ("#1f6feb", "#8250df", "#2e7d32")

    def y(v: float) -> float:
        return round(bottom - min(max(v, 0.0), 1.0) * (bottom - top), 1)

    out = [_svg_open("activity", width, height, "GPU activity of the run")]
    for frac in (0.0, 0.5, 1.0):
        out.append(f"<line x1='{left}' y1='{y(frac)}' x2='{right}' y2='{y(frac)}' "
                   "stroke='#ddd'/>" + _text(left - 4, y(frac) + 4, f"{frac:.0%}",
                                             anchor="end", cls="ax"))
    key_x = float(left)
    for k, (name, points) in enumerate(series):
        col = palette[k % len(palette)]
        path = " ".join(f"{axis.x(t)},{y(v)}" for t, v in points if t0 <= t <= t1)
        if path:
            out.append(f"<polyline class='series' fill='none' stroke='{col}' stroke-width='1.8' "
                       f"points='{path}'/>")
        out.append(f"<line x1='{key_x}' y1='8' x2='{key_x + 14}' y2='8' stroke='{col}' "
                   "stroke-width='2'/>" + _label(key_x + 18, 12, name, right - key_x - 18,
                                                 fill=col))
        key_x += 18 + text_width(name) + 16
    for k, (t, label, col) in enumerate(sorted(markers)):
        if t0 <= t <= t1:
            out.append(_vline(axis, t, (top, bottom), col, label, bounds=(left, width - 2.0),
                              row=k % 3))
    step = _nice_step(t1 - t0, axis.ticks())
    t = t0 - t0 % step + step
    marks = []
    while t <= t1:
        marks.append((axis.x(t), clock(datetime.fromtimestamp(t, UTC))))
        t += step
    out += _tick_labels(marks, height - 8, (0.0, width - 2.0))
    out.append("</svg>")
    return "".join(out)
