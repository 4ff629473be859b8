"""Ports for services started later come from one counter below the ephemeral range, so no two
processes of a run are handed the same port and no outgoing connection can take one first."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from harness import processes


@pytest.fixture
def counter(tmp_path, monkeypatch):
    path = tmp_path / "ports"
    monkeypatch.setattr(processes, "PORT_COUNTER", path)
    return path


def _ephemeral() -> range:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return range(int(low), int(high) + 1)


def test_concurrent_callers_are_never_handed_the_same_port(counter):
    handed: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        ports = [processes.free_port() for _ in range(40)]
        with lock:
            handed.extend(ports)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(handed) == 320
    assert len(set(handed)) == 320
    assert not set(handed) & set(_ephemeral())


def test_a_port_in_use_is_skipped_and_the_counter_wraps(counter):
    first = processes.PORTS.start
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", first))
        busy.listen()
        counter.write_text(str(processes.PORTS.stop - 1))
        port = processes.free_port()
    # from the range's end the next port is its start, taken, so a later one
    assert first < port < first + 100
    assert counter.read_text() == str(port)


def test_an_unreadable_counter_starts_the_cycle_again(counter):
    counter.write_text("not a port")
    port = processes.free_port()
    assert port in processes.PORTS
    assert port < processes.PORTS.start + 100
