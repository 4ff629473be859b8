"""Generated files, handled the same way by every generator: which committed ones differ from
what the generator produces now, and either writing those or, with ``--check``, naming them and
failing (``make generate`` writes; ``tests/test_generated.py`` checks them all at once)."""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path

PROJECT = "wandb-infra-issues"


def stale(files: Mapping[Path, str]) -> list[Path]:
    """The paths whose committed text differs from ``files`` (missing ones included)."""
    return [p for p, text in files.items()
            if not p.exists() or p.read_text(encoding="utf-8") != text]


def checkout_root(package_file: str | Path) -> Path | None:
    """The source checkout a generator runs from, or None where the package is installed: a
    generator's default output is the checkout's folders, never site-packages. A checkout is the
    folder above the package folder holding this project's pyproject.toml."""
    root = Path(package_file).resolve().parent.parent
    try:
        project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return root if project.get("project", {}).get("name") == PROJECT else None


def write_or_check(files: Mapping[Path, str], check: bool,
                   shown: Callable[[Path], str] = str) -> int:
    """Write every stale file and name it (0), or with ``check`` name each on stderr and
    return 1 when there is one; ``shown`` turns a path into what the message prints."""
    out_of_date = stale(files)
    for path in out_of_date:
        if check:
            print(f"out of date: {shown(path)} (run: make generate)", file=sys.stderr)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[path], encoding="utf-8")
        print(f"wrote {shown(path)}")
    return 1 if check and out_of_date else 0
