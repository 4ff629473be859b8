"""The exporter's HTTP side: /metrics, /healthz, the registration API, and the source pollers."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from aiohttp import web

from wandb_infra.common.commands import SourceError
from wandb_infra.common.logsetup import log_fields
from wandb_infra.exporter import __version__
from wandb_infra.exporter.collector import CONTENT_TYPE, Exposition
from wandb_infra.exporter.placements import PlacementMerger
from wandb_infra.exporter.pushed import (
    HOST_CHARS,
    RegistrationError,
    RegistrationStore,
    parse_registration,
    run_key,
)
from wandb_infra.exporter.sources import Source

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024
REGISTRATION_SOURCE = "registrations"
SAVE_SECONDS = 1.0  # registrations are saved at most this often (a kill -9 loses this much)
# Level 1: most of the size gain for a fraction of level 6's CPU on a multi-megabyte body.
GZIP_LEVEL = 1
LANDING_PAGE = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>wandb-infra-exporter</title></head>
<body><h1>wandb-infra-exporter {__version__}</h1>
<p>Publishes which W&amp;B run is on which host and GPU (<code>wandb_run_node_info</code>,
<code>wandb_run_gpu_info</code>, <code>wandb_run_pod_info</code>) for Prometheus.</p>
<ul><li><a href="metrics">/metrics</a></li><li><a href="healthz">/healthz</a></li>
<li><code>POST /v1/runs</code>,
<code>DELETE /v1/runs/&lt;entity&gt;/&lt;project&gt;/&lt;run_id&gt;</code> (bearer token)</li>
</ul></body></html>
"""


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def poll_forever(source: Source, merger: PlacementMerger) -> None:
    """Poll one source on its interval; nothing a source does can stop the loop."""
    loop = asyncio.get_running_loop()
    while True:
        started = time.monotonic()
        try:
            result = await loop.run_in_executor(None, source.poll)
            merger.record_success(source.name, result, time.monotonic() - started)
        except SourceError as exc:
            merger.record_failure(source.name, str(exc), time.monotonic() - started)
        except Exception as exc:  # a bug or garbage in one source must not kill the exporter
            log.exception("source crashed", extra=log_fields(source=source.name))
            merger.record_failure(source.name, f"{type(exc).__name__}: {exc}",
                                    time.monotonic() - started)
        await asyncio.sleep(max(0.05, source.interval - (time.monotonic() - started)))


@dataclass(frozen=True)
class HostToken:
    """A bearer token that may register and delete runs only on hosts matching ``hosts``, so a
    node holding its own token cannot register a fake run on, or delete the runs of, another
    node. The patterns match the canonical host key (what is stored and published): matching
    the name as sent let ``gpu-a01.rack-b.example.com`` pass ``*.rack-b.example.com`` and then
    become rack A's ``gpu-a01`` once the domain was stripped."""

    token: str = field(repr=False)
    hosts: tuple[str, ...]

    def allows(self, canonical: str) -> bool:
        """True when the canonical host key matches one of the patterns."""
        return any(fnmatchcase(canonical, pattern) for pattern in self.hosts)


def refuse_forgeable(request: web.Request) -> web.Response | None:
    """403 for what a web page could make a browser send, 415 for a body that is not JSON.

    Registrations come from programs (the prolog's curl, the client helper), which send neither
    ``Origin`` nor ``Sec-Fetch-*``; browsers send them on every POST and DELETE, including
    same-origin ones after DNS rebinding. JSON is required because an HTML form or a no-cors
    fetch can only send ``text/plain``, form or multipart bodies without a CORS preflight (which
    the exporter never grants). Both hold on loopback too, where no token may be configured."""
    sent = [h for h in request.headers if h.lower() == "origin" or h.lower().startswith(
        "sec-fetch-")]
    if sent:
        return _error(403, f"refused: sent by a web browser ({sent[0]} header); the "
                           "registration API accepts requests from programs only")
    has_body = request.body_exists or "Content-Type" in request.headers
    if (request.method == "POST" or has_body) and request.content_type != "application/json":
        return _error(415, "Content-Type must be application/json")
    return None


def _digest(value: str) -> bytes:
    # Digests: equal length whatever was sent (no length leak), and header bytes that are not
    # UTF-8 (kept as surrogates by aiohttp) cannot raise.
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


class Api:
    """Handlers sharing the merger, the registration store and the auth tokens."""

    def __init__(self, merger: PlacementMerger, store: RegistrationStore, token: str | None,
                 default_ttl: float, max_ttl: float, *,
                 host_tokens: Sequence[HostToken] = ()) -> None:
        self.merger, self.store = merger, store
        self.default_ttl, self.max_ttl = default_ttl, max_ttl
        self.exposition = Exposition()
        # (digest, None) grants every host; (digest, HostToken) only its hosts.
        self._grants: list[tuple[bytes, HostToken | None]] = [
            (_digest(t.token), t) for t in host_tokens]
        if token:
            self._grants.append((_digest(token), None))

    def _grant(self, request: web.Request) -> tuple[bool, HostToken | None]:
        """(authorised, the host-bound token used or None for every host)."""
        if not self._grants:
            return True, None
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        got = _digest(value.strip())
        found: tuple[bool, HostToken | None] = (False, None)
        for want, grant in self._grants:  # all compared, no early out
            if hmac.compare_digest(got, want):
                found = (True, grant)
        return (found[0] and scheme.lower() == "bearer"), found[1]

    async def metrics(self, request: web.Request) -> web.Response:
        """The exposition, built now; gzipped when the scraper accepts it (Prometheus does), as
        a 2,000-host cluster's join metrics shrink about thirtyfold."""
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(None, self.exposition.render, self.merger)
        headers = {"Content-Type": CONTENT_TYPE}
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            body = await loop.run_in_executor(None, gzip.compress, body, GZIP_LEVEL)
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    async def landing(self, _request: web.Request) -> web.Response:
        """What this endpoint is, with links (the exporter-toolkit convention)."""
        return web.Response(text=LANDING_PAGE, content_type="text/html")

    async def healthz(self, request: web.Request) -> web.Response:
        """Liveness plus each source's state (the process is healthy even if a source is down)."""
        snap = self.merger.snapshot()
        return web.json_response({
            "status": "ok", "runs": snap.runs, "hosts": snap.hosts,
            "sources": {s.name: {"up": s.up, "last_success": s.last_success,
                                 "errors": s.errors_total} for s in snap.sources},
        })

    async def register(self, request: web.Request) -> web.Response:
        """POST /v1/runs: add or refresh (heartbeat) one run on one host."""
        authorised, bound = self._grant(request)
        if not authorised:
            return _error(401, "missing or wrong bearer token")
        refused = refuse_forgeable(request)
        if refused is not None:
            return refused
        if request.content_length is not None and request.content_length > MAX_BODY:
            return _error(413, f"body larger than {MAX_BODY} bytes")
        try:
            raw = await request.content.read(MAX_BODY + 1)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            return _error(400, f"cannot read body: {exc}")
        if len(raw) > MAX_BODY:
            return _error(413, f"body larger than {MAX_BODY} bytes")
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            self.merger.count_error(REGISTRATION_SOURCE)
            return _error(400, f"body is not valid JSON: {exc}")
        except RecursionError:
            self.merger.count_error(REGISTRATION_SOURCE)
            return _error(400, "body is nested too deeply")
        try:
            placement, ttl = parse_registration(data, REGISTRATION_SOURCE, self.default_ttl,
                                                self.max_ttl)
        except RegistrationError as exc:
            self.merger.count_error(REGISTRATION_SOURCE)
            return _error(400, str(exc))
        placement = self.merger.canonical(placement)
        if bound is not None and not bound.allows(placement.host):
            return _error(403, f"this token may not register runs on {placement.host!r}")
        try:
            new = self.store.put(placement, ttl, owner=bound)
        except OverflowError as exc:
            return _error(503, str(exc))
        log.log(logging.INFO if new else logging.DEBUG, "run registered" if new else
                "run refreshed", extra=log_fields(run=placement.run.path(), host=placement.host))
        return web.json_response({"status": "registered" if new else "refreshed",
                                  "expires_in": ttl}, status=201 if new else 200)

    async def deregister(self, request: web.Request) -> web.Response:
        """DELETE /v1/runs/{entity}/{project}/{run_id}[?hostname=h]."""
        authorised, bound = self._grant(request)
        if not authorised:
            return _error(401, "missing or wrong bearer token")
        refused = refuse_forgeable(request)
        if refused is not None:
            return refused
        info = request.match_info
        run = run_key(info["entity"], info["project"], info["run_id"])
        if run is None:
            return _error(400, "entity, project or run_id has invalid characters or length")
        host = request.query.get("hostname")
        if host is not None and not HOST_CHARS.fullmatch(host):
            return _error(400, "'hostname' has invalid characters or length")
        canonical = None if host is None else self.merger.mapper(host)
        if bound is not None and (canonical is None or not bound.allows(canonical)):
            return _error(403, "this token may delete runs only with ?hostname= of its hosts")
        deleted = self.store.delete(run, canonical)
        log.info("run deregistered", extra=log_fields(run=run.path(), host=host, deleted=deleted))
        return web.json_response({"deleted": deleted})


def build_app(merger: PlacementMerger, store: RegistrationStore, sources: Sequence[Source] = (), *,
              token: str | None = None, default_ttl: float = 600.0,
              max_ttl: float = 30 * 86400.0, registrations: bool = True,
              host_tokens: Sequence[HostToken] = ()) -> web.Application:
    """The aiohttp application; pollers start and stop with it."""
    api = Api(merger, store, token, default_ttl, max_ttl, host_tokens=host_tokens)
    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_get("/", api.landing)
    app.router.add_get("/metrics", api.metrics)
    app.router.add_get("/healthz", api.healthz)
    if registrations:
        app.router.add_post("/v1/runs", api.register)
        app.router.add_delete("/v1/runs/{entity}/{project}/{run_id}", api.deregister)
    for source in sources:
        merger.add_source(source.name)

    async def pollers(_app: web.Application) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(poll_forever(s, merger)) for s in sources]
        yield
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def persist(_app: web.Application) -> AsyncIterator[None]:
        """Restore the saved registrations before serving; save changes once a second (off
        the loop), and once more at exit."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, store.restore)

        async def every_second() -> None:
            while True:
                await asyncio.sleep(SAVE_SECONDS)
                await loop.run_in_executor(None, store.save)

        task = asyncio.create_task(every_second())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await loop.run_in_executor(None, store.save)

    app.cleanup_ctx.append(pollers)
    if registrations and store.state_file is not None:
        app.cleanup_ctx.append(persist)
    return app
