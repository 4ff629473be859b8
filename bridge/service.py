"""Assembles the bridge from its configuration and runs it until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from wandb_infra.bridge.config import BridgeConfig
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.identity import IdentityReader
from wandb_infra.bridge.ingest.store import Store, StoreError
from wandb_infra.bridge.ingest.store import lock as lock_store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryWorker
from wandb_infra.bridge.projection.markers import SdkMarkerWriter, startup_checks
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.prometheus.run_lookup import PrometheusRunLookup
from wandb_infra.bridge.web.webhook import BridgeContext, Credentials, PageAuth, create_app
from wandb_infra.common.logsetup import log_fields

log = logging.getLogger(__name__)


def build(cfg: BridgeConfig) -> BridgeContext:
    """Store, identity reader, W&B client and worker (when a key is configured), app context."""
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
    lookup = None
    if raw["prometheus"]["url"]:
        lookup = PrometheusRunLookup(PrometheusClient(
            str(raw["prometheus"]["url"]), float(raw["prometheus"]["timeout_seconds"])))
    client = markers = None
    wb = raw["wandb"]
    if cfg.secrets.wandb_api_key:
        client = WandbClient(str(wb["base_url"]), cfg.secrets.wandb_api_key,
                             float(wb["timeout_seconds"]))
        if wb["markers"]:
            markers = SdkMarkerWriter(str(wb["base_url"]), cfg.secrets.wandb_api_key,
                                      Path(cfg.store_path).parent / "wandb-markers")
    startup_checks(client, markers is not None)
    worker = DeliveryWorker(store, client=client, markers=markers, links=links,
                            metrics=metrics, policy=cfg.policy, lookup=lookup)
    return BridgeContext(
        store=store, reader=IdentityReader(raw["identity"]), metrics=metrics, links=links,
        credentials=Credentials(cfg.secrets.bearer_token, cfg.secrets.basic_username,
                                cfg.secrets.basic_password),
        webhook_path=cfg.webhook_path, max_body_bytes=cfg.max_body_bytes, worker=worker,
        public_pages=bool(raw["auth"]["public_pages"]),
        pages=PageAuth(cfg.secrets.pages_token, raw["auth"]["pages_accept_webhook_credentials"],
                       raw["auth"]["secure_cookie"]),
        incident_gap=timedelta(seconds=cfg.policy.incident_gap),
        body_timeout=cfg.body_timeout, max_inflight_bytes=cfg.max_inflight_bytes,
    )


class _Refused(asyncio.Protocol):
    """A connection beyond the limit: closed at once, so it holds its descriptor for no time."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, asyncio.Transport):
            transport.abort()
        else:
            transport.close()


class LimitedSite(web.TCPSite):
    """A TCP site that keeps at most ``limit`` connections, so a flood of idle sockets can never
    use up the file descriptors the store and W&B delivery need, nor starve Alertmanager: at
    the limit a new connection evicts the oldest one with no request in progress, and only when
    every connection is busy is the new one closed at once.

    Connections are counted from the moment their protocol is created (asyncio accepts a burst
    before any ``connection_made`` runs); one evicted before it is connected is closed as soon
    as it is."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, limit: int,
                 metrics: BridgeMetrics) -> None:
        super().__init__(runner, host, port)
        self.limit = limit
        self.metrics = metrics
        self._last_warning = 0.0
        self._open: dict[RequestHandler, None] = {}  # in creation order, oldest first
        self._doomed: set[RequestHandler] = set()  # evicted before they were connected

    def _evict_idle(self) -> bool:
        """Close the oldest connection that is not serving a request; False if all are."""
        for handler in self._open:
            # aiohttp sets _current_request while a handler runs (private, hence getattr).
            if getattr(handler, "_current_request", None) is None:
                del self._open[handler]
                if handler.transport is None:
                    self._doomed.add(handler)
                else:
                    handler.force_close()
                self.metrics.connections_evicted.inc()
                return True
        return False

    def _factory(self) -> Callable[[], asyncio.BaseProtocol]:
        server = self._runner.server
        assert server is not None
        registered, lost = server.connection_made, server.connection_lost

        def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
            registered(handler, transport)
            if handler in self._doomed:
                self._doomed.discard(handler)
                handler.force_close()

        def connection_lost(handler: RequestHandler, exc: BaseException | None = None) -> None:
            self._open.pop(handler, None)
            lost(handler, exc)
        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]

        def protocol() -> asyncio.BaseProtocol:
            if len(self._open) < self.limit or self._evict_idle():
                handler = server()
                self._open[handler] = None
                return handler
            self.metrics.connections_refused.inc()
            if time.monotonic() - self._last_warning > 60:  # one line a minute, not per socket
                self._last_warning = time.monotonic()
                log.warning("connection limit reached and every connection busy, refusing "
                            "new connections", extra=log_fields(limit=self.limit))
            return _Refused()
        return protocol

    async def start(self) -> None:
        """Like ``TCPSite.start`` with the limiting protocol factory."""
        await web.BaseSite.start(self)
        self._server = await asyncio.get_running_loop().create_server(
            self._factory(), self._host, self._port, backlog=self._backlog)


def connection_limit(configured: int) -> int:
    """The configured limit, but at most half the descriptors this process may open."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return configured if soft == resource.RLIM_INFINITY else min(configured, soft // 2)


async def serve(cfg: BridgeConfig, ready: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then stop the worker and close cleanly."""
    ctx = build(cfg)
    # keepalive_timeout also bounds a new connection that never completes a request (aiohttp
    # arms it at connect), so idle sockets cannot pile up to the file-descriptor limit.
    runner = web.AppRunner(create_app(ctx), access_log=None, keepalive_timeout=cfg.idle_timeout)
    await runner.setup()
    site = LimitedSite(runner, cfg.host, cfg.port, connection_limit(cfg.max_connections),
                       ctx.metrics)
    await site.start()
    if ctx.worker is not None:
        ctx.worker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
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
    await runner.cleanup()
    if ctx.worker is not None:
        await loop.run_in_executor(None, ctx.worker.stop)
