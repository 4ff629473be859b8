"""A real single-node Slurm 22.05 (munge, slurmctld, slurmd from Debian) in a temporary directory.

Everything lives under one directory: config, state, logs, the munge socket and key, and fake GPU
character devices (``mknod c 1 3``, i.e. /dev/null) that gres.conf lists, so Slurm hands out real
GPU indices. Daemons run in the foreground as children of the test and are killed on exit; client
commands find the cluster through ``SLURM_CONF`` in :meth:`SlurmCluster.env`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harness import processes
from harness.processes import free_port

MUNGED = shutil.which("munged") or "/usr/sbin/munged"
SLURMCTLD = shutil.which("slurmctld") or "/usr/sbin/slurmctld"
SLURMD = shutil.which("slurmd") or "/usr/sbin/slurmd"


def unavailable_reason() -> str | None:
    """Why this machine cannot run the cluster (None when it can)."""
    if os.geteuid() != 0:
        return "a private Slurm cluster needs root here (slurmd runs jobs as their user, mknod)"
    for binary in (MUNGED, SLURMCTLD, SLURMD, shutil.which("sbatch")):
        if not binary or not Path(binary).exists():
            return f"Slurm/munge binary missing: {binary} (run setup/system-deps.sh)"
    return None


@dataclass
class SlurmCluster:
    """A running cluster: its node name, GPU count, directory and client environment."""

    workdir: Path
    node: str
    gpus: int
    procs: list[subprocess.Popen] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        """Environment for Slurm client commands (squeue, sbatch, scancel, scontrol)."""
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env["SLURM_CONF"] = str(self.workdir / "slurm.conf")
        return env

    def run(self, *args: str, timeout: float = 30) -> str:
        """Run a Slurm client command against this cluster; raise with its stderr on failure."""
        proc = subprocess.run(list(args), env=self.env(), capture_output=True, text=True,
                              timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc.stdout

    def submit(self, *sbatch_args: str) -> str:
        """``sbatch --parsable ...``; returns the job id."""
        return self.run("sbatch", "--parsable", *sbatch_args).strip().split(";")[0]

    def wait_state(self, job_id: str, states: set[str], timeout: float = 30) -> str:
        """Poll squeue until the job is in one of ``states`` ("" means gone from the queue)."""
        deadline = time.monotonic() + timeout
        state = "?"
        while time.monotonic() < deadline:
            state = self.run("squeue", "-h", "-j", job_id, "-o", "%T").strip()
            if state in states:
                return state
            time.sleep(0.2)
        raise TimeoutError(f"job {job_id} is {state!r}, wanted {states}: {self.logs()}")

    def logs(self) -> str:
        """Tail of the daemons' logs, for failure messages."""
        out = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log"):
            path = self.workdir / name
            if path.exists():
                out.append(f"--- {name}\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(out)


def _write_config(workdir: Path, node: str, gpus: int, prolog: str | None,
                  epilog: str | None) -> None:
    ctld_port, slurmd_port = free_port(), free_port()
    lines = [
        "ClusterName=wandbtest",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=socket={workdir / 'munge.sock'}",
        "CredType=cred/munge",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "JobAcctGatherType=jobacct_gather/none",
        "GresTypes=gpu",
        "ReturnToService=2",
        "SchedulerParameters=sched_interval=1",
        "MinJobAge=2",
        f"StateSaveLocation={workdir / 'state'}",
        f"SlurmdSpoolDir={workdir / 'spool'}",
        f"SlurmctldPidFile={workdir / 'slurmctld.pid'}",
        f"SlurmdPidFile={workdir / 'slurmd.pid'}",
        f"SlurmctldLogFile={workdir / 'slurmctld.log'}",
        f"SlurmdLogFile={workdir / 'slurmd.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs=2 Gres=gpu:{gpus} State=UNKNOWN",
        f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP "
        "OverSubscribe=FORCE:4",
    ]
    if prolog:
        lines.append(f"Prolog={prolog}")
    if epilog:
        lines.append(f"Epilog={epilog}")
    (workdir / "slurm.conf").write_text("\n".join(lines) + "\n")
    devices = workdir / "dev"
    devices.mkdir()
    for index in range(gpus):
        os.mknod(devices / f"nvidia{index}", 0o666 | 0o020000, os.makedev(1, 3))
    (workdir / "gres.conf").write_text(
        f"NodeName={node} Name=gpu File={devices}/nvidia[0-{gpus - 1}]\n")


def _spawn(cmd: list[str], workdir: Path, name: str, env: dict[str, str]) -> subprocess.Popen:
    with (workdir / f"{name}.out").open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env=env,
                                start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@contextlib.contextmanager
def slurm_cluster(workdir: Path, gpus: int = 2, prolog: str | None = None,
                  epilog: str | None = None) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd in ``workdir``; stop them (and their jobs) on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o755)
    for sub in ("state", "spool"):
        (workdir / sub).mkdir()
    node = socket.gethostname().split(".")[0]
    _write_config(workdir, node, gpus, prolog, epilog)
    key = workdir / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    cluster = SlurmCluster(workdir, node, gpus)
    env = cluster.env()
    try:
        cluster.procs.append(_spawn([
            MUNGED, "-F", "--force", f"--socket={workdir / 'munge.sock'}", f"--key-file={key}",
            f"--log-file={workdir / 'munged.log'}", f"--pid-file={workdir / 'munged.pid'}",
            f"--seed-file={workdir / 'munged.seed'}",
        ], workdir, "munged", env))
        _wait_for((workdir / "munge.sock").exists, "munge socket", cluster)
        cluster.procs.append(_spawn([SLURMCTLD, "-D", "-i", "-f", env["SLURM_CONF"]], workdir,
                                    "slurmctld", env))
        _wait_for(lambda: _ok(cluster, "scontrol", "ping"), "slurmctld", cluster)
        cluster.procs.append(_spawn([SLURMD, "-D", "-f", env["SLURM_CONF"], "-N", node],
                                    workdir, "slurmd", env))
        _wait_for(lambda: _idle(cluster), "node idle", cluster)
        yield cluster
    finally:
        _cancel_all(cluster)
        for proc in reversed(cluster.procs):
            _stop(proc)
        _stop_job_processes(env["SLURM_CONF"])


def _cancel_all(cluster: SlurmCluster, timeout: float = 20) -> None:
    """Cancel every job and wait until the queue is empty, so no job step outlives slurmd."""
    with contextlib.suppress(Exception):
        cluster.run("scancel", "--full", "-u", "root", timeout=10)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and cluster.run("squeue", "-h", timeout=10).strip():
            time.sleep(0.2)


def _stop_job_processes(conf: str, timeout: float = 30) -> None:
    """Stop whatever a job left: an empty queue does not mean the job's processes are gone (a
    job cancelled while slurmstepd was still starting its script can outlive it, and slurmstepd
    is not a child of slurmd). Every job process and stepd inherited ``SLURM_CONF`` from this
    cluster's sbatch or slurmd, so the environment finds them; the test's own children (an
    exporter given the cluster's environment) are left to their own teardown."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ours = set(processes.descendants())
        left = [pid for pid in processes.marked("SLURM_CONF", conf) if pid not in ours]
        if not left:
            return
        processes.terminate(left, grace=2)
    raise RuntimeError(f"processes of the Slurm cluster at {conf} survived SIGKILL")


def _ok(cluster: SlurmCluster, *args: str) -> bool:
    try:
        cluster.run(*args, timeout=10)
    except (RuntimeError, subprocess.TimeoutExpired):
        return False
    return True


def _idle(cluster: SlurmCluster) -> bool:
    try:
        state = cluster.run("sinfo", "-h", "-N", "-o", "%t", timeout=10).strip()
    except (RuntimeError, subprocess.TimeoutExpired):
        return False
    return state.startswith("idle")


def _wait_for(check: object, what: str, cluster: SlurmCluster, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in cluster.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} while waiting "
                                   f"for {what}:\n{cluster.logs()}")
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready after {timeout}s:\n{cluster.logs()}")


SHIPPED_HOOKS = Path(__file__).resolve().parent.parent / "deploy" / "slurm"


def shipped_hook(path: Path, script: str, port: int) -> str:
    """The shipped prolog/epilog (``script``), pointed at the test's exporter on ``port`` as a
    site's /etc/default file would; returns the wrapper's path for slurm.conf."""
    path.write_text("#!/bin/bash\n"
                    f"export WANDB_INFRA_EXPORTER_URL=http://127.0.0.1:{port}\n"
                    "export WANDB_INFRA_EXPORTER_ENV_FILE=/nonexistent\n"
                    f"exec {SHIPPED_HOOKS / script}\n")
    path.chmod(0o755)
    return str(path)
