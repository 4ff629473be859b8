"""kill -9 of the bridge process in the middle of an alert storm, then a restart on the same store.

The sender behaves like Alertmanager: it re-POSTs every notification that was not acknowledged
with a 2xx (connection refused, reset, 5xx) until it is, and repeats some acknowledged ones
(``repeat_interval``). Every alert must end up in W&B exactly once: one tag per alert name, one
notes section, one issue block per alert, the user's tags and notes untouched.
"""

from __future__ import annotations

import json
import queue
import random
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import requests

from harness.bridge_payloads import T0, TOKEN, alert, notification
from harness.bridge_process import bridge_env, section_blocks, start_bridge
from harness.processes import wait_for
from harness.wandb_standin import WandbStandin
from wandb_infra.bridge.projection.notes import BEGIN, END

pytestmark = pytest.mark.integration

RUNS = 200
PER_RUN = 10
PER_NOTIFICATION = 30
NAMES = ("GpuXidError", "NodeDown", "InfinibandLinkDown", "GpuThermalViolation",
         "GpuNvlinkErrors")
CATEGORIES = {"GpuXidError": "gpu_hardware", "NodeDown": "node", "InfinibandLinkDown": "network",
              "GpuThermalViolation": "gpu_thermal", "GpuNvlinkErrors": "gpu_interconnect"}


def _storm() -> tuple[list[dict], dict[str, dict[str, str]]]:
    """Notifications of 30 alerts mixing runs; and per run, host -> alert name expected."""
    expected: dict[str, dict[str, str]] = {}
    alerts = []
    for r in range(RUNS):
        run = f"run{r:03d}"
        expected[run] = {}
        for k in range(PER_RUN):
            name = NAMES[(r + k) % len(NAMES)]
            host = f"n{r}x{k}"
            expected[run][host] = name
            # 15 minutes apart: each alert is its own issue (incident gap 10 min).
            alerts.append(alert(name, category=CATEGORIES[name], host=host, run=run,
                                start=T0 + timedelta(minutes=15 * k)))
    random.Random(7).shuffle(alerts)
    bodies = [notification(alerts[i:i + PER_NOTIFICATION])
              for i in range(0, len(alerts), PER_NOTIFICATION)]
    return bodies, expected


class RetryingSender:
    """Alertmanager's contract: keep re-sending until a 2xx; count what was acknowledged."""

    def __init__(self, url: str, bodies: list[dict], hold_from: int, workers: int = 4) -> None:
        self.url = url
        # Bodies from ``hold_from`` on wait for ``resume``: the test lets the bridge start
        # delivering before the rest of the storm, whatever the machine's load.
        self.hold_from = hold_from
        self.resume = threading.Event()
        self.todo: queue.Queue[int] = queue.Queue()
        self.bodies = bodies
        self.acked: set[int] = set()
        self.failures = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]
        for i in range(len(bodies)):
            self.todo.put(i)

    def _work(self) -> None:
        session = requests.Session()
        while True:
            try:
                i = self.todo.get_nowait()
            except queue.Empty:
                return
            if i >= self.hold_from:
                self.resume.wait()
            data = json.dumps(self.bodies[i]).encode()
            while True:
                try:
                    resp = session.post(self.url + "/alertmanager", data=data, timeout=10,
                                        headers={"Content-Type": "application/json",
                                                 "Authorization": f"Bearer {TOKEN}"})
                    if 200 <= resp.status_code < 300:
                        break
                except requests.RequestException:
                    session = requests.Session()
                with self.lock:
                    self.failures += 1
                time.sleep(0.05)  # the sender's retry backoff, not a wait for the bridge
            with self.lock:
                self.acked.add(i)

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "sender did not finish"


def test_kill_9_mid_storm_then_restart_delivers_everything_exactly_once(tmp_path: Path):
    bodies, expected = _storm()
    repeats = bodies[:20]  # repeat_interval re-sends of notifications already acknowledged
    with WandbStandin() as wb:
        for run in expected:
            wb.add_run("team", "proj", run, tags=["user-tag"], notes="User notes.")
        env = bridge_env(tmp_path, wandb_url=wb.url, wandb_key=wb.api_key)
        bridge = start_bridge(tmp_path, env)
        try:
            third = len(bodies) // 3
            sender = RetryingSender(bridge.url, bodies + repeats, hold_from=third)
            sender.start()
            wait_for(lambda: len(sender.acked) >= third, 60,
                     "a third of the storm acknowledged", 0.005)
            wait_for(lambda: len(wb.calls("BridgeUpsertBucket")) > 0, 60,
                     "delivery under way", 0.005)
            sender.resume.set()
            wait_for(lambda: len(sender.acked) >= third + 4, 60,
                     "ingest resumed during delivery", 0.005)
            bridge.kill()
            acked_before_kill = len(sender.acked)
            delivered_before_kill = len(wb.calls("BridgeUpsertBucket"))
            failures_at_kill = sender.failures
            assert 0 < acked_before_kill < len(bodies)
            # Alertmanager keeps retrying against the dead port. Each worker had at most one
            # request in flight when the process died (a reset, counted as a failure); any failure
            # beyond those is a re-send refused by the dead port.
            wait_for(lambda: sender.failures > failures_at_kill + len(sender.threads), 30,
                     "re-sends refused while the bridge is down", 0.01)
            bridge = start_bridge(tmp_path, env, port=bridge.port)
            sender.join(120)
            assert len(sender.acked) == len(bodies) + len(repeats)
            assert delivered_before_kill > 0, "the kill interrupted delivery, not just ingest"

            def all_delivered() -> bool:
                m = bridge.metrics()
                return (m.get("wandb_infra_bridge_queue_runs") == 0
                        and m.get("wandb_infra_bridge_parked_runs") == 0
                        and all(len(wb.run("team", "proj", run).tags) == 1 + len(set(h.values()))
                                for run, h in expected.items()))
            wait_for(all_delivered, 120, "every run delivered", 0.5)
            stored = bridge.runs()
        finally:
            code = bridge.stop()
        assert code == 0
        assert {run: row["alerts"] for run, row in stored.items()} == {
            run: PER_RUN for run in expected}
        for run, hosts in expected.items():
            rec = wb.run("team", "proj", run)
            assert rec.tags[0] == "user-tag" and len(rec.tags) == len(set(rec.tags)), rec.tags
            assert set(rec.tags[1:]) == {f"infra:{n}" for n in hosts.values()}
            assert rec.notes.startswith("User notes.\n\n")
            assert rec.notes.count(BEGIN) == 1 and rec.notes.count(END) == 1
            blocks = section_blocks(rec.notes)
            assert len(blocks) == PER_RUN, blocks
            for host, name in hosts.items():
                assert blocks.count(f"{name} on {host}") == 1, (run, host, blocks)
    log = (tmp_path / "bridge.log").read_text()
    assert wb.api_key not in log
