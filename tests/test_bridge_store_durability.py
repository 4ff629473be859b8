"""Durability is checked, not assumed.

Deleting the store's WAL (or database) file under a running bridge used to leave it answering 200,
with /readyz 200, into a file that was gone at the next restart (40 of 40 acknowledged
notifications lost). Now the lost file is noticed on the next write (and by /readyz), answered
503, healed from the bridge's open descriptors, and nothing acknowledged is lost. A store written
by a newer bridge is refused with one line.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess

import pytest
import requests

from harness.bridge_payloads import alert, notification
from harness.bridge_process import BRIDGE_CLI, ROOT, bridge_env, start_bridge
from wandb_infra.bridge.ingest.schema import SCHEMA_VERSION
from wandb_infra.bridge.ingest.store import Store, StoreError, StoreTooNew


def _body(index: int) -> dict:
    return notification([alert("GpuXidError", category="gpu_hardware", host=f"h{index % 4}",
                               gpu="0", run=f"r{index % 5}", extra={"seq": str(index)})])


def _send(bridge, index: int, statuses: list[int]) -> None:
    """Like Alertmanager: re-POST until a 2xx."""
    for _ in range(50):
        status = bridge.post(_body(index)).status_code
        statuses.append(status)
        if 200 <= status < 300:
            return
    raise AssertionError(f"notification {index} never acknowledged: {statuses[-5:]}")


def _count(path) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT COUNT(*) FROM alerts").fetchone()[0]
    finally:
        conn.close()


@pytest.mark.integration
@pytest.mark.parametrize("victim", ["-wal", ""])
def test_deleting_a_store_file_mid_stream_loses_no_acknowledged_alert(tmp_path, victim):
    env = bridge_env(tmp_path)
    store = tmp_path / "state" / "bridge.sqlite"
    bridge = start_bridge(tmp_path, env)
    statuses: list[int] = []
    try:
        for index in range(20):
            _send(bridge, index, statuses)
        os.unlink(str(store) + victim)
        first = requests.get(bridge.url + "/readyz", timeout=10)
        assert first.status_code == 503, first.text
        assert str(store) not in first.text  # /readyz names no path
        healed = requests.get(bridge.url + "/readyz", timeout=10)
        assert healed.status_code == 200, healed.text
        for index in range(20, 40):
            _send(bridge, index, statuses)
        # the same again, the detection being left to the webhook
        os.unlink(str(store) + victim)
        for index in range(40, 60):
            _send(bridge, index, statuses)
    finally:
        bridge.kill()  # no shutdown code: what is on disk is all there is
    assert _count(store) == 60
    assert 503 in statuses  # the notification that found the loss was refused, then retried
    log = bridge.log.read_text()
    assert "store file lost under the running bridge" in log
    again = start_bridge(tmp_path, env)
    try:
        runs = again.runs()
        assert sum(r["alerts"] for r in runs.values()) == 60
    finally:
        again.stop()


def test_a_replaced_database_is_saved_aside_and_refused_once(tmp_path):
    path = tmp_path / "b.sqlite"
    store = Store(path)
    store.probe()
    os.rename(path, tmp_path / "moved.sqlite")
    Store(path).close()  # a new, empty store put at the path
    with pytest.raises(StoreError, match="database file was replaced"):
        store.probe()
    store.probe()  # healed: the replacement is used
    assert list(tmp_path.glob("b.sqlite.replaced-*"))


@pytest.mark.integration
def test_a_store_from_a_newer_bridge_is_refused(tmp_path):
    path = tmp_path / "state" / "bridge.sqlite"
    path.parent.mkdir()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreTooNew, match="newer bridge"):
        Store(path)
    env = bridge_env(tmp_path)
    proc = subprocess.run([*BRIDGE_CLI, "serve", "--port", "0", "--log-level", "info"], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"schema version {SCHEMA_VERSION + 1}" in lines[0], proc.stderr
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1  # untouched
    conn.close()
