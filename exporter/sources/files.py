"""Registration files (node_exporter textfile-collector style): ``<dir>/*.json``.

Each file holds one registration object or a list of them (the same schema as ``POST /v1/runs``;
``ttl_seconds`` is ignored). A file counts while it exists and, when ``max_age_seconds`` > 0, while
its mtime is recent. Write files atomically (write ``x.json.tmp``, rename): names not ending in
``.json`` are ignored. A bad file is skipped and reported; the others still count.

Only regular files are read (a symlink is followed to one, as in a ConfigMap volume), so a FIFO
cannot hang the poller and a link to ``/dev/zero`` cannot be read without end; each file is read
up to ``max_file_bytes``, and the files together publish at most ``max_series`` series (default
``registrations.max_series``, the HTTP path's cap): registrations past it, in file-name order,
are skipped and reported.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wandb_infra.common.commands import SourceError
from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.schema import Key, Section
from wandb_infra.exporter.model import SourceResult
from wandb_infra.exporter.pushed import RegistrationError, parse_registration, series
from wandb_infra.exporter.sources import source_keys

SCHEMA = Section({
    **source_keys("files", interval=10, timeout=None),
    "directory": Key("str", "", "directory of *.json registration files (required when "
                     "enabled)"),
    "max_age_seconds": Key("number", 0, "a file counts while its mtime is this recent (0: as "
                           "long as it exists)", minimum=0),
    "max_file_bytes": Key("int", 1 << 20, "larger files are skipped and reported", above=0),
    "max_series": Key("int", None, "registrations past this many series are skipped (unset: "
                      "registrations.max_series)", above=0, optional=True),
}, help="registration files, node_exporter textfile-collector style; only regular files are "
        "read (no FIFOs or devices)")
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def read_regular(path: Path, limit: int, max_age: float, now: float) -> bytes | None:
    """The file's bytes, None when too old; RegistrationError unless a regular file of at
    most ``limit`` bytes (checked again on the open descriptor, in case it was swapped)."""
    if not stat.S_ISREG(path.stat().st_mode):
        raise RegistrationError("not a regular file")
    fd = os.open(path, _OPEN_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RegistrationError("not a regular file")
        if max_age and now - info.st_mtime > max_age:
            return None
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise RegistrationError(f"larger than {limit} bytes (max_file_bytes)")
        return b"".join(chunks)
    finally:
        os.close(fd)


class RegistrationFilesSource:
    """Polls a directory of registration files."""

    def __init__(self, cfg: Mapping[str, Any], max_series: int) -> None:
        """``max_series`` bounds the files when the section sets no ``max_series`` (the
        exporter passes registrations.max_series, the HTTP path's cap)."""
        cfg = SCHEMA.resolve(cfg, "sources.files")
        self.name = str(cfg["name"])
        self.interval = float(cfg["interval_seconds"])
        if not cfg["directory"]:
            raise ConfigError("sources.files.directory is required when the source is enabled")
        self.directory = Path(cfg["directory"])
        self.max_age = float(cfg["max_age_seconds"])
        self.max_bytes = int(cfg["max_file_bytes"])
        self.max_series = int(cfg["max_series"] or max_series)

    def poll(self) -> SourceResult:
        """Read every ``*.json`` file; unreadable directory -> SourceError."""
        try:
            files = sorted(p for p in self.directory.iterdir() if p.name.endswith(".json"))
        except OSError as exc:
            raise SourceError(f"cannot list {self.directory}: {exc.strerror}") from exc
        result = SourceResult()
        now, total, skipped = time.time(), 0, 0
        for path in files:
            try:
                raw = read_regular(path, self.max_bytes, self.max_age, now)
                if raw is None:
                    continue
                data = json.loads(raw)
                found = []
                for item in data if isinstance(data, list) else [data]:
                    clean = ({k: v for k, v in item.items() if k != "ttl_seconds"}
                             if isinstance(item, dict) else item)
                    found.append(parse_registration(clean, self.name, 1.0, 1.0)[0])
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:
                result.problems.append(f"{path.name}: {exc}")
                continue
            except RecursionError:
                result.problems.append(f"{path.name}: JSON nested too deeply")
                continue
            for placement in found:
                if total + series(placement) > self.max_series:
                    skipped += 1
                    continue
                total += series(placement)
                result.placements.append(placement)
        if skipped:
            result.problems.append(f"{skipped} registration(s) skipped: the files would publish "
                                   f"more than {self.max_series} series (max_series)")
        return result
