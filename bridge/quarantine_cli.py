"""``wandb-infra-bridge quarantine``: the one process that drains or cordons nodes.

The receiver (``serve``) parses untrusted webhook bodies and serves pages, so it holds no
scheduler rights: it only shows, in each issue, what this process decided. This process reads
the bridge's store (the alerts the receiver acknowledged), decides with the same restart
decision (``diagnosis/verdict.py``: only faults that need the node out of service) on the alerts
Prometheus confirms it raised (through the run service, in its own small loop), and acts through
its own credentials (an ``scontrol`` operator account, or a Kubernetes token allowed to ``patch
nodes``), writing every decision to the audit log both read.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from wandb_infra.bridge.config import load
from wandb_infra.bridge.ingest.store import Store, StoreError, StoreTooNew
from wandb_infra.bridge.projection.delivery import run_service
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.quarantine.actuator import Quarantine, QuarantineError
from wandb_infra.bridge.quarantine.actuator import build as build_quarantine
from wandb_infra.bridge.runs.service import RunService, offer_to_quarantine
from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.logsetup import log_fields, setup_logging

log = logging.getLogger(__name__)


def build(config: str | None) -> tuple[RunService, Quarantine]:
    """The run service (reading the bridge's store, confirming with Prometheus) and the acting
    quarantine; ConfigError when the quarantine is not enabled (there would be nothing to do)
    or no Prometheus is configured (nothing could be confirmed, and an alert Prometheus did not
    raise must never drain a node)."""
    cfg = load(config, insecure_no_auth=True)  # it serves nothing: webhook credentials unused
    if not cfg.policy.quarantine or not cfg.policy.quarantine.get("enabled"):
        raise ConfigError("quarantine.enabled is false: this process would have nothing to do")
    prom = cfg.raw["prometheus"]
    if not prom["url"]:
        raise ConfigError("prometheus.url is not set: the quarantine acts only on alerts "
                          "Prometheus confirms it raised, and without it can confirm none")
    store = Store(cfg.store_path)
    quarantine = build_quarantine(cfg.policy.quarantine, Path(store.path).resolve().parent,
                                  acting=True)
    assert quarantine is not None
    runs = run_service(store, PrometheusClient(str(prom["url"]), float(prom["timeout_seconds"])),
                       replace(cfg.policy, confirm_alerts=True), quarantine, wandb_enabled=False)
    return runs, quarantine


def _reset(config: str | None) -> int:
    """Reset the breaker's total cap (one line saying how many nodes it had counted); needs
    only the audit log, not the scheduler or Prometheus."""
    try:
        cfg = load(config, insecure_no_auth=True)
        quarantine = build_quarantine(cfg.policy.quarantine,
                                      Path(cfg.store_path).resolve().parent, acting=False)
        if quarantine is None:
            raise ConfigError("quarantine.enabled is false: there is no breaker to reset")
        decision = quarantine.reset_breaker()
    except QuarantineError as exc:
        print(f"wandb-infra-bridge quarantine: {exc}", file=sys.stderr)
        return 2
    print(decision.detail)
    return 0


def _run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, [])
    if args.reset_breaker:
        return _reset(args.config)
    try:
        runs, quarantine = build(args.config)
    except StoreTooNew as exc:
        print(f"wandb-infra-bridge quarantine: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while True:
        try:
            offer_to_quarantine(runs, quarantine, time.time())
        except StoreError as exc:
            log.error("store unreadable; trying again", extra=log_fields(error=str(exc)))
        if args.once or stop.wait(args.interval):
            return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``quarantine`` on the bridge's command line."""
    p = sub.add_parser(
        "quarantine", help="drain or cordon the nodes of faults that need them out of service",
        description="The quarantine as its own process, with its own scheduler credentials: "
                    "reads the bridge's store, offers each open critical issue whose fault needs "
                    "the node out of service (and has not had it) to the quarantine "
                    "(quarantine.* settings: breaker, dry run, audit log), and acts. The "
                    "receiver (serve) never acts; it shows the audit log's decisions.")
    p.add_argument("--config", metavar="FILE", help="the bridge's YAML configuration (the same "
                                                    "file serve reads: store.path, prometheus.*, "
                                                    "restart_policy.*, quarantine.*)")
    p.add_argument("--interval", type=float, default=60.0,
                   help="seconds between passes (default 60)")
    p.add_argument("--reset-breaker", action="store_true",
                   help="reset the circuit breaker's total cap (quarantine.max_total) after "
                        "an operator has looked at the nodes it took out, then exit")
    p.add_argument("--once", action="store_true", help="one pass, then exit (cron, tests)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="log level (JSON lines on stderr)")
    p.set_defaults(func=_run)
