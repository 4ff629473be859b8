"""Sources of run placements. Each is polled on its own interval and returns plain data."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from wandb_infra.common.commands import run_command
from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.labels import NAME_CHARS, RUN_ID_CHARS
from wandb_infra.common.runkey import RunKey
from wandb_infra.common.schema import Key
from wandb_infra.exporter.model import SourceResult


class Source(Protocol):
    """A poller: ``name`` is the ``source`` label, ``interval`` seconds between polls."""

    name: str
    interval: float

    def poll(self) -> SourceResult:
        """Return what runs where now; raise SourceError when it cannot tell."""
        ...


@dataclass(frozen=True)
class SchedulerCommand:
    """The command a scheduler source runs (its mode's, or the configured ``command``), with
    the section's timeout and output cap: the Slurm job and node sources share it."""

    mode: str
    argv: tuple[str, ...]
    timeout: float
    max_bytes: int
    runner: Callable[..., Any] = subprocess.run

    @classmethod
    def from_section(cls, cfg: Mapping[str, Any], commands: Mapping[str, list[str]],
                     runner: Callable[..., Any] = subprocess.run) -> SchedulerCommand:
        """From a resolved section with ``mode``, ``command``, ``timeout_seconds`` and
        ``max_output_bytes``."""
        mode = str(cfg["mode"])
        return cls(mode, tuple(cfg["command"] or commands[mode]), float(cfg["timeout_seconds"]),
                   int(cfg["max_output_bytes"]), runner)

    def output(self) -> str:
        """The command's stdout; ``SourceError`` when it fails, hangs or floods."""
        return run_command(self.argv, self.timeout, self.runner, self.max_bytes)


def valid_run_key(entity: object, project: object, run_id: object) -> RunKey | None:
    """A RunKey when the three parts are acceptable label values, else None."""
    if not (isinstance(entity, str) and isinstance(project, str) and isinstance(run_id, str)):
        return None
    if not (NAME_CHARS.fullmatch(entity) and NAME_CHARS.fullmatch(project)
            and RUN_ID_CHARS.fullmatch(run_id)):
        return None
    return RunKey(entity, project, run_id)


def source_keys(name: str, interval: float, timeout: float | None) -> dict[str, Key]:
    """The keys every source has: ``enabled``, ``name``, ``interval_seconds`` and, for those
    that run a command or call an API with their own timeout, ``timeout_seconds``."""
    keys = {"enabled": Key("bool", False, "poll this source"),
            "name": Key("str", name, "its `source` label", check=bool, expect="a non-empty "
                        "string"),
            "interval_seconds": Key("number", interval, "seconds between polls", above=0)}
    if timeout is not None:
        keys["timeout_seconds"] = Key("number", timeout, "timeout of one poll", above=0)
    return keys


def compile_regex(raw: str, where: str) -> re.Pattern[str] | None:
    """An optional regex from config (empty: none); must name a ``run_id`` group."""
    if not raw:
        return None
    try:
        pattern = re.compile(raw)
    except re.error as exc:
        raise ConfigError(f"{where} is not a valid regex: {exc}") from exc
    if "run_id" not in pattern.groupindex:
        raise ConfigError(f"{where} must have a named group (?P<run_id>...)")
    return pattern
