"""Assembles the bridge from its configuration and runs it until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from aiohttp import web

from wandb_infra.bridge.config import BridgeConfig
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.store import Store, StoreError
from wandb_infra.bridge.ingest.store import lock as lock_store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryWorker, run_service
from wandb_infra.bridge.projection.markers import RunAxis, SdkMarkerWriter, startup_checks
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.web.connections import ConnectionLimiter, connection_limit
from wandb_infra.bridge.web.webhook import (
    BridgeContext,
    Credentials,
    PageAuth,
    create_app,
    unauthenticated_body,
)
from wandb_infra.common.logsetup import log_fields

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Bridge:
    """The HTTP side's context and the delivery worker that runs beside it."""

    ctx: BridgeContext
    worker: DeliveryWorker


def build(cfg: BridgeConfig) -> Bridge:
    """Store, W&B client (when a key is configured), worker and the pages' run service; only
    the worker holds a Prometheus client (pages show what it stored)."""
    raw = cfg.raw
    held = lock_store(cfg.store_path)  # one store, one active bridge (StoreLocked otherwise)
    store = Store(cfg.store_path, int(raw["store"]["min_free_bytes"]))
    store.lock_handle = held
    try:
        store.probe()
    except StoreError as exc:
        log.error("store not writable at start; answering 503 until it is",
                  extra=log_fields(error=str(exc)))
    metrics = BridgeMetrics()
    grafana = raw["grafana"]
    links = GrafanaLinks(str(grafana["base_url"] or ""), int(grafana["org_id"]),
                         timedelta(minutes=float(grafana["window_before_minutes"])),
                         timedelta(minutes=float(grafana["window_after_minutes"])))
    url, timeout = raw["prometheus"]["url"], float(raw["prometheus"]["timeout_seconds"])
    prom = PrometheusClient(str(url), timeout) if url else None  # the worker's alone
    client = markers = None
    wb = raw["wandb"]
    if cfg.secrets.wandb_api_key:
        client = WandbClient(str(wb["base_url"]), cfg.secrets.wandb_api_key,
                             float(wb["timeout_seconds"]))
        if wb["markers"]:
            steps = list(dict.fromkeys(wb["step_metrics"]))
            markers = SdkMarkerWriter(str(wb["base_url"]), cfg.secrets.wandb_api_key,
                                      Path(cfg.store_path).parent / "wandb-markers",
                                      axis=RunAxis(client, steps) if steps else None)
    startup_checks(client, markers is not None)
    worker = DeliveryWorker(store, client=client, markers=markers, links=links,
                            metrics=metrics, policy=cfg.policy, prometheus=prom)
    # the pages show what the worker stored: they never ask Prometheus
    runs = run_service(store, prom, cfg.policy, worker.quarantine,
                       wandb_enabled=client is not None, reads=False)
    return Bridge(BridgeContext(
        store=store, metrics=metrics, links=links, runs=runs,
        wake=worker.wake,
        credentials=Credentials(cfg.secrets.bearer_token, cfg.secrets.basic_username,
                                cfg.secrets.basic_password),
        webhook_path=cfg.webhook_path, max_body_bytes=cfg.max_body_bytes,
        public_pages=bool(raw["auth"]["public_pages"]),
        pages=PageAuth(cfg.secrets.pages_token, raw["auth"]["pages_accept_webhook_credentials"],
                       raw["auth"]["secure_cookie"]),
        body_timeout=cfg.body_timeout, max_inflight_bytes=cfg.max_inflight_bytes,
        max_login_reads=max(1, connection_limit(cfg.max_connections) // 8),
    ), worker)


async def serve(cfg: BridgeConfig, ready: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then stop the worker and close cleanly."""
    bridge = build(cfg)
    ctx, worker = bridge.ctx, bridge.worker
    # keepalive_timeout also bounds a new connection that never completes a request (aiohttp
    # arms it at connect), so idle sockets cannot pile up to the file-descriptor limit.
    limiter = ConnectionLimiter(connection_limit(cfg.max_connections), ctx.metrics,
                                evictable=unauthenticated_body)
    app = create_app(ctx)
    app.middlewares.append(limiter.middleware)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=cfg.idle_timeout)
    await runner.setup()
    assert runner.server is not None
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(limiter.factory(runner.server), cfg.host, cfg.port)
    worker.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("bridge listening", extra=log_fields(
        host=cfg.host, port=cfg.port, webhook=cfg.webhook_path,
        wandb="enabled" if cfg.secrets.wandb_api_key else "disabled (issues kept in /runs)",
        auth="enabled" if ctx.credentials.enabled else "DISABLED (local demo)"))
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("bridge stopping")
    listener.close()
    await runner.cleanup()
    await loop.run_in_executor(None, worker.stop)
