"""What a training job's own console log says, as data: the crash signatures of PyTorch, NCCL,
CUDA, the launchers and Slurm, each with its class, what it names and which alert it corroborates.

The job log is read by ``bridge/joblog``: a line's signature is the matching one of highest
``specificity`` (a concrete CUDA error inside a watchdog wrapper is the CUDA error), and the first
meaningful error of a log is its earliest line whose class is neither ``cascade`` nor
``teardown``. Classes:

* ``infrastructure``: the machine failed (a GPU's memory, a link, the fabric);
* ``application``: the job or its configuration (memory it asked for, labels out of range, a
  64 MB ``/dev/shm``, the time limit);
* ``ambiguous``: either, depending on corroboration (an illegal memory access is usually a kernel
  bug, sometimes a faulty GPU);
* ``cascade``: a consequence of a failure elsewhere (NCCL timeouts on the ranks that waited);
* ``teardown``: the launcher or watchdog taking the process down (SIGTERM fan-out, abort).

``pattern`` is one extended regular expression that both Python's ``re`` and GNU ``grep -E``
accept the same way (no ``\\d``, no non-capturing groups), so the benchmark can time grep on the
same patterns and tests can check each pattern with both. ``extract`` (Python only) pulls what the
line names beyond the launcher prefixes the reader understands anyway. ``alerts`` are the alert
rules (``catalog/alerts.py``, ``catalog/host_alerts.py``) that see the same fault from telemetry,
and ``xids`` the XID classes (``catalog/xid.py``); an infrastructure signature with none has no
rule that could see it. ``exit_classes`` re-class a launcher's exit line by its exit code
(``-7`` SIGBUS points at ``/dev/shm``; ``-6`` is the watchdog's abort).

Sources of the facts: the public issue threads cited beside each real example line in
``tests/data/joblog/signatures.json``; torchrun's summary format (pytorch/pytorch,
``torch/distributed/elastic/multiprocessing/errors/__init__.py``); Slurm's srun and slurmstepd
messages (https://slurm.schedmd.com/srun.html).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from wandb_infra.catalog.xid import XidClass


class LogClass(StrEnum):
    """What a matching line says about who failed."""

    INFRASTRUCTURE = "infrastructure"
    APPLICATION = "application"
    AMBIGUOUS = "ambiguous"
    CASCADE = "cascade"
    TEARDOWN = "teardown"


class Names(StrEnum):
    """What a line can name (beyond launcher prefixes, which the reader parses for every line)."""

    RANK = "rank"
    HOST = "host"
    GPU = "gpu"
    PCI_BUS = "pci_bus"
    PEER = "peer"
    TASK = "task"


@dataclass(frozen=True, kw_only=True)
class Signature:
    """One kind of log line; ``generic`` marks wrappers a concrete error always beats."""

    id: str
    pattern: str
    cls: LogClass
    meaning: str
    specificity: int
    names: frozenset[Names] = frozenset()
    extract: str = ""
    alerts: tuple[str, ...] = ()
    xids: tuple[XidClass, ...] = ()
    exit_classes: tuple[tuple[int, LogClass], ...] = ()
    generic: bool = False
    gap: str = ""

    def class_for_exit(self, code: int | None) -> LogClass:
        """The class of this line given the exit code it reports (its own class otherwise)."""
        return dict(self.exit_classes).get(code, self.cls) if code is not None else self.cls


_ECC_ALERTS = ("GpuContainedEccError", "GpuUncontainedEccError", "GpuDoubleBitEccErrors",
               "GpuXidError")
_IB_ALERTS = ("InfinibandLinkDown", "InfinibandLinkFlapping", "InfinibandPhysicalErrors")
_EXIT = (-7, LogClass.APPLICATION), (-9, LogClass.AMBIGUOUS), (-11, LogClass.AMBIGUOUS)
_SRUN = r"srun: error: (?P<host>[^:\s]+): tasks? (?P<task>[0-9][0-9,-]*)"
_EXIT_CODE = r"(?P<exit>-?[0-9]+)"

INFRA, U, A, C, T = (LogClass.INFRASTRUCTURE, LogClass.APPLICATION, LogClass.AMBIGUOUS,
                     LogClass.CASCADE, LogClass.TEARDOWN)
N = Names

SIGNATURES: tuple[Signature, ...] = (
    # infrastructure
    Signature(id="cuda_ecc_uncorrectable", cls=INFRA, specificity=90,
              pattern=r"uncorrectable ECC error encountered|cudaErrorECCUncorrectable|"
                      r"CUDA_ERROR_ECC_UNCORRECTABLE",
              meaning="the GPU hit an uncorrectable memory (ECC) error",
              alerts=_ECC_ALERTS,
              xids=(XidClass.CONTAINED_ECC, XidClass.UNCONTAINED_ECC, XidClass.HARDWARE),
              gap="the ECC and XID alerts need dcgm-exporter's ECC and XID fields from that host"),
    Signature(id="cuda_nvlink_uncorrectable", cls=INFRA, specificity=90,
              pattern=r"uncorrectable NVLink error detected",
              meaning="an uncorrectable NVLink error (the line names no link, GPU or host)",
              alerts=("GpuNvlinkFailure", "GpuNvlinkErrors", "NvswitchFatalError"),
              xids=(XidClass.DECODE,),
              gap="the NVLink alerts need dcgm-exporter's NVLink counters from that host"),
    Signature(id="gpu_fallen_off_bus", cls=INFRA, specificity=95,
              pattern=r"fallen off the bus", names=frozenset({N.PCI_BUS}),
              extract=r"(?:GPU |PCI:)(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})",
              meaning="a GPU fell off the PCIe bus", alerts=("GpuFallenOffBus",),
              xids=(XidClass.FALLEN_OFF_BUS,),
              gap="GpuFallenOffBus needs dcgm-exporter (or the node's kernel log) on that host"),
    Signature(id="nvrm_xid", cls=INFRA, specificity=92,
              pattern=r"NVRM: Xid \(PCI:[0-9a-fA-F:.]+\): [0-9]+",
              names=frozenset({N.PCI_BUS}),
              extract=r"PCI:(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>[0-9]+)",
              meaning="the driver reported an XID (its class decides the verdict)",
              alerts=("GpuXidError",), xids=(XidClass.HARDWARE,),
              gap="the XID alerts need dcgm-exporter's DCGM_FI_DEV_XID_ERRORS from that host"),
    Signature(id="nccl_nvls_cuda_failure", cls=INFRA, specificity=85,
              pattern=r"transport/nvls\.cc:[0-9]+ NCCL WARN Cuda failure",
              names=frozenset({N.HOST, N.GPU}),
              meaning="NVLink SHARP setup failed: the fabric manager's state (restarted "
                      "without a GPU reset, or failed)",
              alerts=("FabricManagerNotReady", "NvswitchFatalError"),
              gap="FabricManagerNotReady needs the fabric manager's state from that host"),
    Signature(id="ib_port_error", cls=INFRA, specificity=80,
              pattern=r"NET/IB ?: ([a-z0-9_]+:[0-9]+ )?Got async event ?: port error",
              names=frozenset({N.HOST, N.GPU}),
              meaning="an InfiniBand port went down (a flapping link or cable)",
              alerts=_IB_ALERTS,
              gap="the InfiniBand alerts need node_exporter's infiniband collector on that host"),
    Signature(id="ib_catastrophic", cls=INFRA, specificity=85,
              pattern=r"Got async event ?: local catastrophic error",
              names=frozenset({N.HOST, N.GPU}),
              meaning="the InfiniBand adapter reported a catastrophic error",
              alerts=("InfinibandLinkDown",),
              gap="InfinibandLinkDown needs node_exporter's infiniband collector on that host"),
    Signature(id="ib_completion_error", cls=INFRA, specificity=75,
              pattern=r"NET/IB[A-Za-z]* ?: ?Got completion from peer",
              names=frozenset({N.HOST, N.GPU, N.PEER}),
              extract=r"from peer (?P<peer>\S+?<[0-9]+>)",
              meaning="an InfiniBand/RoCE transfer to the named peer failed (link, switch, or "
                      "the fabric's GID/RoCE configuration)",
              alerts=(*_IB_ALERTS, "NetworkInterfaceDown"),
              gap="the InfiniBand alerts need node_exporter's infiniband collector on both "
                  "hosts; a RoCE GID misconfiguration has no counter any rule could watch"),
    Signature(id="ib_work_queue_error", cls=A, specificity=78,
              pattern=r"async fatal event on QP|Got async event ?: local (access violation|"
                      r"work queue catastrophic|catastrophic work queue)|work queue error",
              names=frozenset({N.HOST, N.GPU}),
              meaning="the InfiniBand adapter rejected a work request (adapter, driver or the "
                      "network plugin)",
              alerts=_IB_ALERTS),
    # application
    Signature(id="cuda_oom", cls=U, specificity=80,
              pattern=r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory",
              names=frozenset({N.GPU}), extract=r"\(?GPU (?P<gpu>[0-9]+)[;) ]",
              meaning="the job asked for more GPU memory than the GPU has"),
    Signature(id="cuda_kernel_assert", cls=U, specificity=85,
              pattern=r"block: \[[0-9]+,[0-9]+,[0-9]+\],? thread: \[[0-9]+,[0-9]+,[0-9]+\] "
                      r"Assertion",
              meaning="a GPU kernel's assertion failed (e.g. a label outside the classes)"),
    Signature(id="device_side_assert", cls=U, specificity=80,
              pattern=r"device-side assert triggered",
              meaning="a GPU kernel's assertion failed (index or label out of range)"),
    Signature(id="shm_bus_error", cls=U, specificity=80,
              pattern=r"insufficient shared memory|killed by signal: Bus error|"
                      r"out of shared memory",
              meaning="a DataLoader worker ran out of shared memory (/dev/shm)"),
    Signature(id="sigbus", cls=U, specificity=75,
              pattern=r"Caught signal 7 \(Bus error|tasks? [0-9][0-9,-]*: Bus error",
              names=frozenset({N.HOST, N.TASK}), extract=_SRUN,
              meaning="SIGBUS, usually a 64 MB container /dev/shm, a memlock limit or host "
                      "memory shared with other jobs"),
    Signature(id="ibv_reg_mr_nomem", cls=U, specificity=80,
              pattern=r"ibv_reg_mr[a-z0-9_]* failed with error Cannot allocate memory",
              names=frozenset({N.HOST, N.GPU}),
              meaning="InfiniBand memory registration failed: the locked-memory limit "
                      "(ulimit -l) is too low"),
    Signature(id="srun_task_oom", cls=U, specificity=80,
              pattern=r"srun: error: [^:]+: tasks? [0-9][0-9,-]*: Out Of Memory",
              names=frozenset({N.HOST, N.TASK}), extract=_SRUN,
              meaning="Slurm's cgroup killed a task for using more memory than the job asked "
                      "for", alerts=("HostOomKill",)),
    Signature(id="slurm_oom_kill", cls=U, specificity=70,
              pattern=r"oom[-_]kill event",
              meaning="Slurm's cgroup out-of-memory handler killed a process of the job",
              alerts=("HostOomKill",)),
    Signature(id="slurm_time_limit", cls=U, specificity=70,
              pattern=r"CANCELLED AT [^ ]+ DUE TO TIME LIMIT|CANCELLED DUE TO TIME LIMIT",
              meaning="the job reached its time limit (its configuration, or a hang before "
                      "it)"),
    Signature(id="python_exception", cls=U, specificity=10, generic=True,
              pattern=r"(^|[] :>|])([A-Za-z_][A-Za-z0-9_]*\.)*[A-Z][A-Za-z0-9_]*(Error|"
                      r"Exception): ",
              meaning="a Python exception"),
    # ambiguous
    Signature(id="cuda_unknown_error", cls=A, specificity=60,
              pattern=r"CUDA error: unknown error|Cuda failure 999|cudaErrorUnknown",
              names=frozenset({N.HOST, N.GPU}),
              meaning="CUDA's 'unknown error': often a GPU lost (XID 79) or the driver's "
                      "state, sometimes a driver/toolkit mismatch",
              alerts=("GpuFallenOffBus", "GpuXidError", "FabricManagerNotReady"),
              xids=(XidClass.FALLEN_OFF_BUS, XidClass.HARDWARE)),
    Signature(id="cuda_illegal_address", cls=A, specificity=70,
              pattern=r"an illegal memory access was encountered|cudaErrorIllegalAddress",
              meaning="an illegal memory access: usually a kernel bug, sometimes the fabric "
                      "manager or a faulty GPU (XID 31)",
              alerts=("GpuXidApplicationError", "FabricManagerNotReady"),
              xids=(XidClass.APPLICATION,)),
    Signature(id="cuda_launch_failure", cls=A, specificity=70,
              pattern=r"unspecified launch failure",
              meaning="a kernel failed: a kernel fault or a GPU fault (XID 13/43)",
              alerts=("GpuXidApplicationError", "GpuXidError"),
              xids=(XidClass.APPLICATION, XidClass.HARDWARE)),
    Signature(id="nccl_unhandled_cuda", cls=A, specificity=20, generic=True,
              pattern=r"unhandled cuda error|ncclUnhandledCudaError",
              meaning="NCCL's wrapper for a failed CUDA call (the cause is in a NCCL WARN line)"),
    Signature(id="megatron_nan_grad", cls=A, specificity=85,
              pattern=r"found NaN in local grad norm",
              names=frozenset({N.RANK, N.GPU, N.HOST}),
              extract=r"Rank (?P<rank>[0-9]+)(: .*Device: (?P<gpu>[0-9]+)(, node: "
                      r"(?P<host>[^ ,)'\"]+))?|, node (?P<host2>[^ ,]+), device "
                      r"(?P<gpu2>[0-9]+))?",
              meaning="a NaN gradient on one rank: the data or loss scaling, or silent data "
                      "corruption on that GPU"),
    Signature(id="segfault", cls=A, specificity=50,
              pattern=r"Segmentation fault|Caught signal 11|SIGSEGV",
              names=frozenset({N.HOST, N.TASK}), extract=_SRUN,
              meaning="a segmentation fault: code or a library, or a flaky node"),
    Signature(id="killed", cls=A, specificity=30, generic=True,
              pattern=r"(^|[0-9] )Killed( |$)",
              meaning="the process was killed (usually the out-of-memory killer)",
              alerts=("HostOomKill",)),
    Signature(id="torchrun_failed", cls=T, specificity=35, exit_classes=_EXIT,
              pattern=r"failed \(exitcode: -?[0-9]+\) local_rank: [0-9]+",
              extract=r"exitcode: " + _EXIT_CODE + r"\) local_rank: (?P<local_rank>[0-9]+)",
              meaning="torchrun saw a worker exit (its exit code says how)"),
    Signature(id="deepspeed_exit", cls=T, specificity=35, exit_classes=_EXIT,
              pattern=r"sigkill_handler.*exits with return code = -?[0-9]+",
              extract=r"return code = " + _EXIT_CODE,
              meaning="the DeepSpeed launcher saw a worker exit (-9: usually host memory)"),
    # cascade
    Signature(id="nccl_watchdog_timeout", cls=C, specificity=60,
              pattern=r"Watchdog caught collective operation timeout",
              names=frozenset({N.RANK}), alerts=("TrainingStalled",),
              meaning="a collective timed out: this rank waited for another that failed or "
                      "hung"),
    Signature(id="nccl_comm_aborted", cls=C, specificity=62,
              pattern=r"NCCL communicator was aborted on rank", names=frozenset({N.RANK}),
              meaning="the communicator was aborted after a timeout or error elsewhere"),
    Signature(id="nccl_watchdog_detected", cls=C, specificity=55,
              pattern=r"(failure|Exception \(either an error or timeout\)) detected by "
                      r"watchdog at work",
              names=frozenset({N.RANK}),
              meaning="the watchdog noticed the failed collective (last completed work says "
                      "how far this rank got)"),
    Signature(id="nccl_peer_closed", cls=C, specificity=55,
              pattern=r"Connection closed by remote peer|Socket recv failed while polling",
              names=frozenset({N.HOST, N.GPU, N.PEER}),
              extract=r"remote peer (?P<peer>\S+)",
              meaning="the peer process went away (it failed first)"),
    Signature(id="torch_dist_error", cls=C, specificity=25,
              pattern=r"DistBackendError|DistNetworkError|DistStoreError",
              meaning="PyTorch's distributed layer failed because a peer or the store went "
                      "away"),
    Signature(id="slurm_task_failure", cls=C, specificity=60,
              pattern=r"DUE TO TASK FAILURE",
              meaning="Slurm cancelled the step because one task failed"),
    # teardown
    Signature(id="nccl_take_down", cls=T, specificity=50,
              pattern=r"we are taking the entire process down|Some NCCL operations have "
                      r"failed or timed out",
              meaning="PyTorch takes the process down after a NCCL failure"),
    Signature(id="elastic_sigterm", cls=T, specificity=50,
              pattern=r"Sending process [0-9]+ closing signal SIG(TERM|KILL)",
              meaning="the launcher stops the other workers after one failed"),
    Signature(id="srun_terminated", cls=T, specificity=50,
              pattern=r"srun: error: [^:]+: tasks? [0-9][0-9,-]*: Terminated",
              names=frozenset({N.HOST, N.TASK}), extract=_SRUN,
              meaning="srun terminated these tasks (a task missing from the list failed)"),
    Signature(id="child_failed", cls=T, specificity=30,
              pattern=r"ChildFailedError", meaning="the launcher reports a failed worker"),
    Signature(id="signal_received", cls=T, specificity=30,
              pattern=r"Signal [0-9]+ \(SIG[A-Z]+\) received by PID",
              meaning="torchrun's summary of the signal a worker died of"),
    Signature(id="terminate_called", cls=T, specificity=15, generic=True,
              pattern=r"terminate called after throwing an instance of",
              meaning="C++ terminate: the error is on the line that follows"),
    Signature(id="watchdog_terminated", cls=T, specificity=15, generic=True,
              pattern=r"watchdog thread terminated with exception",
              meaning="the NCCL watchdog aborts the process (the rest of the line says why)"),
)
BY_ID: dict[str, Signature] = {s.id: s for s in SIGNATURES}


# Matching order: the most specific first, so the first match is a line's signature.
BY_SPECIFICITY: tuple[Signature, ...] = tuple(sorted(SIGNATURES, key=lambda s: -s.specificity))


def patterns() -> list[str]:
    """Every signature's extended regular expression (what ``grep -E -f`` gets)."""
    return [s.pattern for s in SIGNATURES]
