"""Page sessions (issue 24 item 6): a cookie per login that expires and can be signed out,
``Secure`` behind TLS or a TLS proxy, and login attempts throttled."""

from __future__ import annotations

import pytest
import requests

from harness.bridge_payloads import cascade, make_context, serve
from tests.pages_helpers import fake_worker, post_alerts
from tests.test_pages_run import RUN_PATH
from wandb_infra.bridge.web.sessions import FAILURES_PER_CLIENT, WINDOW, LoginLimiter, Sessions
from wandb_infra.bridge.web.webhook import PAGE_COOKIE, PageAuth

PAGE_TOKEN = "page-token-0123456789abcdef"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.unit
def test_a_session_expires_and_ends_at_sign_out():
    clock = Clock()
    sessions = Sessions(seconds=60, clock=clock)
    a, b = sessions.issue(), sessions.issue()
    assert a != b and sessions.valid(a) and sessions.valid(b)
    sessions.end(a)
    assert not sessions.valid(a) and sessions.valid(b)
    clock.now += 61
    assert not sessions.valid(b)
    assert not sessions.valid("") and not sessions.valid(None) and not sessions.valid("forged")


@pytest.mark.unit
def test_failed_logins_are_throttled_per_client_and_released_after_the_window():
    clock = Clock()
    limiter = LoginLimiter(clock=clock)
    for _ in range(FAILURES_PER_CLIENT):
        assert limiter.retry_after("10.0.0.1") == 0
        limiter.failed("10.0.0.1")
    assert limiter.retry_after("10.0.0.1") == pytest.approx(WINDOW)
    assert limiter.retry_after("10.0.0.2") == 0  # another client is not locked out
    clock.now += WINDOW + 1
    assert limiter.retry_after("10.0.0.1") == 0


@pytest.fixture
def bridge(tmp_path):
    ctx = make_context(tmp_path, worker=fake_worker(), pages=PageAuth(PAGE_TOKEN))
    with serve(ctx) as running:
        post_alerts(running, cascade(hosts=2, gpus=1))
        yield running


def _login(bridge, token: str = PAGE_TOKEN, **headers: str) -> requests.Response:
    return requests.post(bridge.url + "/login", data={"token": token, "next": RUN_PATH},
                         headers=headers, timeout=10, allow_redirects=False)


def _page(bridge, cookie: str) -> int:
    return requests.get(bridge.url + RUN_PATH, cookies={PAGE_COOKIE: cookie}, timeout=10,
                        headers={"Accept": "text/html"}, allow_redirects=False).status_code


@pytest.mark.integration
def test_each_login_is_its_own_session_and_sign_out_ends_it(bridge):
    first, second = _login(bridge), _login(bridge)
    a, b = first.cookies[PAGE_COOKIE], second.cookies[PAGE_COOKIE]
    assert a != b and PAGE_TOKEN not in a
    assert _page(bridge, a) == 200 and _page(bridge, b) == 200
    out = requests.post(bridge.url + "/logout", cookies={PAGE_COOKIE: a}, timeout=10,
                        allow_redirects=False)
    assert out.status_code == 303 and out.headers["Location"] == "/login"
    assert 'wandb_infra_pages=""' in out.headers["Set-Cookie"]
    assert _page(bridge, a) == 401 and _page(bridge, b) == 200


@pytest.mark.integration
def test_cookie_is_secure_behind_a_tls_proxy(bridge):
    plain = _login(bridge).headers["Set-Cookie"]
    proxied = _login(bridge, **{"X-Forwarded-Proto": "https"}).headers["Set-Cookie"]
    assert "Secure" not in plain and "Secure" in proxied
    assert "HttpOnly" in proxied and "SameSite=Strict" in proxied and "Max-Age=43200" in proxied


@pytest.mark.integration
def test_guessing_the_page_token_is_throttled(bridge):
    for _ in range(FAILURES_PER_CLIENT):
        assert _login(bridge, "wrong-token-0123456789").status_code == 401
    locked = _login(bridge, "wrong-token-0123456789")
    assert locked.status_code == 429 and int(locked.headers["Retry-After"]) >= 1
    # the right token gets no answer either while locked: guessing learns nothing
    right = _login(bridge)
    assert right.status_code == 429 and PAGE_COOKIE not in right.cookies
