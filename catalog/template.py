"""PromQL templates: literal PromQL with ``${NAME}`` placeholders, filled by plain substitution.

The catalog states alert conditions and the generator states its normalisation records this way
(kubernetes-mixin style), so what a reader sees in the Python is what ships, with names and
thresholds put in. ``${...}`` never occurs in PromQL itself (``label_replace`` writes ``$1``), so
no escaping is needed. A multi-line value is indented to the column of the line it lands on, so
templates nest and the output stays readable.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping

Value = str | int | float
_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def placeholders(template: str) -> list[str]:
    """The names a template reads, in order of first use."""
    return list(dict.fromkeys(_PLACEHOLDER.findall(template)))


def _text(value: Value) -> str:
    if isinstance(value, bool):
        raise TypeError("a PromQL template value cannot be a bool")
    if isinstance(value, float):
        return repr(value)
    return str(value)


def fill(template: str, values: Mapping[str, Value]) -> str:
    """``template`` (dedented, stripped) with every placeholder replaced by its value; a name
    missing from ``values`` is a KeyError, so a typo never ships as text."""
    lines = []
    for line in textwrap.dedent(template).strip("\n").rstrip().splitlines():
        indent = line[:len(line) - len(line.lstrip())]

        def put(match: re.Match[str], indent: str = indent) -> str:
            text = _text(values[match.group(1)])
            return text.replace("\n", "\n" + indent)

        lines.append(_PLACEHOLDER.sub(put, line))
    return "\n".join(lines)
