"""Who may post to the webhook and who may read the pages: credentials compared as digests in
constant time, the page token and its sessions."""

from __future__ import annotations

import base64
import hmac
from dataclasses import dataclass, field

from aiohttp import web

from wandb_infra.bridge.web.sessions import LoginLimiter, Sessions, digest


@dataclass
class Credentials:
    """Accepted ``Authorization`` header values, compared as digests in constant time."""

    bearer_token: str | None = field(default=None, repr=False)
    basic_username: str | None = None
    basic_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._accepted: list[bytes] = []
        if self.bearer_token:
            self._accepted.append(digest(f"Bearer {self.bearer_token}"))
        if self.basic_username and self.basic_password:
            pair = f"{self.basic_username}:{self.basic_password}".encode()
            self._accepted.append(digest("Basic " + base64.b64encode(pair).decode()))

    @property
    def enabled(self) -> bool:
        """False only in the explicit insecure local-demo mode."""
        return bool(self._accepted)

    def check(self, header: str | None) -> bool:
        """True when ``header`` matches a configured credential (all compared, no early out)."""
        if not self._accepted:
            return True
        got = digest(header or "")
        return sum(hmac.compare_digest(got, accepted) for accepted in self._accepted) > 0


@dataclass
class PageAuth:
    """Read access to the pages, separate from the webhook's credentials: ``token`` as a bearer
    header or typed into the login form (a session cookie, ``web/sessions.py``), failed guesses
    counted by ``limiter``. The webhook's credentials open the pages when ``accept_webhook`` says
    so (None: only while no page token is configured). ``secure_cookie`` None: ``Secure`` when
    the request came over TLS (or ``X-Forwarded-Proto: https``)."""

    token: str | None = field(default=None, repr=False)
    accept_webhook: bool | None = None
    secure_cookie: bool | None = None
    sessions: Sessions = field(default_factory=Sessions)
    limiter: LoginLimiter = field(default_factory=LoginLimiter)

    def __post_init__(self) -> None:
        self._bearer = digest(f"Bearer {self.token}") if self.token else b""

    @property
    def webhook_opens_pages(self) -> bool:
        """Whether the webhook's credentials are also page credentials."""
        return not self.token if self.accept_webhook is None else self.accept_webhook

    def check_token(self, token: str) -> bool:
        """Constant-time comparison of a typed token."""
        return bool(self.token) and hmac.compare_digest(digest(token), digest(self.token or ""))

    def check_header(self, header: str) -> bool:
        """True for the page token as a bearer ``Authorization`` header (constant time)."""
        return bool(self.token) and hmac.compare_digest(digest(header), self._bearer)

    def secure(self, request: web.Request) -> bool:
        """Whether the session cookie gets ``Secure``."""
        if self.secure_cookie is not None:
            return self.secure_cookie
        return request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"
