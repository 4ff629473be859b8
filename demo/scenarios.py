"""The demo's fault scenarios, each a function over a running ``Stack``.

1. ``xid94_cascade``: a 64-host x 8-GPU run; XID 94 (contained ECC) on one GPU of one host, then
   every host of the run stalls (the NCCL hang that follows). Expected: one issue whose root cause
   is the XID 94 host and GPU; every stall a consequence; a restart is safe without draining the
   node (XID 94 needs only an application restart).
2. ``thermal_slowdown``: thermal violation on one host of a 2-host run: clocks and tensor activity
   drop, so does the job's MFU. Expected: a thermal issue starting inside the MFU drop; a second
   run on the other GPUs of the same hosts untouched.
3. ``ib_flap``: an InfiniBand port flapping under a run.
4. ``host_lost``: a host of a run stops answering (node_exporter and dcgm-exporter gone).
5. ``gpu_reset``: XID 95 needs a GPU reset: unsafe to restart until the GPU is reset, then safe.

Each returns the bridge's view of the affected run (JSON, as ``GET /runs/<e>/<p>/<id>`` serves it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import requests

from demo.stack import Stack
from demo.trainer import TrainingJob
from harness.processes import wait_for
from wandb_infra.catalog import series
from wandb_infra.catalog.alerts import STALL_PRIOR_ACTIVITY_MIN

ENTITY = "demo"
GPUS = list(range(8))
HALF_A, HALF_B = [0, 1, 2, 3], [4, 5, 6, 7]


@dataclass
class RunRef:
    """entity/project/run id of a scenario's run."""

    entity: str
    project: str
    run_id: str

    @property
    def path(self) -> str:
        """``entity/project/run_id``."""
        return f"{self.entity}/{self.project}/{self.run_id}"


def start_job(stack: Stack, run: RunRef, hosts: list[str], gpus: list[int]) -> TrainingJob:
    """Start a training-job stand-in on ``hosts`` and wait until Prometheus sees it working."""
    assert stack.simulator and stack.exporter
    job = TrainingJob(
        run.entity, run.project, run.run_id, hosts, gpus, simulator_url=stack.simulator.url,
        exporter_url=stack.exporter.url, exporter_token=stack.token,
        workdir=stack.workdir / "jobs" / run.run_id,
        wandb_base_url=stack.config.wandb_base_url if stack.config.jobs_online else None,
        wandb_api_key=stack.config.wandb_api_key if stack.config.jobs_online else None).start()
    # both exporters of every host read at least once: a fault injected before a host's first
    # scrape would be its normal state to Prometheus (a port never seen up is an unused one)
    host_re = "|".join(hosts)
    wait_for(lambda: len(stack.query(f'up{{instance=~"({host_re}):.*"}} == 1')) == 2 * len(hosts),
             120, f"both exporters of {run.path}'s hosts scraped")
    selector = f'wandb_run_id="{run.run_id}"'
    expected = len(hosts) * len(gpus)
    wait_for(lambda: len(stack.query(f"wandb_run_gpu_info{{{selector}}}")) == expected,
             120, f"join metrics of {run.path} in Prometheus")
    # the stall alert needs the GPUs seen computing, and no longer listed as idle all hour
    gpu_re = "|".join(str(g) for g in gpus)
    busy = series.dcgm_gpu(series.DCGM_TENSOR_ACTIVE, host_re, gpu_re, "max_over_time", "1h")
    active = f"count by (Hostname, hostname) ({busy} > {STALL_PRIOR_ACTIVITY_MIN})"
    wait_for(lambda: len(stack.query(active)) == len(hosts), 120,
             f"{run.path} to be seen active on every host")
    idle = f'{series.GPU_IDLE_1H}{{hostname=~"{host_re}",gpu=~"{gpu_re}"}}'
    wait_for(lambda: not stack.query(idle), 120, f"{run.path}'s GPUs to leave the idle record")
    return job


def run_view(stack: Stack, run: RunRef) -> dict[str, Any]:
    """The bridge's JSON view of one run (no issues yet: an empty view)."""
    try:
        return stack.bridge_json(f"/runs/{run.path}")
    except requests.HTTPError as exc:
        if exc.response is not None and exc.response.status_code == 404:
            return {"entity": run.entity, "project": run.project, "run_id": run.run_id,
                    "issues": []}
        raise


def _alertnames(view: dict[str, Any]) -> list[str]:
    return [a["alertname"] for issue in view.get("issues", [])
            for a in [issue["root_cause"], *issue["consequences"]]]


def xid94_cascade(stack: Stack, hosts: list[str], timeout: float = 240,
                  faulty: int = 16) -> tuple[RunRef, dict]:
    """Scenario 1: XID 94 on one GPU (GPU 3 of ``hosts[faulty]``), then the whole run hangs."""
    run = RunRef(ENTITY, "llm-pretrain", "cascade64")
    job = start_job(stack, run, hosts, GPUS)
    faulty_host, faulty_gpu = hosts[faulty], 3
    stack.cluster.inject("xid", faulty_host, gpu=faulty_gpu, code=94)
    # the root cause's alert is active (so its start is set) before the cascade begins
    xid = f'ALERTS{{alertname="GpuContainedEccError",hostname="{faulty_host}"}}'
    wait_for(lambda: stack.query(xid), 60, f"{xid} in Prometheus", 0.5)
    for host in hosts:
        stack.cluster.inject("stall", host)

    def settled() -> dict | None:
        view = run_view(stack, run)
        stalled = {a["hostname"] for issue in view.get("issues", [])
                   for a in issue["consequences"] if a["alertname"] == "TrainingStalled"}
        return view if stalled >= set(hosts) else None

    try:
        view = wait_for(settled, timeout, "TrainingStalled on every host in the bridge", 2.0)
    finally:
        job.stop(exit_code=1)
    return run, view


def restart_verdict(stack: Stack, run: RunRef, wanted: str, timeout: float = 90,
                    contains: str = "") -> dict:
    """Wait until the run's restart verdict is ``wanted`` (and its detail says ``contains``)."""
    seen: list[dict] = [{}]

    def verdict() -> dict | None:
        rem = seen[0] = run_view(stack, run).get("remediation") or {}
        ok = rem.get("verdict") == wanted and contains in str(rem.get("detail", ""))
        return rem if ok else None

    try:
        return wait_for(verdict, timeout, f"a {wanted} restart verdict for {run.path}", 1.0)
    except TimeoutError as exc:  # say what it showed instead
        raise TimeoutError(f"{exc}; last seen: {seen[0].get('verdict')}: "
                           f"{seen[0].get('detail')}") from None


def gpu_reset(stack: Stack, host: str, gpu: int = 5, timeout: float = 180
              ) -> tuple[RunRef, dict, dict]:
    """Scenario 5: XID 95 (uncontained ECC) on one GPU needs a GPU reset. The restart is unsafe
    while the driver's recovery action asks for it and the node is schedulable; an operator
    resets the GPU (the simulator clears the XID and the recovery action, as ``nvidia-smi -r``
    does) and the verdict turns safe without the node ever leaving the pool. Returns the run and
    its remediation before and after."""
    run = RunRef(ENTITY, "llm-pretrain", "reset5")
    job = start_job(stack, run, [host], GPUS)
    stack.cluster.inject("xid", host, gpu=gpu, code=95)
    try:
        before = restart_verdict(stack, run, "unsafe", timeout,
                                 "the driver still asks for a GPU reset")
        stack.cluster.clear(host, gpu=gpu, kind="xid")
        after = restart_verdict(stack, run, "safe", timeout, "was reset at")
    finally:
        job.stop(exit_code=1)
    return run, before, after


def thermal_slowdown(stack: Stack, hosts: list[str], timeout: float = 240,
                     ) -> tuple[RunRef, dict, TrainingJob, RunRef]:
    """Scenario 2: one host throttles; a neighbour run on the same hosts' other GPUs."""
    run = RunRef(ENTITY, "llm-finetune", "thermal2")
    neighbour = RunRef(ENTITY, "eval-sweep", "neighbour")
    job = start_job(stack, run, hosts, HALF_A)
    other = start_job(stack, neighbour, hosts, HALF_B)
    # a healthy baseline for the drop window: six MFU samples (five periods) before the fault
    wait_for(lambda: len(job.samples) >= 6, 60, f"six MFU samples of {run.path}", 0.2)
    for gpu in HALF_A:
        stack.cluster.inject("thermal", hosts[0], gpu=gpu)

    def thermal_issue() -> dict | None:
        view = run_view(stack, run)
        return view if "GpuThermalViolation" in _alertnames(view) else None

    try:
        view = wait_for(thermal_issue, timeout, "GpuThermalViolation in the bridge", 2.0)
        seen = len(job.samples)  # two more samples, so the drop window has an end
        wait_for(lambda: len(job.samples) >= seen + 2, 60, f"two more MFU samples of {run.path}",
                 0.2)
    finally:
        job.stop()
        other.stop()
    return run, view, job, neighbour


def ib_flap(stack: Stack, hosts: list[str], timeout: float = 180) -> tuple[RunRef, dict]:
    """Scenario 3: one InfiniBand port of a run's host flaps."""
    run = RunRef(ENTITY, "llm-pretrain", "ibflap3")
    job = start_job(stack, run, hosts, GPUS)
    stack.cluster.inject("ib_flap", hosts[0], device="mlx5_0")

    def flapping() -> dict | None:
        view = run_view(stack, run)
        return view if "InfinibandLinkFlapping" in _alertnames(view) else None

    try:
        view = wait_for(flapping, timeout, "InfinibandLinkFlapping in the bridge", 2.0)
    finally:
        job.stop()
    return run, view


def host_lost(stack: Stack, hosts: list[str], timeout: float = 180) -> tuple[RunRef, dict]:
    """Scenario 4: a host of a run goes silent."""
    run = RunRef(ENTITY, "llm-pretrain", "hostlost4")
    job = start_job(stack, run, hosts, GPUS)
    stack.cluster.inject("host_lost", hosts[-1])

    def down() -> dict | None:
        view = run_view(stack, run)
        return view if "NodeDown" in _alertnames(view) else None

    try:
        view = wait_for(down, timeout, "NodeDown in the bridge", 2.0)
    finally:
        job.stop(exit_code=1)
    return run, view
