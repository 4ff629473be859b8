"""A declarative configuration schema: each key's type, default, bounds and help in one place.

A program declares a ``Section`` of ``Key``s and nested sections once (each exporter source next
to its own code); the defaults, the ``--help`` key listing and validation all derive from it, so
they cannot drift apart. Validation names the key by its dotted path in one line:
``sources.slurm.intervall_seconds: unknown key (known: ...)`` or
``listen.port: must be an integer 0-65535, not 'x'``.
"""

from __future__ import annotations

import copy
import json
import textwrap
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from wandb_infra.common.configfile import ConfigError, EnvText

Kind = Literal["int", "number", "bool", "str", "list[str]", "list", "mapping"]

_NOUN = {"int": "an integer", "number": "a number", "bool": "true or false", "str": "a string",
         "list[str]": "a list of strings", "list": "a list", "mapping": "a mapping"}


def _is_kind(kind: Kind, value: Any) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "list[str]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "list":
        return isinstance(value, list)
    return isinstance(value, Mapping)


def _show(value: Any) -> str:
    """A default as it would be written in YAML."""
    if value is None:
        return "unset"
    if isinstance(value, str) and value:
        return value
    return json.dumps(value)


@dataclass(frozen=True)
class Key:
    """One setting. Numbers may be bounded by ``above`` (exclusive) or ``minimum``/``maximum``;
    ``optional`` lets it be unset (null); ``check`` is a further condition on a value of the
    right kind, described by ``expect`` in the error; ``secret`` hides values."""

    kind: Kind
    default: Any
    help: str
    above: float | None = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    optional: bool = False
    secret: bool = False
    check: Callable[[Any], bool] | None = None
    expect: str = ""

    def _from_env(self, text: EnvText) -> Any:
        if self.kind == "str":
            return str(text)
        try:
            return yaml.safe_load(text) if text != "" else ""
        except yaml.YAMLError:
            return str(text)

    def describe(self) -> str:
        """What a valid value is, as the end of 'must be ...'."""
        if self.expect:
            text = self.expect
        elif self.choices:
            quoted = [repr(c) for c in self.choices]
            text = ", ".join(quoted[:-1]) + " or " + quoted[-1] if len(quoted) > 1 else quoted[0]
        else:
            low, high = self.minimum, self.maximum
            bounds = [f"{op} {x:g}" for op, x in ((">", self.above), (">=", low), ("<=", high))
                      if x is not None]
            if self.above is None and low is not None and high is not None:
                bounds = [f"{low:g}-{high:g}"]
            text = " ".join([_NOUN[self.kind], " and ".join(bounds)]).strip()
        if self.optional:
            text = "true, false or unset" if self.kind == "bool" else text + " or unset"
        return text

    def validate(self, value: Any, path: str) -> Any:
        """``value`` unchanged when valid, else ConfigError naming ``path``. Text from the
        environment is the value itself for a string key, and YAML for any other."""
        if isinstance(value, EnvText):
            value = self._from_env(value)
        if value is None and self.optional:
            return None
        ok = _is_kind(self.kind, value)
        if ok and self.kind in ("int", "number"):
            ok = ((self.above is None or value > self.above)
                  and (self.minimum is None or value >= self.minimum)
                  and (self.maximum is None or value <= self.maximum))
        ok = ok and (not self.choices or value in self.choices)
        ok = ok and (self.check is None or self.check(value))
        if not ok:
            shown = "<secret>" if self.secret else repr(value)
            raise ConfigError(f"{path}: must be {self.describe()}, not {shown}")
        return value


@dataclass(frozen=True)
class Section:
    """Ordered keys and sub-sections; ``help`` introduces the section in the key listing."""

    keys: Mapping[str, Key | Section]
    help: str = ""

    def defaults(self) -> dict[str, Any]:
        """Every key at its default (a fresh copy each call)."""
        return {name: item.defaults() if isinstance(item, Section) else copy.deepcopy(item.default)
                for name, item in self.keys.items()}

    def resolve(self, raw: Mapping[str, Any] | None, path: str = "") -> dict[str, Any]:
        """``raw`` over the defaults, every value checked; unset keys get their defaults. An
        unknown key or a wrong value is a ConfigError naming its dotted path."""
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            kind = "string" if isinstance(raw, str) else type(raw).__name__
            raise ConfigError(f"{path}: must be a mapping, not a {kind}")
        unknown = sorted(str(k) for k in raw if k not in self.keys)
        if unknown:
            raise ConfigError(f"{_join(path, unknown[0])}: unknown key "
                              f"(known: {', '.join(self.keys)})")
        out: dict[str, Any] = {}
        for name, item in self.keys.items():
            where = _join(path, name)
            if isinstance(item, Section):
                out[name] = item.resolve(raw.get(name), where)
            elif name in raw:
                out[name] = copy.deepcopy(item.validate(raw[name], where))
            else:
                out[name] = copy.deepcopy(item.default)
        return out

    def paths(self, prefix: str = "") -> Iterator[str]:
        """Every key's dotted path, in declaration order."""
        for name, item in self.keys.items():
            if isinstance(item, Section):
                yield from item.paths(_join(prefix, name))
            else:
                yield _join(prefix, name)

    def help_lines(self, prefix: str = "", width: int = 100) -> list[str]:
        """The ``--help`` listing: each key with its default, then its help, indented."""
        lines: list[str] = []
        for name, item in self.keys.items():
            where = _join(prefix, name)
            if isinstance(item, Section):
                if item.help:
                    lines += textwrap.wrap(f"{where}: {item.help}", width, initial_indent="  ",
                                           subsequent_indent="      ")
                lines += item.help_lines(where, width)
                continue
            default = "unset" if item.secret else _show(item.default)
            lines.append(f"  {where} (default {default})")
            lines += textwrap.wrap(item.help, width, initial_indent="      ",
                                   subsequent_indent="      ")
        return lines


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
