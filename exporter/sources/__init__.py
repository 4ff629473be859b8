"""Sources of run placements. Each is polled on its own interval and returns plain data."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from exporter.configfile import ConfigError
from exporter.model import RunKey, SourceError, SourceResult

RUN_ID_CHARS = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
NAME_CHARS = re.compile(r"[^\s/\\#?%:\x00-\x1f\x7f]{1,128}")


class Source(Protocol):
    """A poller: ``name`` is the ``source`` label, ``interval`` seconds between polls."""

    name: str
    interval: float

    def poll(self) -> SourceResult:
        """Return what runs where now; raise SourceError when it cannot tell."""
        ...


def valid_run_key(entity: object, project: object, run_id: object) -> RunKey | None:
    """A RunKey when the three parts are acceptable label values, else None."""
    if not (isinstance(entity, str) and isinstance(project, str) and isinstance(run_id, str)):
        return None
    if not (NAME_CHARS.fullmatch(entity) and NAME_CHARS.fullmatch(project)
            and RUN_ID_CHARS.fullmatch(run_id)):
        return None
    return RunKey(entity, project, run_id)


def compile_regex(cfg: Mapping[str, object], key: str, section: str) -> re.Pattern[str] | None:
    """An optional regex from config; must name a ``run_id`` group."""
    raw = cfg.get(key)
    if not raw:
        return None
    try:
        pattern = re.compile(str(raw))
    except re.error as exc:
        raise ConfigError(f"{section}.{key} is not a valid regex: {exc}") from exc
    if "run_id" not in pattern.groupindex:
        raise ConfigError(f"{section}.{key} must have a named group (?P<run_id>...)")
    return pattern


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
