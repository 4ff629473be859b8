"""Pages have their own read credential (login form -> HttpOnly, SameSite=Strict
cookie, or a bearer header), separate from the webhook's token unless configured otherwise."""

from __future__ import annotations

import pytest
import requests

from harness.bridge_payloads import TOKEN, cascade, make_context, serve
from tests.pages_helpers import AUTH, HTML, pages_context, post_alerts
from tests.test_pages_run import RUN_PATH
from wandb_infra.bridge.config import load
from wandb_infra.bridge.web.webhook import PAGE_COOKIE, PageAuth
from wandb_infra.common.configfile import ConfigError

PAGE_TOKEN = "page-token-0123456789abcdef"


@pytest.fixture
def bridge(tmp_path):
    ctx = pages_context(tmp_path, pages=PageAuth(PAGE_TOKEN))
    with serve(ctx) as running:
        post_alerts(running, cascade(hosts=4, gpus=1))
        yield running


def _get(bridge, path: str = RUN_PATH, **kw) -> requests.Response:
    return requests.get(bridge.url + path, timeout=10, allow_redirects=False, **kw)


def test_pages_refuse_without_credentials_and_show_the_login_form(bridge):
    for path in ("/runs", RUN_PATH, "/unattributed"):
        resp = _get(bridge, path, headers={"Accept": "text/html"})
        assert resp.status_code == 401
        assert "<form method='post' action='/login'>" in resp.text
        assert "Basic" not in resp.headers["WWW-Authenticate"]  # no browser prompt
        api = _get(bridge, path, headers={"Accept": "application/json"})
        assert api.status_code == 401 and api.json()["status"] == "error"


def test_webhook_token_is_not_a_page_token(bridge):
    assert _get(bridge, headers=HTML).status_code == 401
    resp = requests.post(bridge.url + "/login", data={"token": TOKEN, "next": RUN_PATH},
                         timeout=10, allow_redirects=False)
    assert resp.status_code == 401 and "Wrong token." in resp.text
    assert PAGE_COOKIE not in resp.cookies


def test_login_sets_a_strict_httponly_cookie_that_opens_the_pages(bridge):
    resp = requests.post(bridge.url + "/login", data={"token": PAGE_TOKEN, "next": RUN_PATH},
                         timeout=10, allow_redirects=False)
    assert resp.status_code == 303 and resp.headers["Location"] == RUN_PATH
    header = resp.headers["Set-Cookie"]
    assert "HttpOnly" in header and "SameSite=Strict" in header and "Path=/" in header
    cookie = resp.cookies[PAGE_COOKIE]
    assert PAGE_TOKEN not in cookie  # an HMAC of the token, not the token
    page = _get(bridge, headers={"Accept": "text/html"}, cookies={PAGE_COOKIE: cookie})
    assert page.status_code == 200 and "ROOT CAUSE" in page.text
    assert _get(bridge, "/runs", cookies={PAGE_COOKIE: cookie}).status_code == 200
    forged = cookie[:-1] + ("0" if cookie[-1] != "0" else "1")  # one character changed
    assert _get(bridge, cookies={PAGE_COOKIE: forged}).status_code == 401
    bearer = {"Authorization": f"Bearer {PAGE_TOKEN}"}
    assert _get(bridge, headers=bearer).status_code == 200


def test_login_redirects_only_to_pages(bridge):
    for target in ("https://evil.example/", "//evil.example/runs", "/\\evil", "/metrics"):
        resp = requests.post(bridge.url + "/login", data={"token": PAGE_TOKEN, "next": target},
                             timeout=10, allow_redirects=False)
        assert resp.headers["Location"] == "/runs", target
    form = _get(bridge, "/login?next=/runs/team/proj/x").text
    assert "value='/runs/team/proj/x'" in form


def test_webhook_credentials_open_pages_only_when_configured(tmp_path):
    for accept, expected in ((None, 401), (False, 401), (True, 200)):
        ctx = make_context(tmp_path / str(accept), pages=PageAuth(PAGE_TOKEN, accept))
        with serve(ctx) as running:
            assert _get(running, "/runs", headers=AUTH).status_code == expected, accept
    # No page token: the webhook's credentials stay the pages' (older configs, API clients),
    # unless switched off.
    with serve(make_context(tmp_path / "legacy")) as running:
        assert _get(running, "/runs", headers=AUTH).status_code == 200
        refused = _get(running, "/runs", headers={"Accept": "text/html"})
        assert refused.status_code == 401 and "auth.pages_token_file" in refused.text
        assert refused.headers["WWW-Authenticate"].startswith("Basic ")
        assert "<form" not in refused.text
        assert requests.post(running.url + "/login", data={"token": TOKEN},
                             timeout=10).status_code == 401
    with serve(make_context(tmp_path / "off", pages=PageAuth(None, False))) as running:
        assert _get(running, "/runs", headers=AUTH).status_code == 401


def _config(tmp_path, **auth) -> dict[str, str]:
    env = {}
    for key, value in auth.items():
        path = tmp_path / key
        path.write_text(value)
        env[f"WANDB_INFRA_BRIDGE__AUTH__{key.upper()}_FILE"] = str(path)
    return env


def test_config_reads_the_page_token_and_validates_it(tmp_path):
    cfg = load(None, environ=_config(tmp_path, bearer_token=TOKEN, pages_token=PAGE_TOKEN))
    assert cfg.secrets.pages_token == PAGE_TOKEN and PAGE_TOKEN in cfg.secrets.all()
    assert PAGE_TOKEN not in repr(cfg.secrets)
    with pytest.raises(ConfigError, match="at least 16"):
        load(None, environ=_config(tmp_path, bearer_token=TOKEN, pages_token="short"))
    with pytest.raises(ConfigError, match="differ"):
        load(None, environ=_config(tmp_path, bearer_token=TOKEN, pages_token=TOKEN))
    env = _config(tmp_path, bearer_token=TOKEN)
    env["WANDB_INFRA_BRIDGE__AUTH__PAGES_ACCEPT_WEBHOOK_CREDENTIALS"] = "maybe"
    with pytest.raises(ConfigError, match="pages_accept_webhook_credentials"):
        load(None, environ=env)


def test_service_wires_the_page_token(tmp_path):
    from wandb_infra.bridge.service import build  # noqa: PLC0415 - builds a whole service context

    env = _config(tmp_path, bearer_token=TOKEN, pages_token=PAGE_TOKEN)
    env["WANDB_INFRA_BRIDGE__STORE__PATH"] = str(tmp_path / "s.sqlite")
    ctx = build(load(None, environ=env)).ctx
    assert ctx.pages.token == PAGE_TOKEN and not ctx.pages.webhook_opens_pages
