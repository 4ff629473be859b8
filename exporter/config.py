"""The exporter's configuration: one schema composed of each source's own section, from which
the defaults, the ``--help`` key listing and every one-line error derive; loading (YAML file,
then ``WANDB_INFRA_EXPORTER__*`` overrides) and the checks that span several keys."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from wandb_infra.common.configfile import ConfigError, read_config, read_secret
from wandb_infra.common.kubeapi import CONNECTION
from wandb_infra.common.schema import Key, Section
from wandb_infra.exporter import hostnames
from wandb_infra.exporter.hostnames import HostnameMapper
from wandb_infra.exporter.server import HostToken
from wandb_infra.exporter.sources import files, kubernetes, nodestate, slurm, wandb_runs

ENV_PREFIX = "WANDB_INFRA_EXPORTER"


def parse_listen(value: str) -> tuple[str, int]:
    """``host:port`` -> (host, port)."""
    host, sep, port = str(value).rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen: must be host:port, not {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _is_listen(value: str) -> bool:
    try:
        parse_listen(value)
    except ConfigError:
        return False
    return True


SCHEMA = Section({
    "listen": Key("str", "0.0.0.0:9842", "host:port to serve /metrics, /healthz and /v1/runs "
                  "on (--web.listen-address overrides it)", check=_is_listen, expect="host:port"),
    "log_level": Key("str", "info", "JSON lines on stderr; secrets are redacted",
                     choices=("debug", "info", "warning", "error")),
    "grace_seconds": Key("number", 300, "how long a failing source keeps its last good mapping",
                         minimum=0),
    "idle_timeout_seconds": Key("number", 30, "a connection that completes no request (new or "
                                "kept alive) for this long is closed", above=0),
    "auth": Section({
        "token": Key("str", None, 'bearer token required by POST/DELETE /v1/runs ("env:NAME" '
                     "reads a variable); required unless listen is a loopback address or "
                     "registrations are disabled", optional=True, secret=True),
        "token_file": Key("str", None, "file holding that token (preferred)", optional=True),
        "host_tokens": Key("list", [], "list of {token | token_file, hosts: [PATTERN, ...]}: a "
                           "token that may register and delete runs only on matching hosts "
                           "(e.g. one per node for its Slurm prolog/epilog). Patterns match the "
                           "canonical host key, after hostnames.* (gpu01.rack-b.example.com is "
                           "gpu01), so a pattern naming a domain or upper case is refused"),
    }, help="who may register and delete runs"),
    "registrations": Section({
        "enabled": Key("bool", True, "accept POST /v1/runs"),
        "default_ttl_seconds": Key("number", 600, "a registration lives this long unless "
                                   "re-posted (heartbeat)", above=0),
        "max_ttl_seconds": Key("number", 30 * 86400, "the longest ttl_seconds accepted",
                               above=0),
        "max_entries": Key("int", 100_000, "registrations kept at most", above=0),
        "max_series": Key("int", 180_000, "series the registrations publish at most (1 per host "
                          "+ 1 per GPU; about 290 MB of RSS); beyond it POST gets 503", above=0),
        "max_series_per_token": Key("int", 1000, "the same bound per auth.host_tokens entry, so "
                                    "one node's token cannot fill the store for every other "
                                    "node (auth.token is bounded by max_series only)", above=0),
        "state_file": Key("str", "/var/lib/wandb-infra-exporter/registrations.json",
                          "where registrations are saved (at most once a second, and at "
                          "shutdown) and restored from at start with the rest of their TTL; "
                          "empty: memory only, a restart forgets them"),
    }, help="HTTP registrations (Slurm prolog/epilog, wandb_infra.exporter.client)"),
    "metadata": Section({
        "max_hosts_per_run": Key("int", 4096, "hosts one run may be placed on per source poll "
                                 "(more are cut, logged and counted in source_cut_total)",
                                 above=0),
        "max_runs_per_source": Key("int", 50_000, "runs one source poll may report", above=0),
        "max_label_bytes": Key("int", 256, "UTF-8 bytes of a run name or label value from a "
                               "source (longer ones are cut; a longer host name is dropped)",
                               above=0),
    }, help="bounds on what the polled sources report (W&B run configs, pod labels are "
            "untrusted)"),
    "hostnames": hostnames.SCHEMA,
    "sources": Section({
        "slurm": slurm.SCHEMA, "wandb": wandb_runs.SCHEMA, "kubernetes": kubernetes.SCHEMA,
        "files": files.SCHEMA,
    }, help="where run placements come from; each source's `name` is its `source` label"),
    "node_state": Section({"slurm": nodestate.SLURM_SCHEMA,
                           "kubernetes": nodestate.KUBERNETES_SCHEMA},
                          help="each host's scheduler state, for the bridge's restart verdict"),
})

DEFAULTS: dict[str, Any] = SCHEMA.defaults()

HELP = f"""\
Publishes wandb_run_node_info / wandb_run_gpu_info (which W&B run is on which host and GPU) for
Prometheus, from Slurm, the W&B API, Kubernetes, HTTP registrations and registration files.

Configuration: one YAML file (--config) over built-in defaults; any key can be overridden from the
environment as {ENV_PREFIX}__SECTION__KEY (e.g. {ENV_PREFIX}__SOURCES__SLURM__ENABLED=true).
POST and DELETE /v1/runs refuse what a web page can make a browser send, on loopback too: any
Origin or Sec-Fetch-* header (403) and a body that is not Content-Type: application/json (415).

Keys (see deploy/exporter.example.yaml for a commented example):
""" + "\n".join(SCHEMA.help_lines()) + "\n"


def _inherit_connection(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """node_state.kubernetes takes each connection key it does not set from sources.kubernetes
    (before defaults fill either, so an explicit setting always wins)."""
    sources, node_state = raw.get("sources"), raw.get("node_state")
    if not isinstance(sources, Mapping) or not isinstance(node_state, Mapping):
        return raw
    source, nodes = sources.get("kubernetes"), node_state.get("kubernetes")
    if not isinstance(source, Mapping) or not isinstance(nodes, Mapping | None):
        return raw
    inherited = {k: v for k, v in source.items() if k in CONNECTION}
    return {**raw, "node_state": {**node_state, "kubernetes": {**inherited, **(nodes or {})}}}


def resolve(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` checked against the schema and completed with the defaults (idempotent)."""
    cfg = SCHEMA.resolve(_inherit_connection(raw))
    if not cfg["registrations"]["default_ttl_seconds"] <= cfg["registrations"]["max_ttl_seconds"]:
        raise ConfigError("registrations.default_ttl_seconds must be at most max_ttl_seconds")
    return cfg


def load(path: str | None, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The YAML file, then environment overrides, over the defaults, checked."""
    return resolve(read_config(path, ENV_PREFIX, environ))


def is_loopback(host: str) -> bool:
    """True when only this machine can connect to ``host`` (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_IP_PATTERN = frozenset("0123456789.*?[]!-")  # IPv4 addresses keep their dots


def host_tokens(raw: list[Any], secrets: list[str], mapper: HostnameMapper) -> list[HostToken]:
    """``auth.host_tokens``: each a token (file preferred) bound to patterns of canonical
    host keys; a pattern no canonical key can match is refused rather than never matching."""
    out = []
    for i, item in enumerate(raw):
        where = f"auth.host_tokens[{i}]"
        if not isinstance(item, Mapping) or set(item) - {"token", "token_file", "hosts"}:
            raise ConfigError(f"{where} must be a mapping of token/token_file and hosts")
        hosts = item.get("hosts")
        if not isinstance(hosts, list) or not hosts or not all(
                isinstance(h, str) and h for h in hosts):
            raise ConfigError(f"{where}.hosts must be a non-empty list of host patterns")
        for pattern in hosts:
            if (mapper.lowercase and pattern != pattern.lower()) or (
                    mapper.strip_domain and "." in pattern and set(pattern) - _IP_PATTERN):
                raise ConfigError(
                    f"{where}.hosts: {pattern!r} can never match: tokens are bound to canonical "
                    "host keys (after hostnames.*: domain stripped, lower case), so name those, "
                    "e.g. 'gpu-b*' rather than '*.rack-b.example.com'")
        token = read_secret(item.get("token"), item.get("token_file"), where)
        if not token:
            raise ConfigError(f"{where} needs token or token_file")
        secrets.append(token)
        out.append(HostToken(token, tuple(hosts)))
    return out


def require_token(listen: str, authenticated: bool, registrations: bool) -> None:
    """Refuse an open registration API off loopback: anyone reaching it could register a fake
    run on a faulty host (the bridge then writes issues into it) or delete real ones."""
    host, _ = parse_listen(listen)
    if registrations and not authenticated and not is_loopback(host):
        raise ConfigError(f"no auth.token[_file] while the registration API listens on {listen}; "
                          "refusing to start. Set auth.token_file, listen on 127.0.0.1, or set "
                          "registrations.enabled: false")
