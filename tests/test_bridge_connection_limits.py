"""Connection and memory limits of the real bridge process: idle and slow clients are
cut off, bodies in flight are bounded with 503 + Retry-After, and a state directory that cannot
be created makes the bridge unready (503) instead of exiting, until it can."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
import requests

from harness.bridge_payloads import TOKEN, alert, notification
from harness.bridge_process import bridge_env, start_bridge
from harness.processes import wait_for
from wandb_infra.bridge.config import load
from wandb_infra.common.configfile import ConfigError

HEADERS = (f"POST /alertmanager HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
           "Content-Type: application/json\r\n")


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """True when the server closes ``sock`` (EOF or reset) within ``within`` seconds."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


@pytest.mark.integration
def test_idle_and_half_sent_connections_are_closed(tmp_path: Path):
    bridge = start_bridge(tmp_path, bridge_env(tmp_path, listen__idle_timeout_seconds="0.5"))
    try:
        idle = [socket.create_connection(("127.0.0.1", bridge.port)) for _ in range(200)]
        partial = [socket.create_connection(("127.0.0.1", bridge.port)) for _ in range(20)]
        for sock in partial:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        assert requests.get(bridge.url + "/healthz", timeout=5).status_code == 200
        started = time.monotonic()
        assert all(_closed_by_server(s, 5) for s in idle + partial)
        assert time.monotonic() - started < 5
        for sock in idle + partial:
            sock.close()
        assert requests.get(bridge.url + "/healthz", timeout=5).status_code == 200
    finally:
        bridge.stop()


@pytest.mark.integration
def test_a_body_that_never_arrives_gets_408(tmp_path: Path):
    bridge = start_bridge(tmp_path, bridge_env(tmp_path, webhook__body_timeout_seconds="0.5"))
    try:
        with socket.create_connection(("127.0.0.1", bridge.port), timeout=10) as sock:
            sock.sendall(HEADERS.encode() + b"Content-Length: 1000\r\n\r\n{\"alerts\":")
            answer = sock.recv(4096)
        assert answer.split(b" ", 2)[1] == b"408", answer
        assert bridge.metrics()['wandb_infra_bridge_notifications_total{outcome="body_timeout"}'] \
            == 1
    finally:
        bridge.stop()


@pytest.mark.integration
def test_bodies_in_flight_are_bounded_with_503_and_retry_after(tmp_path: Path):
    env = bridge_env(tmp_path, webhook__max_inflight_bytes="300000",
                     webhook__body_timeout_seconds="3")
    bridge = start_bridge(tmp_path, env)
    body = json.dumps(notification([alert("NodeDown", category="node", host="h1",
                                          run="r1")])).encode()
    try:
        with socket.create_connection(("127.0.0.1", bridge.port), timeout=10) as slow:
            slow.sendall(HEADERS.encode() + b"Content-Length: 200000\r\n\r\n{")
            wait_for(lambda: bridge.metrics()["wandb_infra_bridge_inflight_body_bytes"]
                     == 200000, 5, what="the slow body counted in flight")
            big = body + b" " * (150_000 - len(body))
            resp = bridge.post(big)
            assert resp.status_code == 503 and resp.headers["Retry-After"] == "5", resp.text
            assert bridge.post(body).status_code == 200  # small bodies still fit
        wait_for(lambda: bridge.metrics()["wandb_infra_bridge_inflight_body_bytes"] == 0, 10,
                 what="the slow body given up")
        assert bridge.post(big).status_code == 200
        m = bridge.metrics()
        assert m['wandb_infra_bridge_notifications_total{outcome="busy"}'] == 1
    finally:
        bridge.stop()


@pytest.mark.integration
def test_state_dir_that_cannot_be_created_is_unready_until_it_can(tmp_path: Path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the state directory's parent should be")
    env = bridge_env(tmp_path, store__path=str(blocker / "state" / "bridge.sqlite"))
    bridge = start_bridge(tmp_path, env)
    body = notification([alert("NodeDown", category="node", host="h1", run="r1")])
    try:
        assert requests.get(bridge.url + "/readyz", timeout=10).status_code == 503
        resp = bridge.post(body)
        assert resp.status_code == 503 and resp.headers["Retry-After"]
        blocker.unlink()  # the disk "heals"
        wait_for(lambda: requests.get(bridge.url + "/readyz", timeout=10).status_code == 200,
                 10, what="ready once the directory can be created")
        assert bridge.post(body).json()["new"] == 1
        assert bridge.proc.poll() is None
    finally:
        bridge.stop()


@pytest.mark.integration
def test_idle_connections_beyond_the_limit_make_room_for_new_ones(tmp_path: Path):
    env = bridge_env(tmp_path, listen__max_connections="50", listen__idle_timeout_seconds="60")
    bridge = start_bridge(tmp_path, env)
    held: list[socket.socket] = []
    try:
        for _ in range(300):
            held.append(socket.create_connection(("127.0.0.1", bridge.port)))
        # Served during the flood: the new connection evicts the oldest idle one.
        assert requests.get(bridge.url + "/healthz", timeout=5).status_code == 200
        closed = [i for i, s in enumerate(held) if _closed_by_server(s, 0.05)]
        assert 250 <= len(closed) <= 251, len(closed)
        assert len(set(closed) & set(range(250))) >= 245, "the oldest go first"
        descriptors = len(list(Path(f"/proc/{bridge.proc.pid}/fd").iterdir()))
        assert descriptors < 50 + 30, descriptors
    finally:
        for sock in held:
            sock.close()
    try:
        m = bridge.metrics()
        assert m["wandb_infra_bridge_connections_evicted_total"] >= 250
        assert m["wandb_infra_bridge_connections_refused_total"] == 0
    finally:
        bridge.stop()


@pytest.mark.integration
def test_connections_beyond_the_limit_are_refused_when_all_are_busy(tmp_path: Path):
    # the bodies' timeout outlasts any wait below: the slots stay busy until the test frees them
    env = bridge_env(tmp_path, listen__max_connections="20", webhook__body_timeout_seconds="120")
    bridge = start_bridge(tmp_path, env)
    busy: list[socket.socket] = []
    try:
        for _ in range(20):  # authenticated requests whose bodies never finish
            sock = socket.create_connection(("127.0.0.1", bridge.port))
            sock.sendall(HEADERS.encode() + b"Content-Length: 10\r\n\r\n{")
            busy.append(sock)
        wait_for(lambda: _busy_slots(bridge) == 20, 5, what="20 bodies in flight")
        refused = [socket.create_connection(("127.0.0.1", bridge.port)) for _ in range(30)]
        # one deadline for all: on a loaded machine the bridge may get the CPU seconds later
        deadline = time.monotonic() + 30
        assert all(_closed_by_server(s, max(0.1, deadline - time.monotonic())) for s in refused)
        for sock in refused:
            sock.close()
    finally:
        for sock in busy:
            sock.close()
    try:
        wait_for(lambda: requests.get(bridge.url + "/healthz", timeout=5).status_code == 200,
                 10, what="served again")
        assert bridge.metrics()["wandb_infra_bridge_connections_refused_total"] == 30
        assert bridge.log.read_text().count("connection limit reached") == 1
    finally:
        bridge.stop()


def _busy_slots(bridge) -> int:
    """Connections of the bridge process in ESTABLISHED state on its port (from /proc)."""
    port = f"{bridge.port:04X}"
    count = 0
    for line in Path(f"/proc/{bridge.proc.pid}/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        count += local.endswith(":" + port) and state == "01"
    return count


@pytest.mark.parametrize(("key", "value"), [
    ("LISTEN__IDLE_TIMEOUT_SECONDS", "0"), ("LISTEN__MAX_CONNECTIONS", "0"),
    ("WEBHOOK__BODY_TIMEOUT_SECONDS", "-1"), ("WEBHOOK__MAX_INFLIGHT_BYTES", "10"),
    ("LISTEN__MAX_CONNECTIONS", "many"),
])
def test_limit_settings_are_validated(tmp_path: Path, key: str, value: str):
    env = {"WANDB_INFRA_BRIDGE__AUTH__BEARER_TOKEN": TOKEN, f"WANDB_INFRA_BRIDGE__{key}": value}
    with pytest.raises(ConfigError, match=key.split("__")[1].lower()):
        load(None, environ=env)
    assert load(None, environ={"WANDB_INFRA_BRIDGE__AUTH__BEARER_TOKEN": TOKEN}).max_connections \
        == 512



def _slow_login(port: int) -> socket.socket:
    """A connection that starts a ``POST /login`` body and never finishes it."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Type: "
                 b"application/x-www-form-urlencoded\r\nContent-Length: 4000\r\n\r\ntoken=")
    sock.setblocking(False)
    return sock


def _answer(sock: socket.socket) -> bytes | None:
    """The status line the server sent on non-blocking ``sock``, b"closed" when it closed
    without one, None while it says nothing."""
    try:
        data = sock.recv(100)
    except BlockingIOError:
        return None
    except ConnectionResetError:
        return b"closed"
    return data.split(b"\r\n", 1)[0] if data else b"closed"


@pytest.mark.integration
def test_slow_login_bodies_do_not_lock_alertmanager_out(tmp_path: Path):
    """A stranger keeps as many never-finished ``POST /login`` bodies open as the connection
    limit (64 here, 512 by default), opening a new one whenever one is closed. Before, they
    held every connection for the 30 s body timeout and Alertmanager's connections were
    refused. Now a login body read never holds a connection against a new one (the stranger's
    own new connections close the oldest readers), at most one connection in eight reads a
    login body (the rest get 503 at once): the webhook is answered throughout. A lone reader is
    cut off with 408 at the login deadline (the body timeout, at most 5 s)."""
    (tmp_path / "pages").write_text("p" * 32 + "\n")
    env = bridge_env(tmp_path, listen__max_connections="64", webhook__body_timeout_seconds="1",
                     auth__pages_token_file=str(tmp_path / "pages"))
    bridge = start_bridge(tmp_path, env)
    stop = threading.Event()
    answers: list[bytes] = []

    def attack() -> None:
        held = [_slow_login(bridge.port) for _ in range(64)]
        while not stop.is_set():
            for i, sock in enumerate(held):
                if (answer := _answer(sock)) is not None:
                    answers.append(answer)
                    sock.close()
                    held[i] = _slow_login(bridge.port)
            time.sleep(0.05)
        for sock in held:
            sock.close()

    attacker = threading.Thread(target=attack)
    try:
        attacker.start()
        wait_for(lambda: _busy_slots(bridge) >= 64, 5, what="64 slow logins connected")
        took = []
        for n in range(4):
            started = time.monotonic()
            body = notification([alert("NodeDown", category="node", host="h1", run=f"r{n}")])
            assert bridge.post(body, timeout=5).json()["new"] == 1
            took.append(time.monotonic() - started)
            time.sleep(0.25)
        stop.set()
        attacker.join(10)
        # the stranger's readers hold their login slots until the bridge sees them closed (at
        # the latest at their 1 s deadline); until then a new login body is rightly refused
        def lone_login() -> bytes | None:
            with _slow_login(bridge.port) as lone:
                lone.setblocking(True)
                lone.settimeout(10)
                answer = lone.recv(100)
            return None if answer.startswith(b"HTTP/1.1 503 ") else answer

        first = wait_for(lone_login, 10, what="a login slot free again")
        assert first.startswith(b"HTTP/1.1 408 "), "cut off at the deadline"
    finally:
        stop.set()
        attacker.join(10)
        bridge.stop()
    assert max(took) < 5, took
    assert answers.count(b"HTTP/1.1 503 Service Unavailable") >= 56, answers[:10]
    assert b"closed" in answers, "the stranger's new connections close its oldest readers"
