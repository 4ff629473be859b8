"""Reading a job's console log: a 1 GB interleaved 512-rank log classified end to end, as a ratio
to ``grep -E`` with the catalog's own patterns over the same file in the same run, and the
reader's peak memory at two file sizes (it must not grow with the log).

The log is generated on the fly into a temporary directory (deleted afterwards): NCCL's
communicator lines for 512 ranks on 64 hosts, then training progress from every rank
interleaved with the usual noise (NCCL INFO, Python warnings, DataLoader and checkpoint lines),
and at the end one rank's uncorrectable ECC error followed by the other 511 ranks' watchdog
timeouts, the launcher's SIGTERM fan-out and torchrun's summary. The reader streams the whole
file (no tail budget) in a child process, whose own peak RSS (``ru_maxrss``) is the memory
figure; grep runs with ``LC_ALL=C`` (its fastest mode) and ``-c`` so that printing costs
neither side.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Result
from wandb_infra.catalog.logsignatures import patterns

RANKS = 512
HOSTS = 64
BIG = 1024**3
SMALL = BIG // 8
BLOCK = 8 * 1024**2
FAILED_RANK = 137

READER = """
import json, resource, sys
from wandb_infra.bridge.joblog.reading import Scanner, stream
scanner = Scanner()
lines = 0
for block, first in stream(sys.argv[1]):
    lines += scanner.feed(block, sys.argv[1], 0, first)
reading = scanner.reading()
print(json.dumps({"lines": lines, "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "first": reading.first_error.as_dict() if reading.first_error else None,
                  "cascade_ranks": reading.cascade_ranks}))
"""


def _host(rank: int) -> str:
    return f"gpu-node-{rank // 8:03d}"


def _block(rng: random.Random, step: int) -> bytes:
    """About ``BLOCK`` bytes of interleaved, error-free training output."""
    out: list[str] = []
    size = 0
    while size < BLOCK:
        rank = rng.randrange(RANKS)
        kind = rng.random()
        if kind < 0.80:
            line = (f"[rank{rank}]: iteration {step:>8} | consumed samples {step * 4096:>12} | "
                    f"lm loss {2 + rng.random():.6E} | grad norm {rng.random():.3f} | "
                    f"tokens/s {rng.randrange(9000, 11000)} | lr 1.000E-04")
            step += rank == 0
        elif kind < 0.93:
            line = (f"{_host(rank)}:{4000 + rank}:{4100 + rank} [{rank % 8}] NCCL INFO Channel "
                    f"{rng.randrange(32):02d}/0 : {rank}[{rank % 8}] -> {(rank + 1) % RANKS}"
                    f"[{(rank + 1) % 8}] via P2P/IPC/read")
        elif kind < 0.97:
            line = (f"[rank{rank}]: /opt/venv/lib/python3.11/site-packages/torch/utils/data/"
                    f"dataloader.py:558: UserWarning: This DataLoader will create 16 worker "
                    f"processes in total.")
        else:
            line = (f"[rank{rank}]: saving checkpoint at iteration {step} to /ckpt/iter_"
                    f"{step:07d} in torch_dist format")
        out.append(line)
        size += len(line) + 1
    return ("\n".join(out) + "\n").encode()


def _head() -> bytes:
    return "".join(
        f"{_host(r)}:{4000 + r}:{4000 + r} [{r % 8}] NCCL INFO ncclCommInitRank comm 0x{r:08x} "
        f"rank {r} nranks {RANKS} cudaDev {r % 8} nvmlDev {r % 8} busId {0x18000 + r % 8:x} "
        f"commId 0x5ae77eb5ea4ec1ee - Init COMPLETE\n" for r in range(RANKS)).encode()


def _crash() -> bytes:
    r = FAILED_RANK
    lines = [f"{_host(r)}:{4000 + r}:{4200 + r} [{r % 8}] NCCL WARN Cuda failure "
             f"'uncorrectable ECC error encountered'",
             f"[rank{r}]: RuntimeError: CUDA error: uncorrectable ECC error encountered"]
    for rank in range(RANKS):
        if rank != r:
            lines.append(f"[rank{rank}]:[E303 21:54:35.120 ProcessGroupNCCL.cpp:632] [Rank "
                         f"{rank}] Watchdog caught collective operation timeout: WorkNCCL("
                         f"SeqNum=88123, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)="
                         f"600000) ran for 600073 milliseconds before timing out.")
    lines += [f"W0303 21:54:40.000 api.py:897] Sending process {9000 + k} closing signal "
              "SIGTERM" for k in range(RANKS)]
    return ("\n".join(lines) + "\n").encode()


def generate(path: Path, size: int, blocks: list[bytes]) -> int:
    """Write a log of about ``size`` bytes from the pre-built blocks; returns its size."""
    with open(path, "wb") as handle:
        handle.write(_head())
        written = 0
        i = 0
        while written < size:
            written += handle.write(blocks[i % len(blocks)])
            i += 1
        handle.write(_crash())
    return path.stat().st_size


def _read(path: Path) -> tuple[float, dict]:
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", READER, str(path)], capture_output=True,
                         text=True, check=True, timeout=3600)
    return time.perf_counter() - start, json.loads(out.stdout)


def _grep(path: Path, pattern_file: Path) -> float:
    start = time.perf_counter()
    subprocess.run(["grep", "-E", "-c", "-f", str(pattern_file), str(path)],
                   env={**os.environ, "LC_ALL": "C"}, capture_output=True, check=False,
                   timeout=3600)
    return time.perf_counter() - start


def measure() -> dict[str, float]:
    """Throughput of the reader and of grep on 1 GB, and the reader's peak RSS at 1 GB and
    128 MB."""
    rng = random.Random(35)
    blocks = [_block(rng, 1000 + 5000 * i) for i in range(4)]
    with tempfile.TemporaryDirectory(prefix="bench-joblog-") as tmp:
        big, small, pats = Path(tmp) / "big.log", Path(tmp) / "small.log", Path(tmp) / "pat"
        pats.write_text("\n".join(patterns()) + "\n")
        big_size = generate(big, BIG, blocks)
        generate(small, SMALL, blocks)
        del blocks
        grep_s = min(_grep(big, pats) for _ in range(2))
        read_s, big_out = _read(big)
        _, small_out = _read(small)
    first = big_out["first"] or {}
    assert (first.get("rank"), first.get("host"), first.get("gpu")) == \
        (FAILED_RANK, _host(FAILED_RANK), FAILED_RANK % 8), first
    mb = big_size / 1e6
    return {"mb": mb, "read_mbs": mb / read_s, "grep_mbs": mb / grep_s,
            "rss_big": big_out["rss_kib"] / 1024, "rss_small": small_out["rss_kib"] / 1024,
            "cascade": big_out["cascade_ranks"], "lines": big_out["lines"]}


def run() -> list[Result]:
    """The benchmark rows."""
    m = measure()
    return [
        Result("joblog: classify a 1 GB interleaved 512-rank console log", m["read_mbs"], "MB/s",
               m["grep_mbs"], 0.3 * m["grep_mbs"], lower_is_better=False,
               note=f"{m['mb']:.0f} MB, {m['lines']:,} lines streamed whole (no tail budget) in "
                    "a child process, first error found on rank 137 (gpu-node-017 GPU 1), "
                    f"{m['cascade']} ranks with consequences only; baseline: grep -E -c -f with "
                    "the catalog's patterns, LC_ALL=C, best of 2, same file, same run; target: "
                    "0.3x grep"),
        Result("joblog: reader peak RSS at 1 GB", m["rss_big"], "MiB", m["rss_small"],
               1.25 * m["rss_small"],
               note="the same reader's peak RSS (ru_maxrss of its process) on a 1 GB log; "
                    "baseline: on a 128 MB log of the same kind; target: within 25 % of it "
                    "(memory flat in the file's size)"),
    ]


if __name__ == "__main__":
    for r in run():
        print(json.dumps(r.as_dict()))
