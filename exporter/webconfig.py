"""``--web.config.file``: TLS and basic auth in the Prometheus exporter-toolkit's format, so the
exporter is configured like node_exporter and dcgm-exporter::

    tls_server_config:
      cert_file: /etc/wandb-infra-exporter/tls.crt
      key_file: /etc/wandb-infra-exporter/tls.key
      client_ca_file: /etc/wandb-infra-exporter/ca.crt   # optional
      client_auth_type: RequireAndVerifyClientCert       # optional
      min_version: TLS12                                  # optional
    basic_auth_users:
      prometheus: $2y$10$...                              # bcrypt hash (htpasswd -nB)

Basic auth guards what Prometheus and people read (``/``, ``/metrics``, ``/healthz``); the
registration API keeps its bearer tokens. Unknown keys are refused, as the toolkit does.

bcrypt is slow by design, so checks run on one thread of their own, never on the event loop or
the pool that renders /metrics, and a scraper whose header was verified once is answered at once.
The checks waiting are served fewest failures first: a client (its IPv4 address or IPv6 /64)
whose checks never failed, such as the scraper of a restarted exporter whose header is not
verified yet, waits for at most the one check running, however many password guessers queue
behind it (before, in arrival order, it waited for one check per guessing client: with 16
guessers at cost 10 that was seconds, and with 64 at cost 12 longer than a scrape timeout).
Each client has at most one check waiting, and at most ``MAX_PENDING`` wait in all (beyond that
503 with ``Retry-After``). A header that failed is remembered (``MAX_REFUSED``) and refused
without bcrypt. Hashes above cost ``MAX_COST`` are refused at start, and unknown users are
checked against a dummy hash of the highest configured cost, so the time taken does not tell
which user names exist.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import heapq
import itertools
import re
import ssl
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.netaddr import client_key

_TLS_KEYS = frozenset({"cert_file", "key_file", "client_ca_file", "client_auth_type",
                       "min_version", "max_version"})
_CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "RequestClientCert": ssl.CERT_OPTIONAL,
                "RequireAnyClientCert": ssl.CERT_REQUIRED, "VerifyClientCertIfGiven":
                ssl.CERT_OPTIONAL, "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
             "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
GUARDED = ("/", "/metrics", "/healthz")
# 2^12 rounds take about 0.4 s per check here; more would time out a first scrape.
MAX_COST = 12
MAX_PENDING = 64
MAX_VERIFIED = 256
MAX_REFUSED = 4096
_BCRYPT = re.compile(r"\$2[abxy]?\$(\d\d)\$[./A-Za-z0-9]{53}")


class _Checks:
    """The password-check thread, its queue (fewest failures of the client first, then
    arrival) and its bookkeeping (mutable state of a frozen config)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queued = threading.Condition(self.lock)
        self.queue: list[tuple[int, int, str, Callable[[], bool], Future[bool]]] = []
        self.arrivals = itertools.count()
        self.thread: threading.Thread | None = None
        self.pending: set[str] = set()  # clients with a check queued or running
        self.failures: dict[str, int] = {}  # client -> checks of it that failed
        self.verified: set[bytes] = set()
        self.refused: set[bytes] = set()

    def submit(self, client: str, check: Callable[[], bool]) -> Future[bool] | None:
        """Queue ``check`` for ``client``; None when it has one waiting or too many wait."""
        future: Future[bool] = Future()
        with self.lock:
            if client in self.pending or len(self.pending) >= MAX_PENDING:
                return None
            self.pending.add(client)
            heapq.heappush(self.queue, (self.failures.get(client, 0), next(self.arrivals),
                                        client, check, future))
            if self.thread is None:
                self.thread = threading.Thread(target=self._serve, name="basic-auth",
                                               daemon=True)
                self.thread.start()
            self.queued.notify()
        return future

    def _serve(self) -> None:
        while True:
            with self.lock:
                while not self.queue:
                    self.queued.wait()
                _failures, _arrival, client, check, future = heapq.heappop(self.queue)
            try:
                ok = check()
            except Exception as exc:  # handed to the waiter, never lost here
                with self.lock:
                    self.pending.discard(client)
                future.set_exception(exc)
                continue
            with self.lock:
                # counted down when the work ends, not when the waiter stops waiting: a client
                # that hangs up cannot leave more checks queued than the bound
                self.pending.discard(client)
                if not ok:
                    if len(self.failures) >= MAX_REFUSED:
                        self.failures.clear()
                    self.failures[client] = self.failures.get(client, 0) + 1
            future.set_result(ok)


@dataclass(frozen=True)
class WebConfig:
    """What the web config file asks for: a TLS context and bcrypt-hashed users."""

    tls: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    # SHA-256 digests of headers already verified: bcrypt costs tens of milliseconds by design,
    # which a scrape every few seconds should pay once, not every time (as exporter-toolkit).
    _checks: _Checks = field(default_factory=_Checks, compare=False, repr=False)
    _dummy: bytes = field(default=b"", compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.users and not self._dummy:
            cost = max(int(h.split(b"$")[2]) for h in self.users.values())
            object.__setattr__(self, "_dummy", bcrypt.hashpw(b"not a password",
                                                             bcrypt.gensalt(rounds=cost)))

    async def allows(self, header: str | None, client: str = "") -> bool | None:
        """Whether ``Authorization: Basic ...`` names a user with the right password (bcrypt
        on the check thread); None when ``client`` already has a check waiting or too many
        wait in all."""
        if not header or not header.startswith("Basic "):
            return False
        checks = self._checks
        digest = hashlib.sha256(header.encode("utf-8", "surrogateescape")).digest()
        if digest in checks.verified:
            return True
        if digest in checks.refused:
            return False
        future = checks.submit(client, lambda: self._check(header))
        if future is None:
            return None
        ok = await asyncio.wrap_future(future)
        self._remember(digest, ok)
        return ok

    def _remember(self, digest: bytes, ok: bool) -> None:
        known, bound = ((self._checks.verified, MAX_VERIFIED) if ok
                        else (self._checks.refused, MAX_REFUSED))
        if len(known) >= bound:
            known.clear()
        known.add(digest)

    def _check(self, header: str) -> bool:
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(
                ":")
        except ValueError:  # binascii.Error, non-ASCII header text, non-UTF-8 credentials
            return False
        hashed = self.users.get(user)
        # unknown users pay for a hash of the highest configured cost: no timing oracle
        return bcrypt.checkpw(password.encode(), hashed or self._dummy) and hashed is not None

    def middleware(self) -> Middleware:
        """An aiohttp middleware asking for basic auth on the read endpoints."""
        @web.middleware
        async def basic_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
            if self.users and request.path in GUARDED:
                ok = await self.allows(request.headers.get("Authorization"),
                                       client_key(request.remote))
                if ok is None:
                    return web.Response(status=503, text="503 too many password checks at "
                                        "once\n", headers={"Retry-After": "1"})
                if not ok:
                    return web.Response(status=401, text="401 Unauthorized\n", headers={
                        "WWW-Authenticate": 'Basic realm="wandb-infra"'})
            return await handler(request)
        return basic_auth


def _tls(section: Mapping[str, Any], base: Path) -> ssl.SSLContext:
    unknown = sorted(set(section) - _TLS_KEYS)
    if unknown:
        raise ConfigError(f"web config: unknown key tls_server_config.{unknown[0]}")
    if not section.get("cert_file") or not section.get("key_file"):
        raise ConfigError("web config: tls_server_config needs cert_file and key_file")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(base / str(section["cert_file"]), base / str(section["key_file"]))
        if section.get("client_ca_file"):
            context.load_verify_locations(base / str(section["client_ca_file"]))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"web config: cannot load TLS files: {exc}") from exc
    mode = str(section.get("client_auth_type") or "NoClientCert")
    if mode not in _CLIENT_AUTH:
        raise ConfigError(f"web config: client_auth_type must be one of {sorted(_CLIENT_AUTH)}")
    context.verify_mode = _CLIENT_AUTH[mode]
    for key, attr in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
        if section.get(key):
            if section[key] not in _VERSIONS:
                raise ConfigError(f"web config: {key} must be one of {sorted(_VERSIONS)}")
            setattr(context, attr, _VERSIONS[section[key]])
    return context


def load(path: str) -> WebConfig:
    """The web config file; relative paths in it are relative to the file, as in the toolkit."""
    file = Path(path)
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read web config {file}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ConfigError(f"web config {file} must be a mapping")
    unknown = sorted(set(data) - {"tls_server_config", "basic_auth_users", "http_server_config"})
    if unknown:
        raise ConfigError(f"web config: unknown key {unknown[0]}")
    tls = data.get("tls_server_config")
    users = data.get("basic_auth_users") or {}
    if not isinstance(users, Mapping) or not all(
            isinstance(u, str) and isinstance(h, str) and h.startswith("$2") for u, h in
            users.items()):
        raise ConfigError("web config: basic_auth_users maps user names to bcrypt hashes ($2...)")
    for user, hashed in users.items():
        match = _BCRYPT.fullmatch(hashed)
        if not match:
            raise ConfigError(f"web config: basic_auth_users.{user} is not a bcrypt hash")
        if int(match.group(1)) > MAX_COST:
            raise ConfigError(f"web config: basic_auth_users.{user} has bcrypt cost "
                              f"{match.group(1)}, above {MAX_COST}: every check would hold the "
                              f"check thread for seconds; hash it again with htpasswd -nbBC 10")
    return WebConfig(_tls(tls, file.parent) if isinstance(tls, Mapping) else None,
                     {u: h.encode() for u, h in users.items()})
