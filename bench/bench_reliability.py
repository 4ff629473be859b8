"""Load held: sustained alerts/s with durable commits and acknowledgement latency (p50, p99)
under concurrent senders, each next to the null receiver of bench_bridge measured in the same run.

Eight senders (Alertmanager sends one notification per group concurrently) each POST 64-alert
notifications with fresh fingerprints as fast as they are acknowledged. The bridge commits every
notification to SQLite (WAL, synchronous=FULL) before its 200; the null receiver only reads the
body. Both run in this process on the same aiohttp stack. Each figure is the median of three
rounds.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_bridge import HEADERS, _Counter, _crash_body, _null_receiver  # noqa: E402
from bench.common import Result  # noqa: E402
from tests import bridge_payloads as bp  # noqa: E402

SENDERS = 8
PER_SENDER = 40
ALERTS = 64
ROUNDS = 3


def _bodies(counter: _Counter, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        body = json.loads(_crash_body(counter, hosts=8, gpus=8))
        body["alerts"] = body["alerts"][:ALERTS]
        out.append(json.dumps(body).encode())
    return out


def _load(url: str, counter: _Counter) -> tuple[float, float, float]:
    """(alerts/s, p50 s, p99 s) for SENDERS concurrent senders, PER_SENDER notifications each."""
    work = [_bodies(counter, PER_SENDER) for _ in range(SENDERS)]
    latencies: list[float] = []
    lock = threading.Lock()
    errors: list[str] = []
    gate = threading.Barrier(SENDERS + 1)

    def sender(bodies: list[bytes]) -> None:
        session = requests.Session()
        mine = []
        gate.wait()
        for body in bodies:
            start = time.perf_counter()
            resp = session.post(url + "/alertmanager", data=body, headers=HEADERS, timeout=60)
            mine.append(time.perf_counter() - start)
            if resp.status_code != 200:
                errors.append(f"HTTP {resp.status_code}")
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=sender, args=(w,)) for w in work]
    for t in threads:
        t.start()
    gate.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} notifications failed: {errors[:3]}")
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    return SENDERS * PER_SENDER * ALERTS / elapsed, statistics.median(latencies), p99


def _rounds(url: str, counter: _Counter) -> tuple[float, float, float]:
    _load(url, counter)  # warm-up
    runs = [_load(url, counter) for _ in range(ROUNDS)]
    return tuple(statistics.median(r[i] for r in runs) for i in range(3))  # type: ignore[return-value]


def run() -> list[Result]:
    """Sustained ingest and ack latency, bridge vs null receiver."""
    counter = _Counter()
    with _null_receiver() as null_url:
        null_rate, null_p50, null_p99 = _rounds(null_url, counter)
    with tempfile.TemporaryDirectory(prefix="bench-reliability-") as tmp:
        ctx = bp.make_context(Path(tmp), max_body_bytes=64 * 1024 * 1024)
        with bp.serve(ctx) as running:
            rate, p50, p99 = _rounds(running.url, counter)
            stored = ctx.store.alert_count()
    expected = (ROUNDS + 1) * SENDERS * PER_SENDER * ALERTS
    if stored != expected:
        raise RuntimeError(f"stored {stored} alerts, expected {expected}")
    note = (f"{SENDERS} concurrent senders x {PER_SENDER} notifications x {ALERTS} alerts, "
            f"every notification committed (WAL, synchronous=FULL) before its 200; "
            f"baseline: null receiver on the same aiohttp stack; median of {ROUNDS} rounds")
    return [
        Result("reliability: sustained ingest, 8 concurrent senders, durable", rate, "alerts/s",
               null_rate, 1536.0, lower_is_better=False, note=note),
        Result("reliability: ack latency p50, 8 concurrent senders", p50, "s", null_p50, 0.25,
               note=note),
        Result("reliability: ack latency p99, 8 concurrent senders", p99, "s", null_p99, 1.0,
               note=note),
    ]


if __name__ == "__main__":
    for r in run():
        print(json.dumps(r.as_dict()))
