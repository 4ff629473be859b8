"""A training-job stand-in: a real W&B run whose MFU follows the simulated GPUs.

It creates the run with the real ``wandb`` SDK (offline unless W&B credentials are given), registers
every "rank" (one per host) with the exporter exactly as a user's job would, and logs ``loss`` and
``mfu`` every ``period`` seconds. MFU is computed the way the dashboards' proxy is: tensor-pipe
activity x SM clock / max clock, of the slowest host (a synchronous job runs at its slowest rank's
pace). The (time, mfu) samples it keeps let tests check where the slowdown started.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from wandb_infra.exporter.client import register

TENSOR_METRICS = ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_TENSOR_UTIL_RATIO")
CLOCK_METRICS = ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_SM_CLOCK_HZ")
MAX_SM_CLOCK_MHZ = 1980.0
# Peak MFU the stand-in job reaches when every GPU is busy at full clock (a typical LLM run).
PEAK_MFU = 0.52 / 0.46


def host_mfu(exposition: str) -> float:
    """MFU proxy of one host from its dcgm-exporter text: mean over GPUs of tensor x clock ratio.
    Only the lines of those two families are parsed: a 64-host job reads 64 pages every period,
    and parsing all of each would hold the interpreter for over a second each time."""
    tensor: dict[str, float] = {}
    clock: dict[str, float] = {}
    wanted = "\n".join(line for line in exposition.splitlines()
                       if line.startswith(TENSOR_METRICS + CLOCK_METRICS))
    for family in text_string_to_metric_families(wanted):
        for sample in family.samples:
            gpu = sample.labels.get("gpu", "")
            if sample.name in TENSOR_METRICS:
                tensor[gpu] = sample.value
            elif sample.name in CLOCK_METRICS:
                mhz = sample.value / 1e6 if sample.name.endswith("_HZ") else sample.value
                clock[gpu] = mhz
    if not tensor:
        return 0.0
    ratios = [t * min(1.0, clock.get(g, MAX_SM_CLOCK_MHZ) / MAX_SM_CLOCK_MHZ)
              for g, t in tensor.items()]
    return PEAK_MFU * sum(ratios) / len(ratios)


@dataclass
class TrainingJob:
    """One run on ``hosts``; ``start()`` begins logging in a thread, ``stop()`` finishes the run."""

    entity: str
    project: str
    run_id: str
    hosts: list[str]
    gpus: list[int]
    simulator_url: str
    exporter_url: str
    exporter_token: str
    workdir: Path
    wandb_base_url: str | None = None
    wandb_api_key: str | None = None
    period: float = 2.0
    samples: list[tuple[float, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _run: object = None

    def register(self) -> None:
        """What each rank does right after ``wandb.init``: tell the exporter where it runs."""
        for host in self.hosts:
            environ = {"WANDB_ENTITY": self.entity, "WANDB_PROJECT": self.project,
                       "WANDB_RUN_ID": self.run_id, "WANDB_INFRA_HOSTNAME": host,
                       "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in self.gpus)}
            if not register(self._run, url=self.exporter_url, token=self.exporter_token,
                            ttl=3600, environ=environ):
                raise RuntimeError(f"the exporter refused the registration of {host}")

    def _init_wandb(self) -> object:
        import wandb  # noqa: PLC0415 - the SDK is heavy; only the demo's job needs it

        os.environ.setdefault("WANDB_SILENT", "true")
        online = bool(self.wandb_api_key)
        extra: dict[str, Any] = {}
        if self.wandb_base_url:
            extra["base_url"] = self.wandb_base_url
        if online:
            extra["api_key"] = self.wandb_api_key
        settings = wandb.Settings(mode="online" if online else "offline", x_disable_stats=True,
                                  console="off", **extra)
        self.workdir.mkdir(parents=True, exist_ok=True)
        return wandb.init(entity=self.entity, project=self.project, id=self.run_id,
                          name=f"{self.run_id}-demo", dir=str(self.workdir), settings=settings,
                          reinit="create_new",
                          config={"hosts": len(self.hosts), "gpus_per_host": len(self.gpus)})

    def mfu(self) -> float | None:
        """The job's MFU right now: the slowest host sets the pace. None when the job was
        stopped while reading (a stop never waits for a whole round of hosts)."""
        values = []
        for host in self.hosts:
            if self._stop.is_set():
                return None
            resp = requests.get(f"{self.simulator_url}/dcgm/{host}/metrics", timeout=5)
            values.append(host_mfu(resp.text) if resp.status_code == 200 else 0.0)
        return min(values) if values else 0.0

    def start(self) -> TrainingJob:
        """Create the run, register the ranks, start logging."""
        self._run = self._init_wandb()
        self.register()
        self._thread = threading.Thread(target=self._loop, name=f"job-{self.run_id}", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        step = 0
        while not self._stop.is_set():
            now = time.time()
            try:
                mfu = self.mfu()
            except requests.RequestException:  # a slow answer costs one sample, not the job
                self._stop.wait(self.period)
                continue
            if mfu is None:
                break
            self.samples.append((now, mfu))
            loss = 2.0 + 6.0 * math.exp(-step / 200.0)
            self._run.log({"loss": loss, "mfu": mfu}, step=step)  # type: ignore[attr-defined]
            step += 1
            self._stop.wait(self.period)

    def stop(self, exit_code: int = 0) -> None:
        """Stop logging and finish the run (a crashed job finishes with a non-zero code)."""
        self._stop.set()
        if self._thread is not None:
            # bounded: the loop stops before its next request (at most one 5 s timeout) and
            # must not log into a run finished under it
            self._thread.join()
        if self._run is not None:
            self._run.finish(exit_code=exit_code)  # type: ignore[attr-defined]
            self._run = None

    def drop_window(self, threshold: float = 0.8) -> tuple[float, float] | None:
        """(start, end) of the first period where MFU fell below ``threshold`` x its healthy
        level: the highest median of three consecutive samples, so one spike does not raise it
        and a drop lasting most of the run does not lower it (a percentile of all samples
        would then be the dropped level)."""
        values = [v for _, v in self.samples]
        if len(values) < 3:
            return None
        baseline = max(sorted(values[i:i + 3])[1] for i in range(len(values) - 2))
        start = end = None
        for ts, value in self.samples:
            if value < threshold * baseline:
                start = ts if start is None else start
                end = ts
            elif start is not None:
                break
        return None if start is None else (start, end or start)
