"""Sources of run placements. Each is polled on its own interval and returns plain data."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Protocol

from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.labels import NAME_CHARS, RUN_ID_CHARS
from wandb_infra.common.runkey import RunKey
from wandb_infra.exporter.model import SourceResult


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


def positive_int(cfg: Mapping[str, object], key: str, default: int, section: str) -> int:
    """An optional count or byte size from config: an integer > 0 (not a float, not a bool)."""
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{section}.{key} must be an integer > 0, not {value!r}")
    return value


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
