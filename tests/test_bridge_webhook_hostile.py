"""Hostile input at the webhook: thousands of generated bodies (deeply nested, huge, wrongly
typed, wrongly encoded, numeric edge cases) never get a 5xx and never store a row; slow clients
and many concurrent connections do not stall a healthy request.

tests/test_bridge_webhook_fuzz.py already mutates fields of real Alertmanager bodies and sends
random bytes; these strategies go after the decoder and the HTTP layer instead.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.bridge_payloads import TOKEN, alert, make_context, notification, serve
from tests.budget import examples

AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_BODY = 256 * 1024
SUPPRESS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
            HealthCheck.data_too_large]


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    ctx = make_context(tmp_path_factory.mktemp("hostile"), max_body_bytes=MAX_BODY)
    with serve(ctx) as running:
        # A generated body that happens to be valid is this alert again: a duplicate, no row.
        assert requests.post(running.url + "/alertmanager", json=_valid(), headers=AUTH,
                             timeout=10).json()["new"] == 1
        yield running


def _valid(run: str = "hostile") -> dict:
    return notification([alert("NodeDown", category="node", host="h\u00e9", run=run)])


def _nested(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    if kind == "object":
        return b'{"a":' * depth + b"1" + b"}" * depth
    body = json.dumps(_valid())
    return body.replace('"labels": {', '"labels": {"deep": ' + "[" * depth + "]" * depth + ", ",
                        1).encode()


NESTED = st.builds(_nested, st.integers(1, 200_000), st.sampled_from(["list", "object", "label"]))

ENCODED = st.builds(
    lambda codec, text: json.dumps(_valid(), ensure_ascii=False).replace(
        "NodeDown on h", text, 1).encode(codec, "replace"),
    st.sampled_from(["utf-16", "utf-16-le", "utf-32", "latin-1", "cp1252", "utf-8-sig",
                     ]),
    st.text(min_size=1, max_size=20))

NUMBERS = st.builds(
    lambda field, literal: json.dumps(_valid()).replace(f'"{field}": ', f'"{field}": {literal}, '
                                                        '"was": ', 1).encode(),
    st.sampled_from(["truncatedAlerts", "status", "fingerprint", "startsAt"]),
    st.sampled_from(["1" * 5000, "-" + "9" * 4400, "1e999", "-1e999", "NaN", "Infinity",
                     "-Infinity", "1.5", "-1", "true", "null", "0.0000000001e-400"]))


def _wrong_types(value: object, where: str) -> bytes:
    body = _valid()
    if where == "body":
        return json.dumps(value).encode()
    if where == "alerts":
        body["alerts"] = value
    elif where == "alert":
        body["alerts"] = [value]
    else:
        body["alerts"][0][where] = value
    return json.dumps(body).encode()


ANY = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                   | st.text(max_size=20),
                   lambda inner: st.lists(inner, max_size=3)
                   | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
WRONG_TYPES = st.builds(
    _wrong_types, ANY.filter(lambda v: not isinstance(v, dict)),
    st.sampled_from(["body", "alerts", "alert", "labels", "annotations", "status",
                     "fingerprint", "startsAt", "endsAt"]))

HUGE = st.builds(
    lambda size, where: json.dumps(_valid()).replace(
        '"summary": "', '"summary": "' + "\u00e9" * size if where == "annotation"
        else '"summary": "', 1).replace(
        '"alertname": "', '"alertname": "' + "A" * size if where == "label"
        else '"alertname": "', 1).encode(),
    st.integers(70_000, 400_000), st.sampled_from(["annotation", "label"]))

MANY_ALERTS = st.builds(
    lambda n, bad: json.dumps(notification(
        [alert("NodeDown", category="node", host=f"h{i}", run="many") for i in range(n)]
        + [{"status": "firing", "labels": {"a": bad}}])).encode(),
    st.integers(1, 800), st.text(max_size=5))

CONTENT_TYPES = st.sampled_from(["application/json", "application/json; charset=utf-16",
                                 "application/json; charset=latin-1", "text/plain", "",
                                 "application/x-www-form-urlencoded", "application/json;;;"])


@given(body=st.one_of(NESTED, ENCODED, NUMBERS, WRONG_TYPES, HUGE, MANY_ALERTS),
       content_type=CONTENT_TYPES)
@settings(max_examples=examples(1500), deadline=None, suppress_health_check=SUPPRESS)
def test_hostile_bodies_never_5xx_never_stored(bridge, body, content_type):
    before = bridge.ctx.store.alert_count()
    resp = requests.post(bridge.url + "/alertmanager", data=body, timeout=30,
                         headers={**AUTH, "Content-Type": content_type})
    assert resp.status_code in (200, 400, 413, 415), (resp.status_code, resp.text[:300])
    assert resp.status_code != 200 or resp.json()["new"] == 0
    assert bridge.ctx.store.alert_count() == before


def test_still_healthy_after_the_fuzzing(bridge):
    assert requests.get(bridge.url + "/healthz", timeout=10).status_code == 200
    resp = requests.post(bridge.url + "/alertmanager", json=_valid("after"), headers=AUTH,
                         timeout=10)
    assert resp.status_code == 200 and resp.json()["new"] == 1


def _slow_socket(port: int, kind: str) -> socket.socket:
    """A client that starts a request and never finishes it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    if kind == "headers":
        sock.sendall(b"POST /alertmanager HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    else:
        sock.sendall(b"POST /alertmanager HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n"
                     b"Content-Length: 100000\r\n\r\n{\"alerts\": [")
    return sock


def test_slow_clients_and_concurrent_connections_do_not_stall_others(bridge):
    port = int(bridge.url.rsplit(":", 1)[1])
    slow = [_slow_socket(port, "headers" if i % 2 else "body") for i in range(200)]
    stop = threading.Event()

    def drip() -> None:  # slowloris: a byte now and then keeps every connection alive
        while not stop.wait(0.5):
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.send(b"a" if sock.fileno() % 2 else b" ")
    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    try:
        session = requests.Session()
        start = time.monotonic()
        resp = session.post(bridge.url + "/alertmanager", json=_valid("healthy"), headers=AUTH,
                            timeout=5)
        assert resp.status_code == 200
        assert requests.get(bridge.url + "/readyz", timeout=5).status_code == 200

        def post(i: int) -> int:
            return requests.post(bridge.url + "/alertmanager", json=notification(
                [alert("NodeDown", category="node", host=f"c{i}", run=f"conc{i % 20}")]),
                headers=AUTH, timeout=30).status_code
        with ThreadPoolExecutor(50) as pool:
            codes = list(pool.map(post, range(300)))
        assert codes == [200] * 300
        assert sum(row[1] for row in bridge.ctx.store.runs() if row[0].run_id.startswith(
            "conc")) == 300
        resp = session.post(bridge.url + "/alertmanager", json=_valid("healthy2"), headers=AUTH,
                            timeout=5)
        assert resp.status_code == 200
        assert time.monotonic() - start < 60
    finally:
        stop.set()
        dripper.join(5)
        for sock in slow:
            sock.close()
