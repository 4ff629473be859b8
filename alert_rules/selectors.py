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
# An aggregation may put its grouping before its argument: ``sum by (x) (...)``.
_AGGREGATION_GROUPING = frozenset({"by", "without"})
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


def _tokens(expr: str) -> Iterator[tuple[str, str]]:
    for match in _TOKEN.finditer(expr):
        kind = match.lastgroup
        assert kind is not None
        yield kind, match.group()


def vector_selectors(expr: str) -> Iterator[tuple[str | None, str]]:
    """Every vector selector of ``expr``: (metric name or None, its braces or '')."""
    tokens = [t for t in _tokens(expr) if t[0] != "space"]
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else ("", "")
        if kind == "name" and text in _GROUPING and following[1] == "(":
            i += 2  # skip the label list
            while i < len(tokens) and tokens[i][1] != ")":
                i += 1
        elif (kind == "name" and text not in _KEYWORDS and following[1] != "("
              and following[1] not in _AGGREGATION_GROUPING):
            braces = following[1] if following[0] == "braces" else ""
            yield text, braces
            i += 2 if braces else 1
            continue
        elif kind == "braces":
            yield None, text
        i += 1


def apply(expr: str, selectors: Mapping[str, str]) -> str:
    """``expr`` with each exporter's selector added to the vector selectors of its metrics."""
    chosen = {k: v.strip() for k, v in selectors.items() if v.strip()}
    if not chosen:
        return expr
    out: list[str] = []
    pieces = list(_tokens(expr))
    i = 0
    while i < len(pieces):
        kind, text = pieces[i]
        out.append(text)
        after = _next_solid(pieces, i + 1)
        if kind == "name" and text in _GROUPING and after is not None and pieces[after][1] == "(":
            close = next(j for j in range(after, len(pieces)) if pieces[j][1] == ")")
            out.extend(t for _, t in pieces[i + 1:close + 1])
            i = close + 1
            continue
        if kind == "name" and text not in _KEYWORDS and (
                after is None or pieces[after][1] not in _AGGREGATION_GROUPING | {"("}):
            selector = chosen.get(exporter_of(text) or "")
            if after is not None and pieces[after][0] == "braces":
                out.extend(t for _, t in pieces[i + 1:after])
                out.append(_merge(pieces[after][1], selector))
                i = after + 1
                continue
            if selector:
                out.append("{" + selector + "}")
        elif kind == "braces":
            exporters = {exporter_of(n) for n in names_in(text)}
            if len(exporters) == 1:
                out[-1] = _merge(text, chosen.get(exporters.pop() or ""))
        i += 1
    return "".join(out)


def _next_solid(pieces: list[tuple[str, str]], start: int) -> int | None:
    return next((j for j in range(start, len(pieces)) if pieces[j][0] != "space"), None)


def _merge(braces: str, selector: str | None) -> str:
    """Braces with ``selector``'s matchers first (the others keep their layout)."""
    if not selector:
        return braces
    return "{" + selector + ("," + braces[1:] if braces[1:-1].strip() else "}")
