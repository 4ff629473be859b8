"""Every page carries security headers, a chunked POST /login
body is bounded like every other body and counted against the in-flight bound, /readyz says
ready or not and nothing else, and a backward wall-clock step after a W&B 503 does not stop
delivery."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest
import requests

from harness.bridge_payloads import TOKEN, alert, make_context, notification, serve
from harness.processes import wait_for
from harness.wandb_standin import WandbStandin
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.bridge.web.webhook import MAX_LOGIN_BYTES, PageAuth

PAGE_TOKEN = "page-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def running(tmp_path):
    with serve(make_context(tmp_path, pages=PageAuth(PAGE_TOKEN))) as server:
        yield server


def test_security_headers_on_every_page(running):
    page = {"Authorization": f"Bearer {PAGE_TOKEN}"}
    for path, headers in [("/runs", page), ("/runs?format=json", page), ("/login", {}),
                          ("/runs", {}), ("/healthz", {}), ("/readyz", {}), ("/metrics", {}),
                          ("/runbook", {}), ("/nowhere", {})]:
        resp = requests.get(running.url + path, headers=headers, timeout=10)
        csp = resp.headers.get("Content-Security-Policy", "")
        assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp, path
        assert "script-src" not in csp  # no script at all
        assert resp.headers.get("X-Frame-Options") == "DENY", path
        assert resp.headers.get("X-Content-Type-Options") == "nosniff", path
        assert resp.headers.get("Cache-Control") == "no-store", path


def test_readyz_says_ready_and_nothing_else(running):
    resp = requests.get(running.url + "/readyz", timeout=10)
    assert resp.json() == {"status": "ready"}


def _chunked_login(url: str, size: int) -> int:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /login HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     b"Content-Type: application/x-www-form-urlencoded\r\n"
                     b"Connection: close\r\n\r\n")
        chunk = b"token=" + b"a" * 65536
        sent = 0
        try:
            while sent < size:
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                sent += len(chunk)
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server stopped reading: fine, its answer is what counts
        return int(sock.recv(100).split(b" ", 2)[1])


def test_a_chunked_login_body_is_bounded(running):
    """Today aiohttp's post() buffered a chunked login body up to 1 MiB (client_max_size) per
    connection (the webhook's max_body_bytes, 8 MiB by default), outside the in-flight bound:
    120 connections took 1.1 GB."""
    assert _chunked_login(running.url, 512 * 1024) == 413  # below client_max_size (1 MiB)
    resp = requests.post(running.url + "/login", data={"token": PAGE_TOKEN, "next": "/runs"},
                         allow_redirects=False, timeout=10)
    assert resp.status_code == 303  # a real login still works


@contextmanager
def _login_in_flight(url: str) -> Iterator[socket.socket]:
    """A chunked POST /login whose body has begun but not ended (the handler is reading it)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /login HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     b"Content-Type: application/x-www-form-urlencoded\r\n"
                     b"Connection: close\r\n\r\n6\r\ntoken=\r\n")
        yield sock


def _inflight_bytes(url: str) -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    return next(float(line.rpartition(" ")[2]) for line in text.splitlines()
                if line.startswith("wandb_infra_bridge_inflight_body_bytes "))


def test_concurrent_login_bodies_fill_the_inflight_bound(tmp_path):
    """Chunked login bodies announce no size, so each reserves the login form's bound for as long
    as it is read: three fill a bound of three forms, and the next login and the next
    notification get 503 until they end. Before, a login body did not show on
    ``inflight_body_bytes``."""
    ctx = make_context(tmp_path, pages=PageAuth(PAGE_TOKEN),
                       max_inflight_bytes=3 * MAX_LOGIN_BYTES)
    with serve(ctx) as running, ExitStack() as stack:
        held = [stack.enter_context(_login_in_flight(running.url)) for _ in range(3)]
        wait_for(lambda: _inflight_bytes(running.url) == 3 * MAX_LOGIN_BYTES, 10,
                 "three login bodies in flight")
        login = requests.post(running.url + "/login", data={"token": PAGE_TOKEN},
                              allow_redirects=False, timeout=10)
        assert login.status_code == 503 and login.headers["Retry-After"] == "5"
        hook = requests.post(running.url + "/alertmanager", data=b"{}", timeout=10,
                             headers=AUTH | {"Content-Type": "application/json"})
        assert hook.status_code == 503
        for sock in held:  # the held logins were being served all along: they end with 401
            sock.sendall(b"5\r\nwrong\r\n0\r\n\r\n")
            assert sock.recv(100).startswith(b"HTTP/1.1 401 ")
        wait_for(lambda: _inflight_bytes(running.url) == 0, 10, "the bound given back")
        login = requests.post(running.url + "/login", data={"token": PAGE_TOKEN},
                              allow_redirects=False, timeout=10)
        assert login.status_code == 303


def test_a_backward_clock_step_does_not_stop_delivery(tmp_path):
    """Today one W&B 503 followed by the wall clock stepping back an hour paused delivery (and
    the run's retry) for that hour."""
    now = [2_000_000_000.0]
    with WandbStandin() as wb:
        wb.add_run("team", "proj", "r1")
        store = Store(tmp_path / "bridge.sqlite")
        worker = DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                                markers=None, links=GrafanaLinks(""), metrics=BridgeMetrics(),
                                policy=DeliveryPolicy(flush_interval=0, backoff_base=0.05,
                                                      backoff_max=0.2),
                                clock=lambda: now[0])
        store.ingest(parse_notification(json.dumps(notification([alert(
            "GpuXidError", category="gpu_hardware", host="h1", gpu="0", run="r1")])).encode()),
            now[0])
        wb.fail(503, times=1)
        assert worker.run_once() == 0  # paused for about 0.1 s
        now[0] -= 3600  # NTP steps the wall clock back an hour
        time.sleep(0.5)
        delivered = 0
        for _ in range(5):
            delivered += worker.run_once()
            if delivered:
                break
            time.sleep(0.2)
        assert delivered == 1
        assert "infra:GpuXidError" in wb.run("team", "proj", "r1").tags
