"""``wandb-infra-bridge``: the Alertmanager -> W&B bridge command line.

Subcommands: ``serve`` (the daemon), ``explain`` (post-mortem from Prometheus history),
``quarantine`` (the one process with scheduler rights), ``view`` (a saved W&B view with the
markers) and ``selftest`` (the W&B writes tried on a scratch run); each registers itself in
``SUBCOMMANDS`` with a function that adds its parser.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable
from dataclasses import replace

from wandb_infra.bridge.config import ENV_PREFIX, SCHEMA, BridgeConfig, load
from wandb_infra.bridge.explain_cli import add_parser as add_explain
from wandb_infra.bridge.ingest.store import StoreLocked, StoreTooNew
from wandb_infra.bridge.quarantine_cli import add_parser as add_quarantine
from wandb_infra.bridge.selftest_cli import add_parser as add_selftest
from wandb_infra.bridge.view_cli import add_parser as add_view
from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.logsetup import setup_logging

log = logging.getLogger("bridge")


def _options_epilog() -> str:
    lines = ["configuration keys (YAML file; override any with "
             f"{ENV_PREFIX}__SECTION__KEY=value, e.g. {ENV_PREFIX}__LISTEN__PORT=9461):"]
    lines += SCHEMA.help_lines()
    lines.append("secrets: prefer *_file keys; a value 'env:NAME' reads environment variable "
                 "NAME. See deploy/bridge.example.yaml.")
    return "\n".join(lines)


def _serve(args: argparse.Namespace) -> int:
    cfg = load(args.config, insecure_no_auth=args.insecure_local_demo)
    if args.host:
        cfg = replace(cfg, host=args.host)
    if args.port is not None:
        cfg = replace(cfg, port=args.port)
    setup_logging(args.log_level or str(cfg.raw["log_level"]), cfg.secrets.all())
    try:
        asyncio.run(serve_main(cfg))
    except (StoreLocked, StoreTooNew) as exc:  # one line, no traceback
        print(f"wandb-infra-bridge: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        log.error("cannot serve: %s", exc)
        return 1
    return 0


async def serve_main(cfg: BridgeConfig) -> None:
    """Import the server lazily so ``--help`` stays fast."""
    from wandb_infra.bridge.service import serve  # noqa: PLC0415 - keeps --help fast

    await serve(cfg)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="run the webhook receiver, issue pages and W&B delivery",
        description="Receive Alertmanager webhooks (v4), store them durably, diagnose root "
                    "causes per W&B run and project them onto the runs (tags, notes, summary, "
                    "plot markers). Without a W&B key the issues are served at /runs.",
        epilog=_options_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE",
                   help="YAML configuration file (defaults apply to missing keys)")
    p.add_argument("--host", help="override listen.host")
    p.add_argument("--port", type=int, help="override listen.port")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                   help="override log_level")
    p.add_argument("--insecure-local-demo", action="store_true",
                   help="allow starting WITHOUT webhook authentication (local demos only)")
    p.set_defaults(func=_serve)


SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_serve, add_explain, add_quarantine, add_view, add_selftest]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="wandb-infra-bridge",
        description="Alertmanager webhook -> durable issue store -> root-cause diagnosis -> "
                    "W&B runs (issues column, notes drawer, plot markers, Grafana links).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:  # bad input or configuration: one line, no traceback
        print(f"wandb-infra-bridge {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
