"""Asking an outside source of truth (a scheduler command, an API) and failing in one line."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# A scheduler's JSON decodes to about 5x its size in Python objects, so 64 MiB of squeue output
# peaks near 400 MB: under a 512 Mi container limit (docs/reliability.md, exporter section).
MAX_OUTPUT_BYTES = 64 << 20
_STDERR_BYTES = 4096  # enough for the error line we quote; the rest is drained, not kept
_CHUNK = 1 << 20


class SourceError(RuntimeError):
    """An outside source could not answer this time (callers keep their last good answer)."""


def run_command(command: Sequence[str], timeout: float,
                runner: Callable[..., Any] = subprocess.run,
                max_bytes: int = MAX_OUTPUT_BYTES) -> str:
    """A scheduler command's stdout; ``SourceError`` naming the command when it cannot start,
    times out, prints more than ``max_bytes`` or exits non-zero (with the start of its stderr).

    With the default runner the output is read as it comes and the command's process group
    is killed at the deadline or the byte cap, so neither a hang nor a flood costs more than
    ``timeout`` seconds and ``max_bytes`` of memory. Any other runner (a test's stand-in, a
    runner with its own environment) is called as ``subprocess.run`` would be and its output
    is checked against the cap afterwards."""
    if runner is subprocess.run:
        code, stdout, stderr = _bounded(list(command), timeout, max_bytes)
    else:
        try:
            proc = runner(list(command), capture_output=True, text=True, timeout=timeout,
                          check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SourceError(f"{command[0]} failed: {exc}") from exc
        code, stdout, stderr = proc.returncode, str(proc.stdout), str(proc.stderr or "")
        if len(stdout) > max_bytes:
            raise SourceError(_too_large(command, max_bytes))
    if code != 0:
        raise SourceError(f"{' '.join(command)} exited {code}: {stderr.strip()[:300]}")
    return stdout


def _too_large(command: Sequence[str], max_bytes: int) -> str:
    return (f"{' '.join(command)} printed more than {max_bytes} bytes (max_output_bytes); "
            "output refused")


def _bounded(command: list[str], timeout: float, max_bytes: int) -> tuple[int, str, str]:
    """(exit code, stdout, start of stderr), reading both pipes until EOF, the deadline or
    the cap; the command runs in its own session so a wrapper's children die with it."""
    try:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        raise SourceError(f"{command[0]} failed: {exc}") from exc
    assert proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + timeout
    # stdout goes into one anonymous mapping sized for the cap: pages count only once written,
    # so memory follows the bytes actually read and nothing is reallocated or copied as it grows
    out = mmap.mmap(-1, max_bytes + _CHUNK)
    size = 0
    err = bytearray()
    problem = ""
    with out, proc, selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ, out)
        selector.register(proc.stderr, selectors.EVENT_READ, err)
        try:
            while selector.get_map() and not problem:
                left = deadline - time.monotonic()
                if left <= 0:
                    problem = f"{command[0]} failed: timed out after {timeout:g} s"
                    break
                for key, _ in selector.select(left):
                    if key.data is out:
                        read = os.readv(key.fd, [memoryview(out)[size:size + _CHUNK]])
                        size += read
                        if size > max_bytes:
                            problem = _too_large(command, max_bytes)
                    else:
                        chunk = os.read(key.fd, _CHUNK)
                        read = len(chunk)
                        err += chunk[:max(0, _STDERR_BYTES - len(err))]
                    if not read:
                        selector.unregister(key.fileobj)
            if not problem:
                try:
                    proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    problem = f"{command[0]} failed: timed out after {timeout:g} s"
        finally:
            if proc.returncode is None:  # not reaped yet, so its pid still names its group
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if problem:
            raise SourceError(problem)
        return (proc.returncode, str(out[:size], "utf-8", "replace"),
                err.decode("utf-8", "replace"))


def json_list(text: str, command: str, key: str) -> list[Any]:
    """The ``key`` list of a scheduler command's JSON output (``squeue --json`` jobs,
    ``sinfo --json`` nodes); ``SourceError`` naming the command when it is not there."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SourceError(f"{command} output is not JSON: {exc}") from exc
    if not isinstance(data, Mapping) or not isinstance(data.get(key), list):
        raise SourceError(f"{command} output has no '{key}' list")
    return list(data[key])
