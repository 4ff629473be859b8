"""Load held: sustained alerts/s with durable commits and acknowledgement latency (p50, p99)
under concurrent senders, each next to the null receiver of bench_bridge measured in the same run;
and limits held by the real bridge process with its default configuration: peak memory under 30
concurrent 7.7 MB notifications, and descriptors held under 2,000 idle sockets.

Eight senders (Alertmanager sends one notification per group concurrently) each POST 64-alert
notifications with fresh fingerprints as fast as they are acknowledged. The bridge commits every
notification to SQLite (WAL, synchronous=FULL) before its 200; the null receiver only reads the
body. Both run in this process on the same aiohttp stack. Each figure is the median of three
rounds.
"""

from __future__ import annotations

import json
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import requests

from bench.bench_bridge import HEADERS, _Counter, _crash_body, _null_receiver
from bench.common import Result
from harness import bridge_payloads as bp
from harness.bridge_process import AUTH, bridge_env, start_bridge
from harness.exporter_process import running_exporter

ROOT = Path(__file__).resolve().parent.parent

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


LARGE = 30
IDLE = 2000


def _large_body(counter: _Counter) -> bytes:
    """About 7.3 MB of small alerts (the costly shape: memory goes with the number of objects):
    the 1,536-alert crash repeated with fresh fingerprints."""
    body = json.loads(_crash_body(counter))
    crash = body["alerts"]
    body["alerts"] = []
    while len(json.dumps(body)) < 7_300_000:
        rep = counter.next()
        body["alerts"] += [{**a, "fingerprint": f"{rep:06x}{i:010x}"} for i, a in enumerate(crash)]
    return json.dumps(body).encode()


def _status(pid: int, field: str) -> float:
    """A kB field of /proc/<pid>/status (VmHWM is the peak resident set) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


def _inflight_max(url: str, stop: threading.Event) -> list[float]:
    """Sample the bridge's ``inflight_body_bytes`` gauge until ``stop``; returns [max seen]."""
    seen = [0.0]

    def poll() -> None:
        session = requests.Session()
        while not stop.is_set():
            for line in session.get(url + "/metrics", timeout=10).text.splitlines():
                if line.startswith("wandb_infra_bridge_inflight_body_bytes "):
                    seen[0] = max(seen[0], float(line.split()[1]))
            time.sleep(0.005)

    threading.Thread(target=poll, daemon=True).start()
    return seen


def _large_notifications(tmp: Path) -> tuple[float, float, int, float, float]:
    """(peak RSS MB, RSS MB before the senders, 503 answers, size MB, most bytes in flight at
    once in MB) for LARGE concurrent large notifications, each re-sent after a 503 as
    Alertmanager would, until all are stored."""
    counter = _Counter()
    bodies = [_large_body(counter) for _ in range(LARGE)]
    bridge = start_bridge(tmp, bridge_env(tmp))
    busy: list[int] = []
    gate = threading.Barrier(LARGE)

    def sender(body: bytes) -> None:
        gate.wait()
        while True:
            resp = requests.post(bridge.url + "/alertmanager", data=body, headers=AUTH,
                                 timeout=300)
            if resp.status_code == 200:
                return
            if resp.status_code != 503:
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
            busy.append(1)
            time.sleep(0.2)

    stop = threading.Event()
    try:
        idle = _status(bridge.proc.pid, "VmRSS")
        inflight = _inflight_max(bridge.url, stop)
        threads = [threading.Thread(target=sender, args=(b,)) for b in bodies]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        peak = _status(bridge.proc.pid, "VmHWM")
    finally:
        stop.set()
        bridge.stop()
    return peak, idle, len(busy), len(bodies[0]) / 1e6, inflight[0] / 1e6


def _idle_sockets(tmp: Path) -> tuple[int, int, float]:
    """(descriptors the bridge holds, sockets it kept, seconds to answer /healthz with the
    flood held) with IDLE idle connections opened against the default limits."""
    bridge = start_bridge(tmp, bridge_env(tmp))
    held = []
    try:
        for _ in range(IDLE):
            held.append(socket.create_connection(("127.0.0.1", bridge.port)))
        time.sleep(1)
        fds = len(list(Path(f"/proc/{bridge.proc.pid}/fd").iterdir()))
        kept = 0
        for sock in held:
            sock.setblocking(False)
            try:
                kept += sock.recv(1) != b""
            except BlockingIOError:
                kept += 1
            except ConnectionResetError:
                pass
        start = time.perf_counter()
        if requests.get(bridge.url + "/healthz", timeout=10).status_code != 200:
            raise RuntimeError("/healthz failed during the idle flood")
        answered = time.perf_counter() - start
    finally:
        for sock in held:
            sock.close()
        bridge.stop()
    return fds, kept, answered


CAP_ENTRIES, CAP_SERIES = 100_000, 180_000


def _pid_with(argument: str) -> int:
    """The process whose command line contains ``argument``."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if argument.encode() in (proc / "cmdline").read_bytes().split(b"\0"):
                    return int(proc.name)
            except OSError:
                continue
    raise RuntimeError(f"no process with {argument}")


def _exporter_at_cap(tmp: Path) -> tuple[float, float, float]:
    """(peak RSS MB, first scrape s, /metrics MB) of the real exporter filled to its default
    caps: 100,000 registrations publishing 180,000 series (80,000 with one GPU)."""
    (tmp / "token").write_text(bp.TOKEN)
    headers = {"Authorization": f"Bearer {bp.TOKEN}"}
    with running_exporter({"auth": {"token_file": str(tmp / "token")}}, tmp / "run") as url:
        def register(part: int) -> None:
            session = requests.Session()
            for i in range(part, CAP_ENTRIES, 8):
                gpus = [0] if i < CAP_SERIES - CAP_ENTRIES else []
                body = {"entity": "team", "project": "proj", "run_id": f"run{i // 8:06d}",
                        "hostname": f"gpu-node-{i:06d}", "gpus": gpus,
                        "slurm_job_id": str(100000 + i), "ttl_seconds": 86400}
                resp = session.post(url + "/v1/runs", json=body, headers=headers, timeout=30)
                if resp.status_code != 201:
                    raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
        threads = [threading.Thread(target=register, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        start = time.perf_counter()
        size = len(requests.get(url + "/metrics", timeout=300).content)
        scrape = time.perf_counter() - start
        peak = _status(_pid_with(str(tmp / "run" / "exporter.yaml")), "VmHWM")
    return peak, scrape, size / 1e6


def run() -> list[Result]:
    """Sustained ingest and ack latency, bridge vs null receiver; memory and socket limits."""
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
        *_limits(),
    ]


def _limits() -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="bench-limits-") as tmp:
        for part in ("memory", "idle", "exporter"):
            (Path(tmp) / part).mkdir()
        peak, idle, busy, size, inflight = _large_notifications(Path(tmp) / "memory")
        fds, kept, answered = _idle_sockets(Path(tmp) / "idle")
        exporter_peak, scrape, exposition = _exporter_at_cap(Path(tmp) / "exporter")
    held = inflight / size  # notifications in flight at once (bounded by max_inflight_bytes)
    return [
        Result(f"reliability: bridge peak RSS, {LARGE} concurrent {size:.1f} MB notifications",
               peak, "MB", None, 1024.0,
               note=f"real process, default limits (32 MiB of bodies in flight); {busy} "
                    "answers were 503 + Retry-After and re-sent until all were stored; "
                    "target: the shipped Kubernetes limit (1 Gi)"),
        Result("reliability: bridge memory per in-flight notification", (peak - idle) / held,
               "MB", size, 3 * size,
               note=f"(peak RSS {peak:.1f} MB - RSS before the senders {idle:.1f} MB) / "
                    f"{held:.1f} notifications in flight at once (most seen in "
                    f"inflight_body_bytes: {inflight:.1f} MB); baseline: one notification's "
                    f"size ({size:.2f} MB), so ratio is memory per notification / its size; "
                    "target: 3x its size"),
        Result(f"reliability: sockets kept open under {IDLE} idle connections", kept,
               "sockets", None, 512.0,
               note=f"real process, default limits; older idle ones evicted; {fds} descriptors "
                    f"in all; /healthz answered in {answered * 1000:.1f} ms with the flood "
                    "held; target: half the common nofile limit of 1024"),
        Result("reliability: exporter peak RSS at its default caps", exporter_peak, "MB", None,
               512.0, note=f"real process, {CAP_ENTRIES} registrations publishing {CAP_SERIES} "
                           f"series; first scrape {scrape:.2f} s, {exposition:.1f} MB; target: "
                           "the shipped Kubernetes limit (512 Mi)"),
    ]


if __name__ == "__main__":
    for r in run():
        print(json.dumps(r.as_dict()))
