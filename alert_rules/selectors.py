"""Label selectors per exporter, put into every raw series the rules read (kubernetes-mixin's
``cadvisorSelector`` etc.): a Prometheus that scrapes two dcgm-exporter deployments, or keeps
another team's node_exporter, narrows the rules to its own with ``job="..."``.

The rules are written without selectors; ``apply`` walks each expression's PromQL tokens and adds
the configured matchers to each vector selector whose metric belongs to an exporter (by name
prefix, ``EXPORTERS``), including ``{__name__=~"A|B"}`` selectors. Recorded series (names with a
colon), functions, keywords, grouping label lists, strings and range/offset durations are left
alone. With no selectors configured the text is returned unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import NamedTuple

# Exporter (the generator's ``selectors:`` key and the mixin's ``_config.selectors`` key) and
# the metric-name prefixes of the series it exports that the rules read.
EXPORTERS: dict[str, tuple[str, ...]] = {
    "dcgmExporter": ("DCGM_",),
    "nodeExporter": ("node_",),
    "smartctlExporter": ("smartctl_",),
    "ipmiExporter": ("ipmi_",),
    "kubeStateMetrics": ("kube_",),
    # this project's exporter (join metrics, scheduler node state) and bridge
    "wandbInfraExporter": ("wandb_run_", "wandb_infra_exporter_", "wandb_infra_node_"),
    "wandbInfraBridge": ("wandb_infra_bridge_",),
}

# One label matcher, as PromQL writes it; a selector is one or more, comma-separated.
_MATCHER = r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*'
SELECTOR = re.compile(rf"{_MATCHER}(?:,{_MATCHER})*")
_TOKEN = re.compile(r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<braces>\{(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^{}"'])*\})
  | (?P<brackets>\[[^\]]*\])
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+(?:ms|[smhdwy]))+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<space>\s+)
  | (?P<other>.)
""", re.X | re.S)
_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
# What follows a function or an aggregation's name, never a metric's: its arguments, or an
# aggregation's grouping before them (``sum by (x) (...)``).
_CALLED = frozenset({"(", "by", "without"})
_KEYWORDS = _GROUPING | frozenset({"and", "or", "unless", "bool", "offset", "atan2", "inf",
                                   "nan", "start", "end"})
_NAME_MATCHER = re.compile(r'__name__\s*(=~|=)\s*"((?:[^"\\]|\\.)*)"')


def exporter_of(metric: str) -> str | None:
    """The exporter a raw metric name belongs to (None: recorded series, ``up``, ``ALERTS``)."""
    if ":" in metric:
        return None
    for exporter, prefixes in EXPORTERS.items():
        if metric.startswith(prefixes):
            return exporter
    return None


def names_in(braces: str) -> list[str]:
    """Metric names a ``{__name__=...}`` selector names (alternatives of a plain regex)."""
    match = _NAME_MATCHER.search(braces)
    if match is None:
        return []
    return match.group(2).split("|") if match.group(1) == "=~" else [match.group(2)]


def _tokens(expr: str) -> list[tuple[str, str]]:
    """``expr`` as (kind, text) pieces that join back to it exactly."""
    out = []
    for match in _TOKEN.finditer(expr):
        kind = match.lastgroup
        assert kind is not None
        out.append((kind, match.group()))
    return out


class _Selector(NamedTuple):
    """A vector selector found in the pieces: ``pieces[start:end]`` is its text."""

    name: str | None  # None for a bare ``{__name__=...}`` selector
    braces: str  # its label matchers with their braces, '' when it has none
    start: int
    end: int


def _next_solid(pieces: list[tuple[str, str]], start: int) -> int | None:
    return next((j for j in range(start, len(pieces)) if pieces[j][0] != "space"), None)


def _selectors(pieces: list[tuple[str, str]]) -> Iterator[_Selector]:
    """Every vector selector: a name that is no keyword, function or aggregation (what follows
    it is not ``(``, ``by`` or ``without``), with the braces after it if any, or braces on their
    own; grouping label lists (``by (...)``, ``on (...)``) are skipped."""
    i = 0
    while i < len(pieces):
        kind, text = pieces[i]
        after = _next_solid(pieces, i + 1)
        follows = pieces[after][1] if after is not None else ""
        if kind == "name" and text in _GROUPING and follows == "(":
            assert after is not None
            i = next(j for j in range(after, len(pieces)) if pieces[j][1] == ")") + 1
        elif kind == "name" and text not in _KEYWORDS and follows not in _CALLED:
            braced = after is not None and pieces[after][0] == "braces"
            end = after + 1 if braced and after is not None else i + 1
            yield _Selector(text, pieces[end - 1][1] if braced else "", i, end)
            i = end
        else:
            if kind == "braces":
                yield _Selector(None, text, i, i + 1)
            i += 1


def vector_selectors(expr: str) -> Iterator[tuple[str | None, str]]:
    """Every vector selector of ``expr``: (metric name or None, its braces or '')."""
    return ((name, braces) for name, braces, _ in reads(expr))


def reads(expr: str) -> Iterator[tuple[str | None, str, str]]:
    """Every vector selector of ``expr`` with the range it is read over: (metric name or None,
    its braces or '', its range or subquery such as ``[10m]`` or '' for an instant read). The
    rules benchmark prices reading the inputs from these."""
    pieces = _tokens(expr)
    for found in _selectors(pieces):
        after = _next_solid(pieces, found.end)
        window = pieces[after][1] if after is not None and pieces[after][0] == "brackets" else ""
        yield found.name, found.braces, window


def apply(expr: str, selectors: Mapping[str, str]) -> str:
    """``expr`` with each exporter's selector added to the vector selectors of its metrics."""
    chosen = {k: v.strip() for k, v in selectors.items() if v.strip()}
    if not chosen:
        return expr
    pieces = _tokens(expr)
    out: list[str] = []
    done = 0
    for found in _selectors(pieces):
        owners = {exporter_of(n) for n in ([found.name] if found.name else names_in(found.braces))}
        selector = chosen.get(owners.pop() or "") if len(owners) == 1 else None
        if not selector:
            continue
        text = "".join(t for _, t in pieces[found.start:found.end])
        out += [t for _, t in pieces[done:found.start]]
        if found.braces:
            out.append(text[:-len(found.braces)] + _merge(found.braces, selector))
        else:
            out.append(text + "{" + selector + "}")
        done = found.end
    out += [t for _, t in pieces[done:]]
    return "".join(out)


def _merge(braces: str, selector: str) -> str:
    """Braces with ``selector``'s matchers first (the others keep their layout)."""
    return "{" + selector + ("," + braces[1:] if braces[1:-1].strip() else "}")
