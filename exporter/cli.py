"""``wandb-infra-exporter``: publishes which W&B run is on which host and GPU for Prometheus.

Argument parsing and start-up; what the configuration may hold is ``exporter.config``'s."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from wandb_infra.common.configfile import ConfigError, read_secret
from wandb_infra.common.logsetup import log_fields, setup_logging
from wandb_infra.exporter import config, webconfig
from wandb_infra.exporter.hostnames import HostnameMapper
from wandb_infra.exporter.placements import Limits, PlacementMerger
from wandb_infra.exporter.pushed import RegistrationStore
from wandb_infra.exporter.server import REGISTRATION_SOURCE, build_app
from wandb_infra.exporter.sources import Source
from wandb_infra.exporter.sources.files import RegistrationFilesSource
from wandb_infra.exporter.sources.kubernetes import KubernetesSource
from wandb_infra.exporter.sources.nodestate import KubernetesNodeSource, SlurmNodeSource
from wandb_infra.exporter.sources.slurm import SlurmSource
from wandb_infra.exporter.sources.wandb_runs import WandbRunsSource


def build_sources(cfg: Mapping[str, Any], secrets: list[str]) -> list[Source]:
    """The enabled run sources of a resolved config (``config.resolve``)."""
    sections = cfg["sources"]
    sources: list[Source] = []
    if sections["slurm"]["enabled"]:
        sources.append(SlurmSource(sections["slurm"]))
    if sections["wandb"]["enabled"]:
        source = WandbRunsSource(sections["wandb"])
        secrets.append(source.api_key)
        sources.append(source)
    if sections["kubernetes"]["enabled"]:
        k8s = KubernetesSource(sections["kubernetes"])
        secrets.append(k8s.api.token or "")
        sources.append(k8s)
    if sections["files"]["enabled"]:
        sources.append(RegistrationFilesSource(sections["files"],
                                               cfg["registrations"]["max_series"]))
    names = [s.name for s in sources]
    if len(set(names)) != len(names) or REGISTRATION_SOURCE in names:
        raise ConfigError(f"source names must be unique and not '{REGISTRATION_SOURCE}'")
    return sources


def node_state_sources(cfg: Mapping[str, Any], merger: PlacementMerger, grace: float,
                       secrets: list[str]) -> list[Source]:
    """The enabled node-state pollers of a resolved config, each publishing through the
    merger."""
    sections = cfg["node_state"]
    out: list[SlurmNodeSource | KubernetesNodeSource] = []
    if sections["slurm"]["enabled"]:
        out.append(SlurmNodeSource(sections["slurm"], merger.mapper, grace))
    if sections["kubernetes"]["enabled"]:
        k8s_source = KubernetesNodeSource(sections["kubernetes"], merger.mapper, grace)
        secrets.append(k8s_source.api.token or "")
        out.append(k8s_source)
    for source in out:
        merger.add_node_states(source.states)
    return list(out)


def build(raw: Mapping[str, Any]) -> tuple[web.Application, list[str]]:
    """The app from a loaded (or raw) config, plus the secrets the log must never show."""
    cfg = config.resolve(raw)
    secrets: list[str] = []
    auth, reg_cfg = cfg["auth"], cfg["registrations"]
    token = read_secret(auth["token"], auth["token_file"], "auth token")
    if token:
        secrets.append(token)
    mapper = HostnameMapper.from_config(cfg["hostnames"])
    bound = config.host_tokens(auth["host_tokens"], secrets, mapper)
    grace = float(cfg["grace_seconds"])
    store = RegistrationStore(max_entries=reg_cfg["max_entries"],
                              max_series=reg_cfg["max_series"],
                              max_series_per_owner=reg_cfg["max_series_per_token"],
                              state_file=Path(reg_cfg["state_file"]) if reg_cfg["enabled"]
                              and reg_cfg["state_file"] else None)
    live = [(REGISTRATION_SOURCE, store.active)] if reg_cfg["enabled"] else []
    merger = PlacementMerger(mapper, grace_seconds=grace, live_sources=live,
                             live_version=store.version,
                             limits=Limits(**{k: int(v) for k, v in cfg["metadata"].items()}))
    sources = build_sources(cfg, secrets) + node_state_sources(cfg, merger, grace, secrets)
    if len({s.name for s in sources}) != len(sources):
        raise ConfigError("node_state source names must differ from the run sources' names")
    config.require_token(cfg["listen"], bool(token or bound), reg_cfg["enabled"])
    app = build_app(merger, store, sources, token=token,
                    default_ttl=float(reg_cfg["default_ttl_seconds"]),
                    max_ttl=float(reg_cfg["max_ttl_seconds"]), registrations=reg_cfg["enabled"],
                    host_tokens=bound)
    return app, secrets


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, load the config, serve until interrupted."""
    parser = argparse.ArgumentParser(prog="wandb-infra-exporter", description=config.HELP,
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
        cfg = config.load(args.config)
        if args.listen_address:
            cfg["listen"] = args.listen_address
        host, port = config.parse_listen(cfg["listen"])
        app, secrets = build(cfg)
    except ConfigError as exc:
        print(f"wandb-infra-exporter: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        enabled = [k for k, v in cfg["sources"].items() if v["enabled"]]
        print(f"configuration ok; would listen on {host}:{port}; "
              f"polled sources: {', '.join(enabled) or 'none'}")
        return 0
    setup_logging(cfg["log_level"], secrets)
    logging.getLogger(__name__).info("starting", extra=log_fields(listen=f"{host}:{port}"))
    # aiohttp arms this timeout at connect too, so idle sockets cannot pile up to the
    # file-descriptor limit (its default keeps them for an hour).
    app.middlewares.append(web_config.middleware())
    try:
        web.run_app(app, host=host, port=port, print=None, access_log=None,
                    keepalive_timeout=float(cfg["idle_timeout_seconds"]),
                    ssl_context=web_config.tls)
    except OSError as exc:  # the port is taken, or the address is not this host's
        print(f"wandb-infra-exporter: cannot listen on {host}:{port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
