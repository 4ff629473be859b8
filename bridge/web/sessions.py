"""Page sessions and login throttling: a cookie per login, which expires and can be signed out,
and a bound on how fast anyone may guess the page token.

A session id is 32 random bytes; only its SHA-256 and expiry are kept, in memory (a restart signs
everyone out, the safe direction). Failed guesses (the login form, or a wrong ``Authorization``
header) are counted per client (an IPv4 address or an IPv6 /64) in a sliding window; beyond the
limit a wrong guess gets 429. A right token is accepted from any client, throttled or not: one
address may be a shared proxy. The count across all clients is a backstop against guessing from
many addresses (one client stops at a tenth of it); tripping it is logged once.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from wandb_infra.common.logsetup import log_fields

log = logging.getLogger(__name__)

SESSION_SECONDS = 12 * 3600
MAX_SESSIONS = 10_000
FAILURES_PER_CLIENT = 10  # per WINDOW from one client
FAILURES_TOTAL = 100  # per WINDOW from everyone: a backstop, ten clients at their limit
WINDOW = 60.0


def digest(value: str) -> bytes:
    """A credential's SHA-256, compared instead of the credential (constant time, any length)."""
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


class Sessions:
    """Issued sessions by digest -> expiry (monotonic), oldest evicted past ``MAX_SESSIONS``."""

    def __init__(self, seconds: float = SESSION_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds, self.clock = seconds, clock
        self._lock = threading.Lock()
        self._live: OrderedDict[bytes, float] = OrderedDict()

    def issue(self) -> str:
        """A new session's cookie value."""
        value = secrets.token_urlsafe(32)
        with self._lock:
            self._live[digest(value)] = self.clock() + self.seconds
            while len(self._live) > MAX_SESSIONS:
                self._live.popitem(last=False)
        return value

    def valid(self, value: str | None) -> bool:
        """True for a live session's cookie (compared by digest, so in constant time)."""
        if not value:
            return False
        key = digest(value)
        with self._lock:
            expires = self._live.get(key)
            if expires is None:
                return False
            if expires <= self.clock():
                del self._live[key]
                return False
            return True

    def end(self, value: str | None) -> None:
        """Sign a session out (unknown values are ignored)."""
        if value:
            with self._lock:
                self._live.pop(digest(value), None)


class LoginLimiter:
    """Failed guesses per client, and in total as a backstop, over a sliding window."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._by_client: dict[str, deque[float]] = {}
        self._total: deque[float] = deque()

    def retry_after(self, client: str) -> float:
        """0 when ``client`` may try now, else the seconds until it may: its own limit first,
        then the total."""
        now = self.clock()
        with self._lock:
            self._expire(now)
            mine = self._by_client.get(client)
            if mine is not None and len(mine) >= FAILURES_PER_CLIENT:
                return mine[0] + WINDOW - now
            return self._total[0] + WINDOW - now if len(self._total) >= FAILURES_TOTAL else 0.0

    def failed(self, client: str) -> None:
        """Count one failed guess of ``client`` (callers ask ``retry_after`` first, so a locked
        client adds nothing)."""
        now = self.clock()
        with self._lock:
            self._by_client.setdefault(client, deque()).append(now)
            self._total.append(now)
            if len(self._total) == FAILURES_TOTAL:
                log.warning("page token guessed from many clients: every wrong guess gets 429 "
                            "for up to the window (a right token is still accepted)",
                            extra=log_fields(clients=len(self._by_client),
                                             failures=FAILURES_TOTAL, window_seconds=WINDOW))

    def _expire(self, now: float) -> None:
        while self._total and self._total[0] <= now - WINDOW:
            self._total.popleft()
        for client in list(self._by_client):
            times = self._by_client[client]
            while times and times[0] <= now - WINDOW:
                times.popleft()
            if not times:
                del self._by_client[client]
