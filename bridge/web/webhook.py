"""The HTTP face of the bridge (aiohttp): Alertmanager webhook, health, metrics, issue pages.

The webhook acknowledges (200) only after the store committed the notification; a store failure
answers 503 so Alertmanager retries. Bad requests get 400/401/413/415 with a reason and change
nothing. SQLite work runs in a one-thread executor per role (writes, reads) so the event loop
never blocks and writes are serialised; a notification is parsed and checked on the write thread
too, so only one at a time is held decoded (the others wait as bytes).
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from wandb_infra.bridge.ingest import identity
from wandb_infra.bridge.ingest.identity import UNATTRIBUTED, Identity
from wandb_infra.bridge.ingest.payload import Notification, PayloadError, parse_notification
from wandb_infra.bridge.ingest.store import IngestResult, Store, StoreError
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.runs.service import RunService
from wandb_infra.bridge.runs.text import render_text
from wandb_infra.bridge.runs.view import VERDICTS, GrafanaLinks
from wandb_infra.bridge.web import runbook as runbook_page
from wandb_infra.bridge.web.auth import Credentials, PageAuth
from wandb_infra.bridge.web.body import TooLarge, read_body
from wandb_infra.bridge.web.pages import broken_html, empty_html, login_html, run_html, runs_html
from wandb_infra.bridge.web.runpages import MAX_PAGE, RunPages
from wandb_infra.bridge.web.sessions import SESSION_SECONDS
from wandb_infra.catalog import runbook
from wandb_infra.common.labels import NAME_CHARS, RUN_ID_CHARS
from wandb_infra.common.logsetup import log_fields
from wandb_infra.common.netaddr import client_key
from wandb_infra.common.runkey import RunKey

log = logging.getLogger(__name__)

PAGE_COOKIE = "wandb_infra_pages"
MAX_LOGIN_BYTES = 4096
# A login form is a few hundred bytes: a client that has not sent it in 5 s is not typing it.
LOGIN_BODY_SECONDS = 5.0
RUN_STATES = ("", "open", "resolved")
RUN_VERDICTS = ("", *VERDICTS)


@dataclass
class BridgeContext:
    """Everything the handlers need; built by ``bridge.service``. Pages read runs through
    ``runs`` (a run service without Prometheus: it shows what the worker stored); ``wake``
    tells the worker new alerts arrived."""

    store: Store
    metrics: BridgeMetrics
    links: GrafanaLinks
    credentials: Credentials
    webhook_path: str
    max_body_bytes: int
    runs: RunService | None = None
    wake: Callable[[], None] | None = None
    public_pages: bool = False
    pages: PageAuth = field(default_factory=PageAuth)
    body_timeout: float = 30.0
    max_login_reads: int = 16
    max_inflight_bytes: int = 32 * 1024 * 1024
    write_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="bridge-store-write"))
    read_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="bridge-store-read"))


def _error(status: int, reason: str, headers: dict[str, str] | None = None, *,
           close: bool = False) -> web.Response:
    resp = web.json_response({"status": "error", "error": reason}, status=status,
                             headers=headers)
    if close:
        resp.force_close()
    return resp


def check_runs(notification: Notification) -> list[Identity]:
    """Each alert's identity (read once, for ``Store.ingest`` too), rejecting run addresses the
    exporter could never have published (``fullmatch``, so a trailing newline or a slash cannot
    make a second run or an unreachable /runs page)."""
    identities = identity.read_all(notification.alerts)
    # A notification names few runs: each distinct address is checked once.
    runs = [ident.run for ident in identities]
    bad = {run for run in set(runs) if run.attributed and not (
        NAME_CHARS.fullmatch(run.entity) and NAME_CHARS.fullmatch(run.project)
        and RUN_ID_CHARS.fullmatch(run.run_id))}
    if bad:
        index = next(i for i, run in enumerate(runs) if run in bad)
        raise PayloadError(f"alerts[{index}]: W&B entity, project or run id has invalid "
                           "characters or length")
    return identities


def _wants_json(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    return request.query.get("format") == "json" or (
        "application/json" in accept and "text/html" not in accept)


class Handlers:
    """Route handlers bound to one context."""

    def __init__(self, ctx: BridgeContext) -> None:
        self.ctx = ctx
        self.pages = RunPages(ctx.store, ctx.runs if ctx.runs is not None
                              else RunService(ctx.store))
        self.inflight_bytes = 0
        self.login_reads = 0

    def _unauthorised(self) -> web.Response:
        return _error(401, "missing or wrong credentials",
                      {"WWW-Authenticate": 'Basic realm="wandb-infra-bridge"'})

    async def webhook(self, request: web.Request) -> web.Response:
        """POST from Alertmanager: validate, store durably, then acknowledge."""
        ctx, m = self.ctx, self.ctx.metrics
        start = time.perf_counter()
        if not ctx.credentials.check(request.headers.get("Authorization")):
            m.notifications.labels("unauthorised").inc()
            return self._unauthorised()
        if request.content_type != "application/json":
            m.notifications.labels("unsupported_media_type").inc()
            return _error(415, "Content-Type must be application/json")
        if request.content_length is not None and request.content_length > ctx.max_body_bytes:
            m.notifications.labels("too_large").inc()
            return _error(413, f"body larger than {ctx.max_body_bytes} bytes")
        # A body costs several times its size while parsed and stored, so the bytes in flight
        # are bounded (by what each request announces); one request always fits.
        reserved = request.content_length or ctx.max_body_bytes
        if self.inflight_bytes and self.inflight_bytes + reserved > ctx.max_inflight_bytes:
            m.notifications.labels("busy").inc()
            return _error(503, "too many notifications in flight; retry", {"Retry-After": "5"})
        self.inflight_bytes += reserved
        m.inflight_bytes.set(self.inflight_bytes)
        try:
            return await self._receive(request, start)
        finally:
            self.inflight_bytes -= reserved
            m.inflight_bytes.set(self.inflight_bytes)

    async def _receive(self, request: web.Request, start: float) -> web.Response:
        """Read (within the body timeout), validate, store durably, acknowledge."""
        ctx, m = self.ctx, self.ctx.metrics
        try:
            async with asyncio.timeout(ctx.body_timeout):  # no extra task, unlike wait_for
                body = await read_body(request, ctx.max_body_bytes)
        except TimeoutError:
            m.notifications.labels("body_timeout").inc()
            return _error(408, f"body not received within {ctx.body_timeout:g} s", close=True)
        except TooLarge:
            m.notifications.labels("too_large").inc()
            return _error(413, f"body larger than {ctx.max_body_bytes} bytes")
        except (ValueError, OSError):
            m.notifications.labels("bad_request").inc()
            return _error(400, "could not read the request body")
        # The body is handed over (this coroutine keeps no reference) to the write thread, which
        # parses, checks and stores one notification at a time and drops the body once parsed:
        # notifications waiting for the store hold their bytes only, not their decoded objects.
        handed = [body]
        del body
        loop = asyncio.get_running_loop()
        try:
            result, notification = await loop.run_in_executor(ctx.write_pool, self._store,
                                                              handed)
        except PayloadError as exc:
            m.notifications.labels("bad_request").inc()
            return _error(400, str(exc))
        except StoreError as exc:
            m.notifications.labels("store_error").inc()
            m.store_ok.set(0)
            log.error("could not store notification; answering 503 so Alertmanager retries",
                      extra=log_fields(error=str(exc)))
            return _error(503, "notification could not be stored; retry",
                          {"Retry-After": "10"})
        m.store_ok.set(1)
        m.notifications.labels("stored").inc()
        m.alerts_received.inc(result.received)
        m.alerts_stored.inc(result.new)
        m.alerts_resolved.inc(result.resolved)
        m.duplicates.inc(result.duplicates)
        m.ack_seconds.observe(time.perf_counter() - start)
        if result.runs and ctx.wake is not None:
            ctx.wake()
        log.info("notification stored", extra=log_fields(
            receiver=notification.receiver[:100], alerts=result.received, new=result.new,
            resolved=result.resolved, duplicates=result.duplicates,
            truncated=notification.truncated_alerts))
        return web.json_response({"status": "ok", "received": result.received,
                                  "new": result.new, "resolved": result.resolved,
                                  "duplicates": result.duplicates})

    def _store(self, handed: list[bytearray]) -> tuple[IngestResult, Notification]:
        """On the write thread: parse, check and store the body ``handed`` over (emptied here,
        so the body is freed once parsed). Returns the notification without its alerts, for
        the log line."""
        notification = parse_notification(handed.pop())
        identities = check_runs(notification)
        result = self.ctx.store.ingest(notification, identities=identities)
        return result, replace(notification, alerts=[])

    async def healthz(self, _request: web.Request) -> web.Response:
        """Liveness: the process answers."""
        return web.json_response({"status": "ok"})

    async def readyz(self, _request: web.Request) -> web.Response:
        """Readiness: the store accepts a write right now. Unauthenticated, so it says ready or
        not and nothing else (the reason, with the store's path, goes to the log)."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.ctx.write_pool, self.ctx.store.probe)
        except StoreError as exc:
            self.ctx.metrics.store_ok.set(0)
            log.warning("not ready: store not writable", extra=log_fields(error=str(exc)))
            return web.json_response({"status": "not ready"}, status=503)
        self.ctx.metrics.store_ok.set(1)
        return web.json_response({"status": "ready"})

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus exposition of the bridge's own metrics; entity and project names only
        for a scrape with the webhook's or the pages' credentials (``PublicView``)."""
        ctx, header = self.ctx, request.headers.get("Authorization")
        named = ctx.public_pages or not ctx.credentials.enabled or (
            header is not None
            and bool(ctx.pages.check_header(header) | ctx.credentials.check(header)))
        if header is not None and not named:
            client = client_key(request.remote)
            if ctx.pages.limiter.retry_after(client) <= 0:
                ctx.pages.limiter.failed(client)
        data = generate_latest(ctx.metrics.registry if named else ctx.metrics.public)
        return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _pages_gate(self, request: web.Request) -> web.Response | None:
        """None when the request may read the pages, else its refusal. A live session cookie
        or a right ``Authorization`` header opens them whatever the limiter says: one client
        address may be a proxy shared with others, whose failures must not lock a right
        credential out. A header that opens nothing is a failed guess, counted with the login
        form's; a locked client gets 429 for it."""
        ctx = self.ctx
        if ctx.public_pages or ctx.pages.sessions.valid(request.cookies.get(PAGE_COOKIE)):
            return None
        header = request.headers.get("Authorization")
        if header is None:
            return self._pages_refused(request)
        if ctx.pages.check_header(header) | (ctx.pages.webhook_opens_pages
                                             and ctx.credentials.check(header)):
            return None
        return self._failed_guess(request, "page credentials") or self._pages_refused(request)

    def _failed_guess(self, request: web.Request, what: str) -> web.Response | None:
        """Count a wrong page credential against its client: 429 while the client is locked,
        else None (the caller refuses it)."""
        client = client_key(request.remote)
        wait = self.ctx.pages.limiter.retry_after(client)
        if wait > 0:
            return _throttled(wait)
        self.ctx.pages.limiter.failed(client)
        log.warning("%s refused", what, extra=log_fields(remote=client))
        return None

    def _pages_refused(self, request: web.Request) -> web.Response:
        """401: JSON for API clients; for a browser the login form, or (no page token) a page
        saying how to configure one, with the basic-auth prompt for the webhook's credentials."""
        if _wants_json(request):
            return self._unauthorised()
        configured = bool(self.ctx.pages.token)
        scheme = "Bearer" if configured else "Basic"
        return web.Response(status=401, text=login_html(request.path_qs, False, configured),
                            content_type="text/html",
                            headers={"WWW-Authenticate": f'{scheme} realm="wandb-infra-bridge"'})

    async def runs(self, request: web.Request) -> web.Response:
        """The issues column, newest first: ``?limit=&offset=`` paging, ``?entity=&project=``
        and ``?state=open|resolved`` filters."""
        if (refused := self._pages_gate(request)) is not None:
            return refused
        try:
            limit = int(request.query.get("limit", MAX_PAGE))
            offset = int(request.query.get("offset", 0))
        except ValueError:
            return _error(400, "limit and offset must be integers")
        if not (0 < limit <= MAX_PAGE and offset >= 0):
            return _error(400, f"limit must be 1-{MAX_PAGE} and offset >= 0")
        filters = {k: request.query.get(k, "")[:200]
                   for k in ("entity", "project", "state", "verdict")}
        if filters["state"] not in RUN_STATES:
            return _error(400, "state must be open or resolved")
        if filters["verdict"] not in RUN_VERDICTS:
            return _error(400, f"verdict must be one of {', '.join(VERDICTS)}")
        loop = asyncio.get_running_loop()
        try:
            rows, unattributed, more = await loop.run_in_executor(
                self.ctx.read_pool, self.pages.runs, limit, offset, filters)
        except StoreError as exc:
            return _error(503, str(exc))
        if _wants_json(request):
            page = {"runs": [r.as_dict(full_verdict=bool(filters["verdict"])) for r in rows],
                    "unattributed_alerts": unattributed, "offset": offset, "limit": limit}
            if more:
                page["next_offset"] = offset + limit
            return web.json_response(page)
        shown = {k: v for k, v in filters.items() if v}
        return web.Response(text=runs_html(rows, unattributed, filters=shown, offset=offset,
                                           limit=limit, more=more),
                            content_type="text/html")

    async def run(self, request: web.Request) -> web.Response:
        """The drawer of one run (or of the unattributed alerts)."""
        if (refused := self._pages_gate(request)) is not None:
            return refused
        info = request.match_info
        run = RunKey(info["entity"], info["project"], info["run_id"]) if info else UNATTRIBUTED
        title = run.path() if run.attributed else "Unattributed alerts"
        loop = asyncio.get_running_loop()
        try:
            view = await loop.run_in_executor(self.ctx.read_pool, self.pages.run, run)
        except StoreError as exc:
            return _error(503, str(exc))
        wants_json = _wants_json(request)
        if view is None:
            if wants_json:
                return _error(404, "no alerts and no verdict stored for this run")
            return web.Response(status=404, text=empty_html(title), content_type="text/html")
        link = self.ctx.links.for_run(run)
        if isinstance(view, str):
            return web.json_response({"entity": run.entity, "project": run.project,
                                      "run_id": run.run_id, "error": view, "issues": [],
                                      "wandb": {"state": "unknown"}}) if wants_json \
                else web.Response(text=broken_html(title, view), content_type="text/html")
        if wants_json:
            return web.json_response(view.as_dict(link))
        if request.query.get("format") == "text":  # what explain prints (the demo shows it)
            return web.Response(text=render_text(view, link))
        return web.Response(text=run_html(view, title, link), content_type="text/html")

    async def favicon(self, _request: web.Request) -> web.Response:
        """No icon: 204 so a browser's automatic request is not a console error."""
        return web.Response(status=204, headers={"Cache-Control": "max-age=86400"})

    async def login_form(self, request: web.Request) -> web.Response:
        """GET /login: the page-token form."""
        return web.Response(text=login_html(_next_path(request.query.get("next")), False,
                                            bool(self.ctx.pages.token)), content_type="text/html")

    async def login(self, request: web.Request) -> web.Response:
        """POST /login: a right token sets the HttpOnly, SameSite=Strict page cookie."""
        pages = self.ctx.pages
        if not pages.token:
            return _error(401, "no page token configured (auth.pages_token_file)")
        if (request.content_length or 0) > MAX_LOGIN_BYTES:
            return _error(413, f"login form larger than {MAX_LOGIN_BYTES} bytes")
        # A stranger's body: at most ``max_login_reads`` read at once (one connection in eight),
        # each within LOGIN_BODY_SECONDS, and counted against the same in-flight bound as
        # notifications, chunked or not, by the same bounded reader (aiohttp's post() buffered
        # a chunked body of any size). The connection limiter never counts it as busy.
        if self.login_reads >= self.ctx.max_login_reads or (
                self.inflight_bytes
                and self.inflight_bytes + MAX_LOGIN_BYTES > self.ctx.max_inflight_bytes):
            return _error(503, "busy; retry", {"Retry-After": "5"}, close=True)
        gauge = self.ctx.metrics.inflight_bytes
        self.inflight_bytes += MAX_LOGIN_BYTES
        self.login_reads += 1
        gauge.set(self.inflight_bytes)
        try:
            async with asyncio.timeout(min(self.ctx.body_timeout, LOGIN_BODY_SECONDS)):
                body = await read_body(request, MAX_LOGIN_BYTES)
        except TooLarge:
            return _error(413, f"login form larger than {MAX_LOGIN_BYTES} bytes")
        except TimeoutError:
            return _error(408, "login form not received in time", close=True)
        except (ValueError, OSError):
            return _error(400, "could not read the login form")
        finally:
            self.inflight_bytes -= MAX_LOGIN_BYTES
            self.login_reads -= 1
            gauge.set(self.inflight_bytes)
        try:
            fields = urllib.parse.parse_qs(bytes(body).decode("utf-8"), max_num_fields=10)
        except (UnicodeDecodeError, ValueError):
            return _error(400, "could not read the login form")
        form = {k: v[0] for k, v in fields.items()}
        target = _next_path(str(form.get("next", "")))
        if not pages.check_token(str(form.get("token", ""))):  # right: never throttled
            return self._failed_guess(request, "page login") or web.Response(
                status=401, text=login_html(target, True, True), content_type="text/html",
                headers={"WWW-Authenticate": 'Bearer realm="wandb-infra-bridge"'})
        resp = web.Response(status=303, headers={"Location": target})
        resp.set_cookie(PAGE_COOKIE, pages.sessions.issue(), max_age=SESSION_SECONDS, path="/",
                        httponly=True, samesite="Strict", secure=pages.secure(request))
        return resp

    async def logout(self, request: web.Request) -> web.Response:
        """POST /logout: ends this browser's session and clears its cookie (401 without a live
        session: there is nothing to end, and no route changes state for a stranger)."""
        cookie = request.cookies.get(PAGE_COOKIE)
        if not self.ctx.pages.sessions.valid(cookie):
            return _error(401, "no session to end")
        self.ctx.pages.sessions.end(cookie)
        resp = web.Response(status=303, headers={"Location": "/login"})
        resp.del_cookie(PAGE_COOKIE, path="/")
        return resp


def unauthenticated_body(request: web.Request) -> bool:
    """Whether ``request`` makes the bridge read a body from a stranger (the login form): the
    connection limiter may close it for a new connection, so the webhook is served first."""
    return request.method == "POST" and request.path == "/login"


def _throttled(wait: float) -> web.Response:
    """429 for a client whose guesses of the page token are throttled (sessions.py)."""
    return _error(429, "too many failed attempts at the page token; retry later",
                  {"Retry-After": str(max(1, round(wait)))})


def _next_path(value: str | None) -> str:
    """Where to go after login: only this bridge's pages (no open redirect), in printable ASCII
    (a CR or LF would make aiohttp drop the connection rather than send the ``Location``, so a
    crafted link would break the login; a browser sends the path percent-encoded anyway)."""
    if value and value.startswith(("/runs", "/unattributed")) and "\\" not in value \
            and value.isascii() and value.isprintable():
        return value
    return "/runs"


# On every response: no script, no framing, nothing foreign loaded, nothing cached (pages show
# issue data behind a login), no content sniffing.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' "
                               "data:; form-action 'self'; frame-ancestors 'none'; "
                               "base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
}


async def _security_headers(_request: web.Request, response: web.StreamResponse) -> None:
    for name, value in SECURITY_HEADERS.items():
        if name != "Cache-Control" or response.status != 204:  # the favicon's 204 may cache
            response.headers[name] = value


def create_app(ctx: BridgeContext) -> web.Application:
    """The aiohttp application (no server started)."""
    app = web.Application(client_max_size=ctx.max_body_bytes)
    app.on_response_prepare.append(_security_headers)
    h = Handlers(ctx)
    app.router.add_post(ctx.webhook_path, h.webhook)
    app.router.add_get("/healthz", h.healthz)
    app.router.add_get("/readyz", h.readyz)
    app.router.add_get("/metrics", h.metrics)
    app.router.add_get("/runs", h.runs)
    app.router.add_get("/runs/{entity}/{project}/{run_id}", h.run)
    app.router.add_get("/unattributed", h.run)
    app.router.add_get("/login", h.login_form)
    app.router.add_get("/favicon.ico", h.favicon)
    app.router.add_get(runbook.PATH, runbook_page.handle)
    app.router.add_post("/login", h.login)
    app.router.add_post("/logout", h.logout)

    async def _close(_app: web.Application) -> None:
        ctx.write_pool.shutdown(wait=True)
        ctx.read_pool.shutdown(wait=True)

    app.on_cleanup.append(_close)
    return app
