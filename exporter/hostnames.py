"""Host-name mapping, so our ``hostname`` equals the one dcgm-exporter puts on GPU series.

They differ with FQDNs (``gpu01.cluster.local`` vs ``gpu01``) and on Slurm-on-Kubernetes (slurmd
pod name vs Kubernetes node name). Rewrites apply in order (each a full-match regex and a
replacement with ``\\1``-style groups), then the domain is stripped, then the name is lower-cased.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.schema import Key, Section

SCHEMA = Section({
    "strip_domain": Key("bool", True, "gpu01.example.com -> gpu01 (IPv4 addresses are kept)"),
    "lowercase": Key("bool", True, "GPU01 -> gpu01"),
    "rewrites": Key("list", [], "list of {match: REGEX, replace: TEMPLATE}, applied before the "
                    r"two above; the first full match wins (replace: \1-style groups)"),
}, help="make the `hostname` label equal the one dcgm-exporter puts on GPU series")


@dataclass(frozen=True)
class HostnameMapper:
    """Maps a host name as a source reports it to the canonical ``hostname`` label value."""

    rewrites: tuple[tuple[re.Pattern[str], str], ...] = ()
    strip_domain: bool = True
    lowercase: bool = True

    @classmethod
    def from_config(cls, cfg: Mapping[str, object]) -> HostnameMapper:
        """Build from the ``hostnames`` config section; bad regexes raise ConfigError."""
        section = SCHEMA.resolve(cfg, "hostnames")
        rewrites = []
        for i, item in enumerate(section["rewrites"]):
            if not isinstance(item, Mapping) or "match" not in item:
                raise ConfigError(f"hostnames.rewrites[{i}] needs 'match' (and 'replace')")
            try:
                pattern = re.compile(str(item["match"]))
            except re.error as exc:
                raise ConfigError(f"hostnames.rewrites[{i}].match is not a regex: {exc}") from exc
            rewrites.append((pattern, str(item.get("replace", r"\g<0>"))))
        return cls(tuple(rewrites), section["strip_domain"], section["lowercase"])

    def __call__(self, host: str) -> str:
        name = host.strip()
        for pattern, replacement in self.rewrites:
            match = pattern.fullmatch(name)
            if match:
                name = match.expand(replacement)
                break
        if self.strip_domain and not _is_ip(name):
            name = name.split(".", 1)[0]
        return name.lower() if self.lowercase else name


def _is_ip(name: str) -> bool:
    parts = name.split(".")
    return len(parts) == 4 and all(p.isdigit() for p in parts)
