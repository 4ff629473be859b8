"""W&B failing under the real bridge process: an outage (503, then 429 + Retry-After, then
writes hanging past the client timeout, then recovery) and permanent failures (unknown run,
403, 400, revoked key).

Also the log check of the auth item: everything the process logged while W&B failed is searched
for the API key (raw and as the Basic credential it is sent as) and the webhook token.
"""

from __future__ import annotations

import base64
import itertools
import time
from datetime import timedelta
from pathlib import Path

import pytest
import requests

from harness.bridge_payloads import T0, TOKEN, alert, notification
from harness.bridge_process import BridgeProcess, bridge_env, section_blocks, start_bridge
from harness.processes import stays_true, wait_for
from harness.wandb_standin import WandbStandin

pytestmark = pytest.mark.integration

RUNS = [f"r{i:02d}" for i in range(20)]
TRANSIENT = 'wandb_infra_bridge_deliveries_total{outcome="transient"}'
OLDEST = "wandb_infra_bridge_oldest_undelivered_seconds"


def _assert_no_secrets(bridge: BridgeProcess, wb: WandbStandin) -> None:
    basic = base64.b64encode(f"api:{wb.api_key}".encode()).decode()
    log = bridge.log.read_text()
    assert log.count("\n") > 5, "the process logged"
    for secret in (wb.api_key, basic, TOKEN):
        assert secret not in log
    for path in ("/metrics", "/healthz", "/readyz"):
        text = requests.get(bridge.url + path, timeout=10).text
        assert wb.api_key not in text and TOKEN not in text and basic not in text


def _node_down(run: str, host: str, minutes: int = 0, end: bool = False) -> dict:
    start = T0 + timedelta(minutes=minutes)
    return alert("NodeDown", category="node", host=host, run=run, start=start,
                 end=start + timedelta(minutes=5) if end else None)


def test_outage_503_then_429_retry_after_then_recovery(tmp_path: Path):
    with WandbStandin() as wb:
        for run in [*RUNS, "ordered"]:
            wb.add_run("team", "proj", run)
        wb.fail(503, times=None)
        bridge = start_bridge(tmp_path, bridge_env(tmp_path, wandb_url=wb.url,
                                                   wandb_key=wb.api_key,
                                                   WANDB__TIMEOUT_SECONDS="0.5"))
        try:
            t_down = time.monotonic()

            def refused_attempt_after(acked: float) -> None:
                """W&B refused a delivery attempt that began after the update acknowledged at
                ``acked``: each later update of "ordered" lands on a backlog already failing."""
                wait_for(lambda: wb.calls(since=acked), 30,
                         "a delivery attempt (refused with 503) after the update")

            assert bridge.post(notification([_node_down(r, f"h{r}") for r in RUNS])).ok
            assert bridge.post(notification([_node_down("ordered", "ha")])).ok
            refused_attempt_after(time.monotonic())
            assert bridge.post(notification([_node_down("ordered", "hb", minutes=20)])).ok
            refused_attempt_after(time.monotonic())
            assert bridge.post(notification([_node_down("ordered", "ha", end=True)])).ok

            def backlog_aged() -> bool:
                m = bridge.metrics()
                return m.get(TRANSIENT, 0) >= 2 and m.get(OLDEST, 0) >= 2
            wait_for(backlog_aged, 30, "the metrics showing a backlog at least 2 s old and "
                     "at least 2 transient delivery failures")
            m = bridge.metrics()
            assert m["wandb_infra_bridge_queue_runs"] == len(RUNS) + 1
            assert m[OLDEST] >= 2
            assert m[TRANSIENT] >= 2
            down = wb.calls(since=t_down)
            assert len(down) / (time.monotonic() - t_down) <= 3, "no retry storm while down"
            assert all(r.status == 503 for r in down)

            wb.clear_faults()
            wb.fail(429, times=None, retry_after="1.5")
            t_limited = time.monotonic()

            def two_gaps_heard() -> list[float] | None:
                """The gaps after 429s the bridge heard, once there are two. A 429 the
                stand-in wrote more than 0.25 s after the request arrived may have reached a
                client that had already given up (0.5 s timeout, its clock started earlier):
                that client saw a timeout, not the Retry-After, so its gap is not checked."""
                got = wb.calls(since=t_limited)
                gaps = [b.at - a.at for a, b in itertools.pairwise(got)
                        if a.answered and a.answered - a.at <= 0.25]
                return gaps if len(gaps) >= 2 else None
            gaps = wait_for(two_gaps_heard, 30, "two calls after a 429 the bridge heard")
            limited = wb.calls(since=t_limited)
            wb.clear_faults()
            assert all(r.status == 429 for r in limited if r.answered), limited
            assert min(gaps) >= 1.45, f"Retry-After 1.5 s not respected: {gaps}"

            # Writes that hang past the client timeout but are applied by W&B afterwards:
            # the retry must not duplicate anything.
            wb.slow(1.5, times=None, operation="BridgeUpsertBucket")
            t_hung = time.monotonic()
            # Every upsert now answers after 1.5 s, past the 0.5 s client timeout: wait until one
            # has been applied late (answered 200 after the client gave up), so the retry reads a
            # run that already carries the write it believes failed.
            wait_for(lambda: [r for r in wb.calls("BridgeUpsertBucket", since=t_hung)
                              if r.status == 200], 30,
                     "an upsert applied by W&B after the client timed out")
            # read before recovery: no write can succeed while every upsert hangs
            assert bridge.metrics()["wandb_infra_bridge_queue_runs"] > 0
            wb.clear_faults()

            wait_for(lambda: bridge.metrics()["wandb_infra_bridge_queue_runs"] == 0, 30,
                     what="backlog drained")
            m = bridge.metrics()
            assert m["wandb_infra_bridge_oldest_undelivered_seconds"] == 0
            assert m["wandb_infra_bridge_parked_runs"] == 0
            for run in RUNS:
                assert wb.run("team", "proj", run).tags == ["infra:NodeDown"]
            notes = wb.run("team", "proj", "ordered").notes
            assert section_blocks(notes) == ["NodeDown on ha", "NodeDown on hb"]
            # Per-run order: every successful write of this run shows the state it had at
            # that time or later; the resolved issue is never shown open again.
            storage = wb.run("team", "proj", "ordered").storage_id
            writes = [r.variables["notes"] for r in wb.calls("BridgeUpsertBucket")
                      if r.status == 200 and r.variables["id"] == storage]
            assert writes and "(resolved" in writes[0].split("NodeDown on hb")[0]
            _assert_no_secrets(bridge, wb)
        finally:
            assert bridge.stop() == 0


def test_permanent_failures_are_parked_counted_and_not_retried(tmp_path: Path):
    with WandbStandin() as wb:
        good = ["p1", "p2", "p3", "p4", "p5", "p6"]
        for run in good:
            wb.add_run("team", "proj", run)
        wb.fail(403, times=1, operation="BridgeRun")
        wb.fail(400, times=1, operation="BridgeUpsertBucket")
        bridge = start_bridge(tmp_path, bridge_env(tmp_path, wandb_url=wb.url,
                                                   wandb_key=wb.api_key))
        try:
            assert bridge.post(notification([_node_down(r, f"h{r}")
                                             for r in ["zghost", *good]])).ok

            def states() -> dict[str, str]:
                return {r: row["wandb"]["state"] for r, row in bridge.runs().items()}
            wait_for(lambda: set(states().values()) <= {"parked", "delivered"}, 20,
                     what="every run delivered or parked")
            runs = bridge.runs()
            parked = {r: row["wandb"]["reason"] for r, row in runs.items()
                      if row["wandb"]["state"] == "parked"}
            assert len(parked) == 3 and "zghost" in parked
            reasons = " | ".join(parked.values())
            assert "not found" in reasons and "HTTP 403" in reasons and "HTTP 400" in reasons
            delivered = [r for r in good if r not in parked]
            for run in delivered:
                assert wb.run("team", "proj", run).tags == ["infra:NodeDown"]
            m = bridge.metrics()
            assert m["wandb_infra_bridge_parked_runs"] == 3
            assert m['wandb_infra_bridge_deliveries_total{outcome="parked"}'] == 3
            calls = len(wb.requests)
            # A retry would come within ~1.2 s: the worker looks at the outbox at least every
            # second (flush interval 0.2 s, backoff at most 1 s in bridge_env), and no delivered
            # run is re-checked before state_check_interval (300 s). 2.5 s covers two such rounds.
            stays_true(lambda: len(wb.requests) == calls, 2.5,
                       "no W&B request after every run was delivered or parked "
                       "(parked runs are not retried)")

            wb.revoke()
            assert bridge.post(notification([_node_down(r, f"x{r}", minutes=30)
                                             for r in delivered])).ok
            wait_for(lambda: bridge.metrics()["wandb_infra_bridge_parked_runs"]
                     == 3 + len(delivered), 20, what="revoked key parks every run")
            assert all("401" in row["wandb"]["reason"] for r, row in bridge.runs().items()
                       if r in delivered)
            rejected = len(wb.rejected)
            assert rejected == len(delivered), "one attempt per run, then parked"
            # as above: a retry of a run parked by the 401 would come within ~1.2 s
            stays_true(lambda: len(wb.rejected) == rejected and len(wb.requests) == calls, 2.5,
                       "no W&B request after the revoked key parked every run")
            _assert_no_secrets(bridge, wb)
        finally:
            assert bridge.stop() == 0
