"""Slurm host lists and GRES index lists, expanded in pure Python (``scontrol show hostnames``).

``gpu[01-03,07]`` -> gpu01 gpu02 gpu03 gpu07; several bracket groups multiply
(``r[1-2]n[1-2]``); lists of lists are comma separated outside brackets (``a[1-2],b3``);
zero padding follows the range's start (``[008-010]``).
"""

from __future__ import annotations

import re

MAX_HOSTS = 100_000


class NodeListError(ValueError):
    """A host list or GRES string that cannot be parsed."""


def split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise NodeListError(f"nested brackets in {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise NodeListError(f"unbalanced ']' in {text!r}")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise NodeListError(f"unbalanced '[' in {text!r}")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_ranges(body: str, whole: str) -> list[str]:
    values: list[str] = []
    for raw in body.split(","):
        item = raw.strip()
        if not item:
            continue
        if "-" in item:
            lo, _, hi = item.partition("-")
            if not (lo.isdigit() and hi.isdigit()):
                raise NodeListError(f"bad range {item!r} in {whole!r}")
            start, stop = int(lo), int(hi)
            if stop < start:
                raise NodeListError(f"descending range {item!r} in {whole!r}")
            if stop - start >= MAX_HOSTS:
                raise NodeListError(f"range {item!r} too large in {whole!r}")
            width = len(lo) if lo.startswith("0") else 0
            values.extend(str(n).zfill(width) for n in range(start, stop + 1))
        elif item.isdigit():
            values.append(item)
        else:
            raise NodeListError(f"bad range item {item!r} in {whole!r}")
    return values


_GROUP = re.compile(r"\[([^\[\]]*)\]")


def expand_hostlist(text: str) -> list[str]:
    """Expand a compressed Slurm host list, keeping order and dropping duplicates."""
    if not isinstance(text, str):
        raise NodeListError(f"host list must be a string, got {type(text).__name__}")
    text = text.strip()
    if text in ("", "(null)", "None"):
        return []
    hosts: list[str] = []
    for part in split_top_level(text):
        names = [""]
        pos = 0
        for match in _GROUP.finditer(part):
            prefix = part[pos:match.start()]
            choices = _expand_ranges(match.group(1), text)
            names = [n + prefix + c for n in names for c in choices]
            if len(names) > MAX_HOSTS:
                raise NodeListError(f"host list {text!r} expands to too many hosts")
            pos = match.end()
        names = [n + part[pos:] for n in names]
        if any(not n or "[" in n or "]" in n or " " in n for n in names):
            raise NodeListError(f"cannot parse host list {text!r}")
        hosts.extend(names)
    return list(dict.fromkeys(hosts))


_GRES_IDX = re.compile(r"^gpu(?::[^:(]+)?(?::\d+)?\(IDX:([^)]*)\)")


def gres_gpu_indices(gres: str) -> list[str]:
    """GPU indices from a GRES detail string: ``gpu:4(IDX:0-3)``, ``gpu:h100:8(IDX:0-7)``,
    ``gpu:2(IDX:0,2)``; several GRES are comma separated outside parentheses. No IDX -> []."""
    if not isinstance(gres, str):
        raise NodeListError(f"GRES must be a string, got {type(gres).__name__}")
    indices: list[str] = []
    for item in re.split(r",(?![^()]*\))", gres.strip()):
        match = _GRES_IDX.match(item.strip())
        if not match:
            continue
        body = match.group(1).strip()
        if body in ("", "N/A"):
            continue
        indices.extend(str(int(v)) for v in _expand_ranges(body, gres))
    return list(dict.fromkeys(indices))
