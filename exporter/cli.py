"""``wandb-infra-exporter``: publishes which W&B run is on which host and GPU for Prometheus."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from wandb_infra.common.configfile import ConfigError, check_section, load_config, read_secret
from wandb_infra.common.logsetup import log_fields, setup_logging
from wandb_infra.exporter import webconfig
from wandb_infra.exporter.hostnames import HostnameMapper
from wandb_infra.exporter.placements import PlacementMerger
from wandb_infra.exporter.pushed import RegistrationStore
from wandb_infra.exporter.server import REGISTRATION_SOURCE, HostToken, build_app
from wandb_infra.exporter.sources import Source, positive_int
from wandb_infra.exporter.sources.files import RegistrationFilesSource
from wandb_infra.exporter.sources.kubernetes import KubernetesSource
from wandb_infra.exporter.sources.nodestate import KubernetesNodeSource, SlurmNodeSource
from wandb_infra.exporter.sources.slurm import SlurmSource
from wandb_infra.exporter.sources.wandb_runs import WandbRunsSource

ENV_PREFIX = "WANDB_INFRA_EXPORTER"

DEFAULTS: dict[str, Any] = {
    "listen": "0.0.0.0:9842",
    "log_level": "info",
    "grace_seconds": 300,
    "idle_timeout_seconds": 30,
    "auth": {"token": None, "token_file": None, "host_tokens": []},
    "registrations": {"enabled": True, "default_ttl_seconds": 600,
                      "max_ttl_seconds": 30 * 86400, "max_entries": 100000,
                      "max_series": 180000, "max_series_per_token": 1000},
    "hostnames": {"strip_domain": True, "lowercase": True, "rewrites": []},
    "sources": {
        "slurm": {"enabled": False},
        "wandb": {"enabled": False},
        "kubernetes": {"enabled": False},
        "files": {"enabled": False},
    },
    "node_state": {"slurm": {"enabled": False}, "kubernetes": {"enabled": False}},
}

HELP = f"""\
Publishes wandb_run_node_info / wandb_run_gpu_info (which W&B run is on which host and GPU) for
Prometheus, from Slurm, the W&B API, Kubernetes, HTTP registrations and registration files.

Configuration: one YAML file (--config) over built-in defaults; any key can be overridden from the
environment as {ENV_PREFIX}__SECTION__KEY (e.g. {ENV_PREFIX}__SOURCES__SLURM__ENABLED=true).
POST and DELETE /v1/runs refuse what a web page can make a browser send, on loopback too: any
Origin or Sec-Fetch-* header (403) and a body that is not Content-Type: application/json (415).

Keys (see deploy/exporter.example.yaml for a commented example):
  listen                      host:port to serve /metrics, /healthz, /v1/runs (default 0.0.0.0:9842)
  log_level                   debug|info|warning|error (JSON lines on stderr)
  grace_seconds               how long a failing source keeps its last good mapping (default 300)
  idle_timeout_seconds        a connection that completes no request (new or kept alive) for this
                              long is closed (default 30)
  auth.token / auth.token_file  bearer token required by POST/DELETE /v1/runs (file preferred;
                              "env:NAME" reads an environment variable); required unless listen
                              is a loopback address or registrations are disabled
  auth.host_tokens            list of {{token | token_file, hosts: [PATTERN, ...]}}: a token that
                              may register and delete runs only on matching hosts (e.g. one
                              per node for its Slurm prolog/epilog). Patterns match the
                              canonical host key, after hostnames.* (gpu01.rack-b.example.com
                              is gpu01), so a pattern naming a domain or upper case is refused
  registrations.enabled       accept POST /v1/runs (default true)
  registrations.default_ttl_seconds / max_ttl_seconds / max_entries
  registrations.max_series    bound on the series registrations publish (1 per host + 1 per
                              GPU; default 180000, about 290 MB of RSS); beyond it POST gets 503
  registrations.max_series_per_token  the same bound per auth.host_tokens entry (default 1000),
                              so one node's token cannot fill the store for every other node;
                              auth.token (every host) is bounded by max_series only
  hostnames.strip_domain      gpu01.example.com -> gpu01 (default true)
  hostnames.lowercase         (default true)
  hostnames.rewrites          list of {{match: REGEX, replace: TEMPLATE}}, first full match wins
  sources.slurm               enabled, mode (squeue_json|scontrol), command, interval_seconds,
                              timeout_seconds, comment_regex (default matches
                              wandb:<entity>/<project>/<run_id>),
                              job_name_regex, default_entity, default_project,
                              max_output_bytes (default 67108864: more output is refused as a
                              source error, about 5x that in memory while parsing)
  sources.wandb               enabled, base_url, api_key / api_key_file, projects (list of
                              "entity/project"), interval_seconds, timeout_seconds, page_size
  sources.kubernetes          enabled, in_cluster, kubeconfig, api_server, token / token_file,
                              ca_file, insecure_skip_tls_verify, namespace, label_selector,
                              run_id_key, entity_key, project_key, default_entity,
                              default_project, interval_seconds, timeout_seconds, page_size
  sources.files               enabled, directory, max_age_seconds, interval_seconds,
                              max_file_bytes (default 1048576; larger files are skipped),
                              max_series (default registrations.max_series; registrations past
                              it are skipped); only regular files are read (no FIFOs, devices)
Every source may also set `name` (its `source` label; defaults slurm, wandb, kubernetes, files).
  node_state.slurm            enabled, mode (scontrol|sinfo_json), command, interval_seconds,
                              timeout_seconds, max_output_bytes (as sources.slurm):
                              publishes wandb_infra_node_state{{hostname,
                              scheduler, state, reason}} and wandb_infra_node_schedulable
                              (drained, down, ... and the reason); read-only
  node_state.kubernetes       enabled, tolerated_taints (default [nvidia.com/gpu]),
                              interval_seconds, and the connection keys of sources.kubernetes
                              (taken from there when not set here); needs 'list' on 'nodes'
"""


def parse_listen(value: str) -> tuple[str, int]:
    """``host:port`` -> (host, port)."""
    host, sep, port = str(value).rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"listen must be host:port, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def is_loopback(host: str) -> bool:
    """True when only this machine can connect to ``host`` (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_tokens(raw: object, secrets: list[str], mapper: HostnameMapper) -> list[HostToken]:
    """``auth.host_tokens``: each a token (file preferred) bound to patterns of canonical
    host keys; a pattern no canonical key can match is refused rather than never matching."""
    if not isinstance(raw, list):
        raise ConfigError("auth.host_tokens must be a list")
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


_IP_PATTERN = frozenset("0123456789.*?[]!-")  # IPv4 addresses keep their dots


def require_token(listen: str, authenticated: bool, registrations: bool) -> None:
    """Refuse an open registration API off loopback: anyone reaching it could register a fake
    run on a faulty host (the bridge then writes issues into it) or delete real ones."""
    host, _ = parse_listen(listen)
    if registrations and not authenticated and not is_loopback(host):
        raise ConfigError(f"no auth.token[_file] while the registration API listens on {listen}; "
                          "refusing to start. Set auth.token_file, listen on 127.0.0.1, or set "
                          "registrations.enabled: false")


# The keys each source reads (plus ``enabled``), so a typo is an error, not a silent default.
_COMMON = frozenset({"enabled", "name", "interval_seconds", "timeout_seconds"})
_K8S = frozenset({"in_cluster", "kubeconfig", "api_server", "token", "token_file", "ca_file",
                  "insecure_skip_tls_verify", "namespace", "label_selector", "page_size"})
SOURCE_KEYS: dict[str, frozenset[str]] = {
    "slurm": _COMMON | {"mode", "command", "comment_regex", "job_name_regex", "default_entity",
                        "default_project", "max_output_bytes"},
    "wandb": _COMMON | {"base_url", "api_key", "api_key_file", "projects", "page_size"},
    "kubernetes": _COMMON | _K8S | {"run_id_key", "entity_key", "project_key",
                                    "default_entity", "default_project"},
    "files": _COMMON | {"directory", "max_age_seconds", "max_file_bytes", "max_series"},
}
NODE_STATE_KEYS: dict[str, frozenset[str]] = {
    "slurm": _COMMON | {"mode", "command", "max_output_bytes"},
    "kubernetes": _COMMON | _K8S | {"tolerated_taints"},
}


def check_nested(cfg: Mapping[str, Any]) -> None:
    """Every nested section's keys, named in one line when wrong."""
    for section in ("auth", "registrations", "hostnames"):
        value = cfg.get(section)
        if not isinstance(value, Mapping):
            raise ConfigError(f"{section} must be a mapping")
        check_section(value, frozenset(DEFAULTS[section]), section)
    for group, known in (("sources", SOURCE_KEYS), ("node_state", NODE_STATE_KEYS)):
        for kind, section in (cfg.get(group) or {}).items():
            if kind in known and isinstance(section, Mapping):
                check_section(section, known[kind], f"{group}.{kind}")


def registration_limits(cfg: Mapping[str, Any]) -> tuple[int, int, int]:
    """``registrations.max_entries``, ``max_series`` and ``max_series_per_token``."""
    section = cfg["registrations"]
    return (positive_int(section, "max_entries", 100000, "registrations"),
            positive_int(section, "max_series", 180000, "registrations"),
            positive_int(section, "max_series_per_token", 1000, "registrations"))


def build_sources(cfg: Mapping[str, Any], secrets: list[str]) -> list[Source]:
    """The enabled sources, each validated; a bad section raises ConfigError."""
    sections = cfg.get("sources") or {}
    if not isinstance(sections, Mapping):
        raise ConfigError("sources must be a mapping")
    unknown = set(sections) - {"slurm", "wandb", "kubernetes", "files"}
    if unknown:
        raise ConfigError(f"unknown sources: {', '.join(sorted(unknown))}")
    sources: list[Source] = []
    for kind in ("slurm", "wandb", "kubernetes", "files"):
        section = sections.get(kind) or {}
        if not isinstance(section, Mapping):
            raise ConfigError(f"sources.{kind} must be a mapping")
        if not section.get("enabled"):
            continue
        if kind == "slurm":
            sources.append(SlurmSource(section))
        elif kind == "wandb":
            source = WandbRunsSource(section)
            secrets.append(source.api_key)
            sources.append(source)
        elif kind == "kubernetes":
            k8s = KubernetesSource(section)
            secrets.append(k8s.api.token or "")
            sources.append(k8s)
        else:
            sources.append(RegistrationFilesSource(section, registration_limits(cfg)[1]))
    names = [s.name for s in sources]
    if len(set(names)) != len(names) or REGISTRATION_SOURCE in names:
        raise ConfigError(f"source names must be unique and not '{REGISTRATION_SOURCE}'")
    return sources


def node_state_sources(cfg: Mapping[str, Any], merger: PlacementMerger, grace: float,
                       secrets: list[str]) -> list[Source]:
    """The enabled node-state pollers, each publishing through the merger."""
    sections = cfg.get("node_state") or {}
    if not isinstance(sections, Mapping) or set(sections) - {"slurm", "kubernetes"}:
        raise ConfigError("node_state must be a mapping with slurm and/or kubernetes")
    out: list[SlurmNodeSource | KubernetesNodeSource] = []
    slurm = sections.get("slurm") or {}
    if slurm.get("enabled"):
        out.append(SlurmNodeSource(slurm, merger.mapper, grace))
    k8s = sections.get("kubernetes") or {}
    if k8s.get("enabled"):
        inherited = {k: v for k, v in ((cfg.get("sources") or {}).get("kubernetes") or {}).items()
                     if k in _K8S_CONNECTION}
        k8s_source = KubernetesNodeSource({**inherited, **k8s}, merger.mapper, grace)
        secrets.append(k8s_source.api.token or "")
        out.append(k8s_source)
    for source in out:
        merger.add_node_states(source.states)
    return list(out)


_K8S_CONNECTION = ("in_cluster", "kubeconfig", "api_server", "token", "token_file", "ca_file",
                   "insecure_skip_tls_verify", "timeout_seconds", "page_size")


def build(cfg: Mapping[str, Any]) -> tuple[web.Application, list[str]]:
    """The app from a loaded config, plus the secrets the log must never show."""
    check_nested(cfg)
    try:
        return _build(cfg)
    except ConfigError:
        raise
    except (TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"a value has the wrong type: {exc}") from exc


def _build(cfg: Mapping[str, Any]) -> tuple[web.Application, list[str]]:
    secrets: list[str] = []
    auth = cfg.get("auth") or {}
    token = read_secret(auth.get("token"), auth.get("token_file"), "auth token")
    if token:
        secrets.append(token)
    mapper = HostnameMapper.from_config(cfg.get("hostnames") or {})
    bound = host_tokens(auth.get("host_tokens") or [], secrets, mapper)
    reg_cfg = cfg["registrations"]
    default_ttl = float(reg_cfg.get("default_ttl_seconds", 600))
    max_ttl = float(reg_cfg.get("max_ttl_seconds", 30 * 86400))
    if not 0 < default_ttl <= max_ttl:
        raise ConfigError("registrations.default_ttl_seconds must be in (0, max_ttl_seconds]")
    grace = float(cfg["grace_seconds"])
    if grace < 0:
        raise ConfigError("grace_seconds must be >= 0")
    entries, series, per_token = registration_limits(cfg)
    store = RegistrationStore(max_entries=entries, max_series=series,
                              max_series_per_owner=per_token)
    live = [(REGISTRATION_SOURCE, store.active)] if reg_cfg.get("enabled", True) else []
    merger = PlacementMerger(mapper, grace_seconds=grace, live_sources=live,
                             live_version=store.version)
    sources = build_sources(cfg, secrets) + node_state_sources(cfg, merger, grace, secrets)
    if len({s.name for s in sources}) != len(sources):
        raise ConfigError("node_state source names must differ from the run sources' names")
    for source in sources:
        if not source.interval > 0:
            raise ConfigError(f"source {source.name}: interval_seconds must be > 0")
    require_token(str(cfg["listen"]), bool(token or bound), bool(reg_cfg.get("enabled", True)))
    app = build_app(merger, store, sources, token=token, default_ttl=default_ttl,
                    max_ttl=max_ttl, registrations=bool(reg_cfg.get("enabled", True)),
                    host_tokens=bound)
    return app, secrets


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, load the config, serve until interrupted."""
    parser = argparse.ArgumentParser(prog="wandb-infra-exporter", description=HELP,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", metavar="FILE",
                        help="YAML configuration file (optional; defaults + environment otherwise)")
    parser.add_argument("--check-config", action="store_true",
                        help="validate the configuration, print the effective listen address, exit")
    parser.add_argument("--web.listen-address", dest="listen_address", metavar="HOST:PORT",
                        help="address to serve on, as Prometheus exporters name it (overrides "
                             "'listen' in the config)")
    parser.add_argument("--web.config.file", dest="web_config", metavar="FILE",
                        help="TLS and basic auth in the Prometheus exporter-toolkit format "
                             "(tls_server_config, basic_auth_users with bcrypt hashes of cost "
                             "<= 12); basic auth guards /, /metrics and /healthz")
    args = parser.parse_args(argv)
    try:
        web_config = webconfig.load(args.web_config) if args.web_config else webconfig.WebConfig()
        cfg = load_config(args.config, DEFAULTS, ENV_PREFIX)
        if args.listen_address:
            cfg["listen"] = args.listen_address
        host, port = parse_listen(cfg["listen"])
        app, secrets = build(cfg)
        idle = cfg["idle_timeout_seconds"]
        if isinstance(idle, bool) or not isinstance(idle, int | float) or idle <= 0:
            raise ConfigError("idle_timeout_seconds must be a number > 0")
    except ConfigError as exc:
        print(f"wandb-infra-exporter: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        enabled = [k for k, v in (cfg.get("sources") or {}).items() if (v or {}).get("enabled")]
        print(f"configuration ok; would listen on {host}:{port}; "
              f"polled sources: {', '.join(enabled) or 'none'}")
        return 0
    setup_logging(str(cfg.get("log_level", "info")), secrets)
    logging.getLogger(__name__).info("starting", extra=log_fields(listen=f"{host}:{port}"))
    # aiohttp arms this timeout at connect too, so idle sockets cannot pile up to the
    # file-descriptor limit (its default keeps them for an hour).
    app.middlewares.append(web_config.middleware())
    try:
        web.run_app(app, host=host, port=port, print=None, access_log=None,
                    keepalive_timeout=float(idle), ssl_context=web_config.tls)
    except OSError as exc:  # the port is taken, or the address is not this host's
        print(f"wandb-infra-exporter: cannot listen on {host}:{port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
