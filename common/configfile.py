"""One YAML file plus environment overrides plus secrets from files: shared by both daemons and
the rule generator.

Environment overrides use the prefix and double underscores for nesting, e.g.
``WANDB_INFRA_BRIDGE__WANDB__BASE_URL`` sets ``wandb.base_url``. A value is the variable's
text, literally (``EnvText``): the schema reads it as YAML only for a key that is not a string
(``true``, ``30``, ``1.5``, ``[a, b]``), so a token such as ``s3cret #rest`` or ``'x'`` is taken
whole, never cut at a YAML comment or unquoted.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration problem the user must fix; the message says which key and why."""


class EnvText(str):
    """A value from an environment override: literal text, typed only by its key's schema."""


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``base`` with ``override`` merged in recursively (override wins)."""
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def env_overrides(prefix: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """Collect ``PREFIX__A__B=value`` variables into ``{"a": {"b": value}}``."""
    result: dict[str, Any] = {}
    marker = prefix + "__"
    for name, raw in environ.items():
        if not name.startswith(marker):
            continue
        path = [part.lower() for part in name[len(marker):].split("__") if part]
        if not path:
            continue
        value = EnvText(raw)
        node = result
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"environment variable {name} conflicts with another override")
        node[path[-1]] = value
    return result


def read_config(path: str | os.PathLike[str] | None, env_prefix: str,
                environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The YAML file (if any), then environment overrides: what the user set, before any
    defaults, for a schema to check and complete."""
    environ = os.environ if environ is None else environ
    data: Any = {}
    if path:
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {file}: {exc.strerror}") from exc
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:  # where, never the text: that line may hold a secret
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or type(exc).__name__
            raise ConfigError(f"config file {file} is not valid YAML{where}: {problem}") from exc
        if not isinstance(data, Mapping):
            raise ConfigError(f"config file {file} must be a mapping at the top level")
    return deep_merge(data, env_overrides(env_prefix, environ))


def read_secret(
    value: str | None, file: str | None, what: str, environ: Mapping[str, str] | None = None
) -> str | None:
    """A secret from a file (preferred, trailing newline stripped) or a literal/env value."""
    environ = os.environ if environ is None else environ
    if file:
        try:
            secret = Path(file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"cannot read {what} from {file}: {exc.strerror}") from exc
        if not secret:
            raise ConfigError(f"{what} file {file} is empty")
        return secret
    if value and value.startswith("env:"):
        secret = environ.get(value[4:], "").strip()
        return secret or None
    return value or None
