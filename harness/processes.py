"""Start and stop the real services the demo, tests and benchmarks need, on loopback.

Every service gets its own free port and temporary directory and is killed when the context exits,
so tests never leak processes or talk beyond 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import requests

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
ALERTMANAGER = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"
AMTOOL = shutil.which("amtool") or "/usr/bin/amtool"
VICTORIA_METRICS = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
VMALERT = shutil.which("vmalert") or "/usr/bin/vmalert"


def _ephemeral_start() -> int:
    """The lowest port Linux gives outgoing connections (32768 unless configured)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports handed to services started later, below the kernel's ephemeral range: a port picked by
# binding port 0 is an ephemeral one, which any outgoing connection on the machine may take as its
# local port before the service binds it (seen: slurmd failing with "Address already in use").
# Every process of every run (tests, the demo) takes the next port from one counter in a locked
# file, so no two of them are handed the same port within a cycle of the range.
PORTS = range(20000, min(32768, _ephemeral_start()))
PORT_COUNTER = Path(tempfile.gettempdir()) / "wandb-infra-ports"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that no process of ours was handed before in this cycle of
    ``PORTS``, that no outgoing connection can take, and that was free a moment ago."""
    with open(PORT_COUNTER, "a+") as counter:
        fcntl.flock(counter, fcntl.LOCK_EX)
        counter.seek(0)
        text = counter.read().strip()
        port = int(text) if text.isdigit() and int(text) in PORTS else PORTS.start
        for _ in PORTS:
            port = port + 1 if port + 1 in PORTS else PORTS.start
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            counter.seek(0)
            counter.truncate()
            counter.write(str(port))
            return port
    raise RuntimeError(f"no free TCP port on 127.0.0.1 in {PORTS.start}-{PORTS.stop - 1}")


T = TypeVar("T")


def wait_for(check: Callable[[], T | None], timeout: float = 30.0, what: str = "condition",
             interval: float = 0.2) -> T:
    """Poll ``check`` until it returns something truthy; raise naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def stays_true(check: Callable[[], object], seconds: float, what: str,
               interval: float = 0.2) -> None:
    """Poll ``check`` for ``seconds`` and fail as soon as it is falsy. A negative check ("nothing
    more arrives") has no event to wait for, only a quiet period; the caller says why ``seconds``
    is long enough for the thing that must not happen to have happened."""
    start = time.monotonic()
    while True:
        if not check():
            raise AssertionError(f"{what} stopped holding after "
                                 f"{time.monotonic() - start:.1f}s of {seconds:g}s")
        if time.monotonic() - start >= seconds:
            return
        time.sleep(interval)


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Poll ``url`` until it answers 200; fail early if ``proc`` died."""
    deadline = time.monotonic() + timeout
    last: str = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was ready")
        try:
            resp = requests.get(url, timeout=2)
            if resp.status_code == 200:
                return
            last = f"HTTP {resp.status_code}"
        except requests.RequestException as exc:
            last = str(exc)
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout}s: {last}")


@dataclass
class Service:
    """A started process, its base URL and where its log goes."""

    proc: subprocess.Popen
    url: str
    workdir: Path
    log: Path

    def stop(self) -> None:
        """Terminate, then kill if it does not exit within 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


# Held while a service process is being created: ``stop_descendants`` takes it for good, so a
# thread starting services cannot add one after the sweep has looked.
_SPAWNING = threading.Lock()


def _spawn(cmd: list[str], workdir: Path, name: str,
           env: Mapping[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
    log = workdir / f"{name}.log"
    handle = log.open("ab")
    with _SPAWNING:
        proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, cwd=workdir,
                                start_new_session=True,
                                env={**env_without_proxies(), **(env or {})})
    handle.close()
    return proc, log


@contextlib.contextmanager
def running(cmd: list[str], workdir: Path, name: str, port: int, ready_path: str, *,
            env: Mapping[str, str] | None = None) -> Iterator[Service]:
    """Start ``cmd`` (logging to workdir/<name>.log, ``env`` over a proxy-free environment),
    wait until ``ready_path`` answers 200 on ``port``, stop it when the block exits; its log
    tail is printed if it fails to start."""
    workdir.mkdir(parents=True, exist_ok=True)
    proc, log = _spawn(cmd, workdir, name, env)
    svc = Service(proc, f"http://127.0.0.1:{port}", workdir, log)
    try:
        wait_http(svc.url + ready_path, proc=proc)
        yield svc
    except BaseException:
        print(log.read_text(errors="replace")[-4000:], file=sys.stderr)
        raise
    finally:
        svc.stop()


def prometheus(
    config: str, workdir: Path, extra_args: tuple[str, ...] = (), port: int | None = None,
) -> contextlib.AbstractContextManager[Service]:
    """Run Prometheus with ``config`` (YAML text written to workdir/prometheus.yml)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    (workdir / "prometheus.yml").write_text(config)
    cmd = [
        PROMETHEUS, f"--config.file={workdir / 'prometheus.yml'}",
        f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle", "--log.level=warn", *extra_args,
    ]
    return running(cmd, workdir, "prometheus", port, "/-/ready")


def alertmanager(config: str, workdir: Path,
                 port: int | None = None) -> contextlib.AbstractContextManager[Service]:
    """Run Alertmanager 0.25 (Debian's prometheus-alertmanager) with ``config``, no clustering."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    (workdir / "alertmanager.yml").write_text(config)
    cmd = [
        ALERTMANAGER, f"--config.file={workdir / 'alertmanager.yml'}",
        f"--storage.path={workdir / 'am-data'}", f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=", "--log.level=warn",
    ]
    return running(cmd, workdir, "alertmanager", port, "/-/ready")


def victoria_metrics(scrape_config: str, workdir: Path,
                     port: int | None = None) -> contextlib.AbstractContextManager[Service]:
    """Run single-node VictoriaMetrics (Debian's package) scraping with a Prometheus-style
    ``scrape_config`` (YAML text with ``global`` and ``scrape_configs`` only)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    (workdir / "scrape.yml").write_text(scrape_config)
    cmd = [
        VICTORIA_METRICS, f"-promscrape.config={workdir / 'scrape.yml'}",
        f"-storageDataPath={workdir / 'vm-data'}", f"-httpListenAddr=127.0.0.1:{port}",
        "-loggerLevel=WARN", "-search.disableCache",
        # Queries at "now" see the newest samples instead of stopping 30 s earlier.
        "-search.latencyOffset=0s",
    ]
    return running(cmd, workdir, "victoria-metrics", port, "/health")


def vmalert(rules: Path, datasource: str, notifier: str, workdir: Path, *, interval: str,
            port: int | None = None) -> contextlib.AbstractContextManager[Service]:
    """Run vmalert on ``rules`` against ``datasource`` (VictoriaMetrics), writing recorded series
    and ``ALERTS`` back to it and sending alerts to the Alertmanager at ``notifier``."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    cmd = [
        VMALERT, f"-rule={rules}", f"-datasource.url={datasource}",
        f"-remoteWrite.url={datasource}", f"-remoteRead.url={datasource}",
        f"-notifier.url={notifier}", f"-evaluationInterval={interval}",
        f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN",
        "-remoteWrite.flushInterval=1s",
    ]
    return running(cmd, workdir, "vmalert", port, "/health")


def prom_query(base_url: str, expr: str, at: float | None = None) -> list[dict]:
    """Instant query; raises on a PromQL error so a broken query fails its test."""
    params: dict[str, str] = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    resp = requests.get(base_url + "/api/v1/query", params=params, timeout=30)
    body = resp.json()
    if body.get("status") != "success":
        raise AssertionError(f"query failed: {expr}: {body.get('error')}")
    return body["data"]["result"]


def env_without_proxies() -> dict[str, str]:
    """The environment with proxy variables removed, so loopback calls never leave the host."""
    return {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}


def descendants(root: int | None = None) -> list[int]:
    """Pids of every living descendant of ``root`` (default: this process), children first.
    Read from /proc, so it also finds what a library started (the wandb SDK's service)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # the parent pid is the 2nd field after the parenthesised command, which may hold spaces
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [os.getpid() if root is None else root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def marked(variable: str, value: str) -> list[int]:
    """Pids of living processes whose environment has ``variable=value``, other than this one.
    Children inherit the environment, so a value set before starting something finds all it
    started, however deep, and even after its parent died and init adopted it."""
    needle = f"{variable}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in environ and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def listening_ports(pid: int) -> list[int]:
    """TCP ports ``pid`` listens on (its sockets in /proc/net/tcp{,6} in state LISTEN)."""
    try:
        inodes = {os.readlink(fd).removeprefix("socket:[").removesuffix("]")
                  for fd in Path(f"/proc/{pid}/fd").iterdir()
                  if os.readlink(fd).startswith("socket:[")}
    except OSError:
        return []
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: TCP_LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a living process (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def terminate(pids: list[int], grace: float = 5.0) -> list[int]:
    """SIGTERM every pid at once, SIGKILL whatever still lives after ``grace`` seconds; returns
    the pids that needed SIGKILL. All at once, so stopping N services takes one grace period,
    not N."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        _reap(pids)
        time.sleep(0.05)
    killed = [p for p in pids if alive(p)]
    for pid in killed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    _reap(killed)
    return killed


def stop_descendants(grace: float = 5.0, rounds: int = 5,
                     mark: tuple[str, str] | None = None) -> None:
    """Stop every descendant of this process, for a signal that may arrive while another thread
    is starting services: no new service starts from here on, and the sweep repeats until it
    finds nothing (a library may have been starting a process of its own), ``rounds`` at most.
    With ``mark`` (an environment variable and value this process set before starting anything),
    each sweep also stops every process carrying it: one whose parent died first (a library's
    helper, stopped together with the service that started it) is adopted by init and is no
    longer a descendant, but it keeps its environment."""
    _SPAWNING.acquire()  # never released: this process is on its way out
    quiet = 0
    for _ in range(rounds):
        pids = descendants()
        if mark is not None:
            pids += [p for p in marked(*mark) if p not in pids]
        if pids:
            terminate(pids, grace)
            quiet = 0
            continue
        quiet += 1
        if quiet == 2:
            return
        time.sleep(0.2)


def _reap(pids: list[int]) -> None:
    """Collect those of ``pids`` that are this process's exited children, so they do not
    linger as zombies (only those: a ``Popen`` elsewhere keeps its own child's status)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


# What a stub answers a GET with: status, Content-Type, body.
Reply = tuple[int, str, bytes]


@contextlib.contextmanager
def http_stub(answer: Callable[[str, Mapping[str, str]], Reply]) -> Iterator[str]:
    """A loopback HTTP server answering every GET with ``answer(path, headers)`` (the tests'
    one stand-in for a small HTTP dependency: a scrape target, Prometheus' query API, a faulty
    proxy); yields ``host:port``."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return

        def do_GET(self) -> None:
            status, content_type, body = answer(self.path, dict(self.headers))
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def scrape_target(text: Callable[[], str]) -> contextlib.AbstractContextManager[str]:
    """A loopback scrape target answering every GET with ``text()`` in Prometheus' text format
    (read at each scrape, so a test changes what Prometheus sees); yields ``host:port``."""
    return http_stub(lambda _path, _headers: (200, "text/plain; version=0.0.4",
                                              text().encode()))
