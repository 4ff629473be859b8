"""The demo simulator in its own process, driven like an in-process ``Cluster``.

Why: a test's own threads (polling Prometheus, diagnosing, serving a W&B stand-in) share the
interpreter with an in-process simulator; on a loaded machine they starve it, its answers miss
the scrape timeout, and a healthy host looks blind or down. In its own process the simulator
answers Prometheus on time whatever the test does; the test steers it through its control API.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from harness import processes

ROOT = Path(__file__).resolve().parent.parent  # ``demo`` is a folder of the checkout


class RemoteCluster:
    """The ``Cluster`` methods tests call, sent to ``POST /control/<action>``."""

    def __init__(self, url: str) -> None:
        self.url = url
        groups = requests.get(f"{url}/sd/dcgm", timeout=30).json()
        self.hosts = tuple(g["labels"]["instance"].rsplit(":", 1)[0] for g in groups)

    def _control(self, action: str, **body: Any) -> None:
        resp = requests.post(f"{self.url}/control/{action}", timeout=30,
                             json={k: v for k, v in body.items() if v is not None})
        if resp.status_code != 200:
            raise ValueError(f"simulator refused {action} {body}: {resp.text.strip()}")

    def inject(self, kind: str, host: str, gpu: int | None = None, code: int | None = None,
               device: str | None = None) -> None:
        self._control("fault", kind=kind, host=host, gpu=gpu, code=code, device=device)

    def inject_hosts(self, kind: str, hosts: Iterable[str], gpu: int | None = None) -> None:
        self._control("fault", kind=kind, hosts=list(hosts), gpu=gpu)

    def clear(self, host: str | None = None, gpu: int | None = None, kind: str | None = None,
              device: str | None = None) -> None:
        self._control("clear", host=host, gpu=gpu, kind=kind, device=device)

    def reboot(self, host: str) -> None:
        self._control("reboot", host=host)

    def assign_run(self, entity: str, project: str, run_id: str, hosts: Iterable[str], *,
                   gpus: list[int] | None = None) -> None:
        self._control("run", entity=entity, project=project, run_id=run_id, hosts=list(hosts),
                      gpus=gpus)

    def end_run(self, entity: str, project: str, run_id: str) -> None:
        self._control("end_run", entity=entity, project=project, run_id=run_id)


@dataclass(frozen=True)
class Simulated:
    """A running simulator: the cluster to steer, its base URL and the ``host:port`` to scrape."""

    cluster: RemoteCluster
    url: str
    address: str


@contextlib.contextmanager
def simulator(workdir: Path, hosts: int, flavour: str = "hostname") -> Iterator[Simulated]:
    """``python -m demo.simulator`` on a free port until the block ends."""
    port = processes.free_port()
    cmd = [sys.executable, "-m", "demo.simulator", "--hosts", str(hosts), "--flavour", flavour,
           "--port", str(port), "--log-level", "warning"]
    with processes.running(cmd, workdir, "simulator", port, "/healthz",
                           env={"PYTHONPATH": str(ROOT)}) as service:
        yield Simulated(RemoteCluster(service.url), service.url, f"127.0.0.1:{port}")
