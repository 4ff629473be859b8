"""A bound on open connections, so a flood of idle sockets can never use up the file descriptors
the store and W&B delivery need, nor starve Alertmanager.

At the limit a new connection evicts the one idle longest; only when every connection is serving
a request is the new one closed at once. A request the ``evictable`` rule names (a stranger's
body being read: ``POST /login``) does not make its connection busy, so slow bodies can never
hold every connection against Alertmanager. Built on public interfaces only: asyncio's protocol
API around the ``web.Server`` a runner exposes, and a middleware marking busy connections.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.common.logsetup import log_fields

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def connection_limit(configured: int) -> int:
    """The configured limit, but at most half the descriptors this process may open."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return configured if soft == resource.RLIM_INFINITY else min(configured, soft // 2)


class _Refused(asyncio.Protocol):
    """A connection beyond the limit: closed at once, so it holds its descriptor for no time."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, asyncio.Transport):
            transport.abort()
        else:
            transport.close()


class _Counted(asyncio.Protocol):
    """One accepted connection: forwards every protocol event to aiohttp's handler and tells
    the limiter when it opens and closes."""

    def __init__(self, limiter: ConnectionLimiter, inner: asyncio.Protocol) -> None:
        self.limiter = limiter
        self.inner = inner
        self.transport: asyncio.BaseTransport | None = None
        self.busy = 0  # requests in progress (aiohttp serves one at a time per connection)
        self.evicted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if self.evicted:  # evicted between accept and connect: never handed to aiohttp
            transport.close()
            return
        self.limiter.connected(self)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.limiter.release(self):
            self.inner.connection_lost(exc)

    def close(self) -> None:
        """Evict: closed now if connected, else as soon as asyncio connects it."""
        self.evicted = True
        if self.transport is not None:
            self.transport.close()


class ConnectionLimiter:
    """Counts connections from the moment their protocol is created (asyncio accepts a burst
    before any ``connection_made`` runs), oldest-idle first."""

    def __init__(self, limit: int, metrics: BridgeMetrics,
                 evictable: Callable[[web.Request], bool] = lambda _request: False) -> None:
        self.limit, self.metrics, self.evictable = limit, metrics, evictable
        self._open: dict[_Counted, None] = {}  # least recently used first
        self._by_transport: dict[asyncio.BaseTransport, _Counted] = {}  # handed to aiohttp
        self._last_warning = 0.0

    def factory(self, server: Callable[[], asyncio.Protocol]
                ) -> Callable[[], asyncio.BaseProtocol]:
        """A protocol factory for ``loop.create_server`` around aiohttp's ``web.Server``."""
        def protocol() -> asyncio.BaseProtocol:
            if len(self._open) < self.limit or self._evict_idle():
                conn = _Counted(self, server())
                self._open[conn] = None
                return conn
            self.metrics.connections_refused.inc()
            if time.monotonic() - self._last_warning > 60:  # one line a minute, not per socket
                self._last_warning = time.monotonic()
                log.warning("connection limit reached and every connection busy, refusing "
                            "new connections", extra=log_fields(limit=self.limit))
            return _Refused()
        return protocol

    def _evict_idle(self) -> bool:
        """Close the connection idle longest; False if every one is serving a request."""
        for conn in self._open:
            if not conn.busy:
                del self._open[conn]
                conn.close()
                self.metrics.connections_evicted.inc()
                return True
        return False

    def connected(self, conn: _Counted) -> None:
        """``conn`` is connected and handed to aiohttp."""
        assert conn.transport is not None
        self._by_transport[conn.transport] = conn

    def release(self, conn: _Counted) -> bool:
        """``conn`` closed; True when aiohttp had it (and must hear of the loss)."""
        self._open.pop(conn, None)
        return conn.transport is not None and self._by_transport.pop(conn.transport,
                                                                     None) is not None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Busy while the handler runs (reading the body included), unless the request is
        ``evictable``; used most recently after."""
        conn = self._by_transport.get(request.transport) if request.transport else None
        if conn is None or self.evictable(request):
            return await handler(request)
        conn.busy += 1
        try:
            return await handler(request)
        finally:
            conn.busy -= 1
            if conn in self._open:  # now the most recently used
                del self._open[conn]
                self._open[conn] = None
