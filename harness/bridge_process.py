"""The real bridge CLI process for the reliability tests: start, kill -9, restart, read metrics.

Every start appends to one log file, so a test can search everything the process ever wrote.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from harness.bridge_payloads import TOKEN
from harness.processes import env_without_proxies, free_port, wait_http

BRIDGE_CLI = (sys.executable, "-m", "wandb_infra.bridge.cli")

ROOT = Path(__file__).resolve().parent.parent
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


@dataclass
class BridgeProcess:
    """One ``wandb-infra-bridge serve`` process on 127.0.0.1."""

    proc: subprocess.Popen
    url: str
    port: int
    log: Path
    env: dict[str, str]

    def post(self, body: dict[str, Any] | bytes, timeout: float = 10.0,
             headers: dict[str, str] | None = None) -> requests.Response:
        """POST a webhook body with the bearer token."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return requests.post(self.url + "/alertmanager", data=data,
                             headers=headers or AUTH, timeout=timeout)

    def metrics(self) -> dict[str, float]:
        """The /metrics samples as {'name{labels}': value}."""
        out: dict[str, float] = {}
        text = requests.get(self.url + "/metrics", timeout=10).text
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def runs(self) -> dict[str, dict[str, Any]]:
        """/runs as JSON, keyed by run id."""
        data = requests.get(self.url + "/runs?format=json", headers=AUTH, timeout=30).json()
        return {r["run_id"]: r for r in data["runs"]}

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        """SIGTERM and wait; kill if it hangs. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


def bridge_env(tmp: Path, *, wandb_url: str | None = None, wandb_key: str | None = None,
               **overrides: str) -> dict[str, str]:
    """Environment configuring a bridge under ``tmp`` (secrets in files, fast timings)."""
    (tmp / "token").write_text(TOKEN + "\n")
    env = env_without_proxies()
    env.update({
        "WANDB_INFRA_BRIDGE__AUTH__BEARER_TOKEN_FILE": str(tmp / "token"),
        "WANDB_INFRA_BRIDGE__STORE__PATH": str(tmp / "state" / "bridge.sqlite"),
        "WANDB_INFRA_BRIDGE__WANDB__MARKERS": "false",
        "WANDB_INFRA_BRIDGE__WANDB__FLUSH_INTERVAL_SECONDS": "0.2",
        "WANDB_INFRA_BRIDGE__WANDB__BACKOFF_BASE_SECONDS": "0.2",
        "WANDB_INFRA_BRIDGE__WANDB__BACKOFF_MAX_SECONDS": "1",
        "WANDB_INFRA_BRIDGE__GRAFANA__BASE_URL": "http://grafana.invalid",
        "WANDB_INFRA_BRIDGE__LOG_LEVEL": "debug",
    })
    if wandb_url and wandb_key:
        (tmp / "wandb-key").write_text(wandb_key + "\n")
        env["WANDB_INFRA_BRIDGE__WANDB__BASE_URL"] = wandb_url
        env["WANDB_INFRA_BRIDGE__WANDB__API_KEY_FILE"] = str(tmp / "wandb-key")
    env.update({f"WANDB_INFRA_BRIDGE__{k.upper()}": v for k, v in overrides.items()})
    return env


def start_bridge(tmp: Path, env: dict[str, str], port: int | None = None) -> BridgeProcess:
    """Start the CLI and wait for /healthz; output is appended to ``tmp/bridge.log``."""
    port = port or free_port()
    log = tmp / "bridge.log"
    with log.open("ab") as handle:
        proc = subprocess.Popen([*BRIDGE_CLI, "serve", "--port", str(port)],
                                stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    bridge = BridgeProcess(proc, f"http://127.0.0.1:{port}", port, log, env)
    try:
        wait_http(bridge.url + "/healthz", proc=proc)
    except BaseException:
        bridge.stop()
        raise
    return bridge


def section_blocks(notes: str) -> list[str]:
    """The numbered issue headlines of the bridge's notes section."""
    return re.findall(r"^\*\*\d+\. (.+?)\*\* \(", notes, flags=re.M)


def raw_status(port: int, method: str, path: str, authorization: bytes) -> int:
    """Send a request with exactly these header bytes; return the status code."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\n".encode()
                     + b"Content-Type: application/json\r\nAuthorization: " + authorization
                     + b"\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        return int(sock.recv(100).split(b" ", 2)[1])
