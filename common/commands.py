"""Asking an outside source of truth (a scheduler command, an API) and failing in one line."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class SourceError(RuntimeError):
    """An outside source could not answer this time (callers keep their last good answer)."""


def run_command(command: Sequence[str], timeout: float,
                runner: Callable[..., Any] = subprocess.run) -> str:
    """A scheduler command's stdout; ``SourceError`` naming the command when it cannot start,
    times out or exits non-zero (with the start of its stderr)."""
    try:
        proc = runner(list(command), capture_output=True, text=True, timeout=timeout,
                      check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SourceError(f"{command[0]} failed: {exc}") from exc
    if proc.returncode != 0:
        raise SourceError(f"{' '.join(command)} exited {proc.returncode}: "
                          f"{(proc.stderr or '').strip()[:300]}")
    return str(proc.stdout)


def json_list(text: str, command: str, key: str) -> list[Any]:
    """The ``key`` list of a scheduler command's JSON output (``squeue --json`` jobs,
    ``sinfo --json`` nodes); ``SourceError`` naming the command when it is not there."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SourceError(f"{command} output is not JSON: {exc}") from exc
    if not isinstance(data, Mapping) or not isinstance(data.get(key), list):
        raise SourceError(f"{command} output has no '{key}' list")
    return list(data[key])
