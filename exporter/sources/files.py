"""Registration files (node_exporter textfile-collector style): ``<dir>/*.json``.

Each file holds one registration object or a list of them (the same schema as ``POST /v1/runs``;
``ttl_seconds`` is ignored). A file counts while it exists and, when ``max_age_seconds`` > 0, while
its mtime is recent. Write files atomically (write ``x.json.tmp``, rename): names not ending in
``.json`` are ignored. A bad file is skipped and reported; the others still count.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wandb_infra.common.commands import SourceError
from wandb_infra.common.configfile import ConfigError
from wandb_infra.exporter.model import SourceResult
from wandb_infra.exporter.pushed import RegistrationError, parse_registration

MAX_FILE_BYTES = 1 << 20


class RegistrationFilesSource:
    """Polls a directory of registration files."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        self.name = str(cfg.get("name") or "files")
        self.interval = float(cfg.get("interval_seconds", 10))
        directory = cfg.get("directory")
        if not directory:
            raise ConfigError("sources.files.directory is required when the source is enabled")
        self.directory = Path(str(directory))
        self.max_age = float(cfg.get("max_age_seconds", 0))

    def poll(self) -> SourceResult:
        """Read every ``*.json`` file; unreadable directory -> SourceError."""
        try:
            files = sorted(p for p in self.directory.iterdir() if p.name.endswith(".json"))
        except OSError as exc:
            raise SourceError(f"cannot list {self.directory}: {exc.strerror}") from exc
        result = SourceResult()
        now = time.time()
        for path in files:
            try:
                stat = path.stat()
                if self.max_age and now - stat.st_mtime > self.max_age:
                    continue
                if stat.st_size > MAX_FILE_BYTES:
                    raise RegistrationError(f"larger than {MAX_FILE_BYTES} bytes")
                data = json.loads(path.read_text(encoding="utf-8"))
                items = data if isinstance(data, list) else [data]
                for item in items:
                    clean = ({k: v for k, v in item.items() if k != "ttl_seconds"}
                             if isinstance(item, dict) else item)
                    placement, _ = parse_registration(clean, self.name, 1.0, 1.0)
                    result.placements.append(placement)
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:
                result.problems.append(f"{path.name}: {exc}")
        return result
