"""Page sessions: a cookie per login that expires and can be signed out,
``Secure`` when configured or behind TLS or a TLS proxy, and guesses of the page token (at the
login form or as a bearer header on a page) throttled per client, with the total only as a
backstop."""

from __future__ import annotations

import logging
import ssl

import pytest
import requests
from aiohttp.test_utils import make_mocked_request

from harness.bridge_payloads import TOKEN, cascade, serve
from harness.clock import ManualClock
from tests.pages_helpers import pages_context, post_alerts
from tests.test_pages_auth import _config
from tests.test_pages_run import RUN_PATH
from wandb_infra.bridge.config import ConfigError, load
from wandb_infra.bridge.web.sessions import (
    FAILURES_PER_CLIENT,
    FAILURES_TOTAL,
    WINDOW,
    LoginLimiter,
    Sessions,
)
from wandb_infra.bridge.web.webhook import PAGE_COOKIE, PageAuth
from wandb_infra.common.netaddr import client_key

PAGE_TOKEN = "page-token-0123456789abcdef"


@pytest.mark.unit
def test_a_session_expires_and_ends_at_sign_out():
    clock = ManualClock(1000.0)
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
    clock = ManualClock(1000.0)
    limiter = LoginLimiter(clock=clock)
    for _ in range(FAILURES_PER_CLIENT):
        assert limiter.retry_after("10.0.0.1") == 0
        limiter.failed("10.0.0.1")
    assert limiter.retry_after("10.0.0.1") == pytest.approx(WINDOW)
    assert limiter.retry_after("10.0.0.2") == 0  # another client is not locked out
    clock.now += WINDOW + 1
    assert limiter.retry_after("10.0.0.1") == 0


def _guess(limiter: LoginLimiter, client: str) -> bool:
    """One wrong guess as the handlers make it: refused unasked while locked, else counted."""
    if limiter.retry_after(client) > 0:
        return False
    limiter.failed(client)
    return True


@pytest.mark.unit
def test_a_client_is_its_ipv4_address_or_its_ipv6_64():
    assert client_key("10.0.0.1") == client_key("::ffff:10.0.0.1") == "10.0.0.1"
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff:1") == "2001:db8::/64"
    assert client_key("2001:db8:0:1::1") == "2001:db8:0:1::/64"
    assert client_key("fe80::1%eth0") == "fe80::/64"
    assert client_key(None) == "" and client_key("/run/bridge.sock") == "/run/bridge.sock"


@pytest.mark.unit
def test_one_client_cannot_lock_everyone_out():
    """Hammering from one address, or from every address of one IPv6 /64, locks that client
    only: it stops at its own limit, which is far below the total's backstop."""
    clock = ManualClock(1000.0)
    limiter = LoginLimiter(clock=clock)
    assert sum(_guess(limiter, "10.0.0.1") for _ in range(1000)) == FAILURES_PER_CLIENT
    rotated = [client_key(f"2001:db8::{i:x}") for i in range(1, 2 * FAILURES_TOTAL)]
    assert sum(_guess(limiter, client) for client in rotated) == FAILURES_PER_CLIENT
    assert limiter.retry_after("10.0.0.2") == 0
    assert limiter.retry_after(client_key("2001:db8:1::1")) == 0


@pytest.mark.unit
def test_the_total_is_a_logged_backstop_against_many_clients(caplog):
    clock = ManualClock(1000.0)
    limiter = LoginLimiter(clock=clock)
    clients = [f"10.0.1.{i}" for i in range(FAILURES_TOTAL // FAILURES_PER_CLIENT)]
    with caplog.at_level(logging.WARNING, logger="wandb_infra.bridge.web.sessions"):
        for client in clients:
            for _ in range(FAILURES_PER_CLIENT + 5):
                _guess(limiter, client)
    (line,) = [r for r in caplog.records if "many clients" in r.getMessage()]
    assert line.fields == {"clients": len(clients), "failures": FAILURES_TOTAL,
                           "window_seconds": WINDOW}
    assert limiter.retry_after("10.0.2.1") == pytest.approx(WINDOW)  # the backstop holds
    clock.now += WINDOW + 1
    assert limiter.retry_after("10.0.2.1") == 0 and limiter.retry_after(clients[0]) == 0


@pytest.mark.unit
@pytest.mark.parametrize(("setting", "plain", "tls", "proxied"), [
    (None, False, True, True),  # unset: Secure exactly when the browser used https
    (True, True, True, True),  # a proxy that sends no X-Forwarded-Proto
    (False, False, False, False),  # plain http end to end, whatever a header claims
])
def test_secure_cookie_setting(setting, plain, tls, proxied):
    pages = PageAuth(PAGE_TOKEN, secure_cookie=setting)
    forwarded = {"X-Forwarded-Proto": "HTTPS"}
    assert pages.secure(make_mocked_request("POST", "/login")) is plain
    assert pages.secure(make_mocked_request(
        "POST", "/login", sslcontext=ssl.create_default_context())) is tls
    assert pages.secure(make_mocked_request("POST", "/login", headers=forwarded)) is proxied


@pytest.fixture
def bridge(tmp_path):
    ctx = pages_context(tmp_path, pages=PageAuth(PAGE_TOKEN))
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
def test_guessing_the_page_token_is_throttled_but_never_the_right_token(bridge):
    """Everyone behind one proxy is one client address: others' wrong guesses lock the
    address, and the right token typed behind it still logs in (before: 429)."""
    for _ in range(FAILURES_PER_CLIENT):
        assert _login(bridge, "wrong-token-0123456789").status_code == 401
    locked = _login(bridge, "wrong-token-0123456789")
    assert locked.status_code == 429 and int(locked.headers["Retry-After"]) >= 1
    right = _login(bridge)
    assert right.status_code == 303 and PAGE_COOKIE in right.cookies
    assert _login(bridge, "wrong-token-0123456789").status_code == 429


@pytest.mark.integration
@pytest.mark.parametrize("target", ["/runs\r\nSet-Cookie: evil=1", "/runs\nX-Evil: 1",
                                    "/unattributed\r", "/runs/\x00", "/runs/\u2028x"])
def test_a_control_character_in_the_login_target_is_no_header_and_no_broken_login(bridge,
                                                                                  target):
    """Before, aiohttp refused the ``Location`` header and dropped the connection: no header
    was injected, but a crafted link broke the login of whoever followed it."""
    resp = requests.post(bridge.url + "/login", data={"token": PAGE_TOKEN, "next": target},
                         timeout=10, allow_redirects=False)
    assert resp.status_code == 303 and resp.headers["Location"] == "/runs"
    assert "evil" not in str(resp.headers).lower() and PAGE_COOKIE in resp.cookies


@pytest.mark.integration
def test_guessing_the_page_token_as_a_bearer_header_is_throttled(bridge):
    """A wrong ``Authorization`` header on /runs is a guess like a wrong login, counted by the
    same limiter; a session cookie from before keeps working, and the right header still opens
    the pages from the throttled address (before: 429)."""
    cookie = _login(bridge).cookies[PAGE_COOKIE]
    url = bridge.url + "/runs?format=json"
    wrong = {"Authorization": "Bearer wrong-token-0123456789"}
    for _ in range(FAILURES_PER_CLIENT - 1):
        assert requests.get(url, headers=wrong, timeout=10).status_code == 401
    assert _login(bridge, "wrong-token-0123456789").status_code == 401  # the tenth guess
    locked = requests.get(url, headers=wrong, timeout=10)
    assert locked.status_code == 429 and int(locked.headers["Retry-After"]) >= 1
    right = requests.get(url, headers={"Authorization": f"Bearer {PAGE_TOKEN}"}, timeout=10)
    assert right.status_code == 200
    assert _page(bridge, cookie) == 200
    assert requests.get(url, timeout=10).status_code == 401  # no credentials: not a guess


@pytest.mark.integration
@pytest.mark.parametrize(("value", "forwarded", "secure"), [
    ("true", "", True), ("false", "https", False)])
def test_auth_secure_cookie_reaches_the_login(tmp_path, value, forwarded, secure):
    """``auth.secure_cookie`` from the configuration, through the service, onto the cookie."""
    from wandb_infra.bridge.service import build  # noqa: PLC0415 - builds a whole service context

    env = _config(tmp_path, bearer_token=TOKEN, pages_token=PAGE_TOKEN)
    env["WANDB_INFRA_BRIDGE__STORE__PATH"] = str(tmp_path / "s.sqlite")
    env["WANDB_INFRA_BRIDGE__AUTH__SECURE_COOKIE"] = value
    with serve(build(load(None, environ=env)).ctx) as running:
        headers = {"X-Forwarded-Proto": forwarded} if forwarded else {}
        cookie = _login(running, **headers).headers["Set-Cookie"]
    assert cookie.startswith(PAGE_COOKIE + "=") and ("; Secure" in cookie) is secure
    env["WANDB_INFRA_BRIDGE__AUTH__SECURE_COOKIE"] = "sometimes"
    with pytest.raises(ConfigError, match=r"auth\.secure_cookie"):
        load(None, environ=env)
