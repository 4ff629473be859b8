"""Wrap a per-entity fault expression so the alert carries the run labels (contract 2).

PromQL refuses many-to-many joins, and a failed join drops the whole rule, so the run info metric
is always on the many side and the fault side is made unique per join key with ``topk by``. The
run side is the contract-1 info metrics deduplicated with ``max by`` (exporter replicas collapse).
Three cases per GPU fault: the run that holds the GPU (several runs may share one), runs on the
host whose GPUs are unknown (never a GPU another run holds), and no run at all (the fault still
alerts, without run labels). Host and link faults attribute to every run on the host.

Cost: the join metrics have a series per GPU of every run, and selecting a series is the unit
of cost. Each alert family therefore reads them once per evaluation, recording the rows of the
hosts with a fault of the family (``faulty_joins``, usually none) just before its alerts, which
join against those few rows; only rows of faulty hosts can match, so the result is the same.
Host and link families read only the per-host join metric.
"""

from __future__ import annotations

from dataclasses import dataclass

from wandb_infra.alert_rules.normalise import Recording, promql, run_gpu_rows, run_host_rows
from wandb_infra.common import labels as L

RUN = ", ".join(L.RUN_LABELS)


@dataclass(frozen=True)
class Joins:
    """Names of a family's join records: its faulty hosts' GPU rows, their runs whose GPUs are
    unknown, and the runs on its faulty hosts."""

    run_gpus: str
    gpus_unknown: str
    run_hosts: str


def family_joins(family: str) -> Joins:
    """Names of a family's faulty-host join records (``level:metric:faulty_<family>``)."""
    suffix = "faulty_" + family.replace("-", "_")
    return Joins(f"wandb_run_gpu:wandb_run_gpu_info:{suffix}",
                 f"wandb_run_hostname:wandb_run_gpus_unknown:{suffix}",
                 f"wandb_run_hostname:wandb_run_node_info:{suffix}")


GPUS_UNKNOWN_ON = """
${RUN_HOSTS}
unless on (hostname, ${RUN})
${RUN_GPUS}
"""


def faulty_joins(joins: Joins, gpu_faults: list[str], host_faults: list[str]
                 ) -> list[Recording]:
    """The join rows on hosts with a fault among the given fault records.

    The GPU rows come first: the runs with unknown GPUs are those of the faulty hosts' runs
    that have no row there.
    """
    out = []
    if gpu_faults:
        on_gpu = "\nor\n".join(gpu_faults)
        out += [
            Recording(joins.run_gpus, run_gpu_rows(on_gpu),
                      "The run rows (run, host, GPU) of the hosts with a fault of this family, "
                      "usually none: the join metrics are read once here, and the alerts below "
                      "join these few rows instead of every GPU of every run."),
            Recording(joins.gpus_unknown,
                      promql(GPUS_UNKNOWN_ON, RUN_HOSTS=run_host_rows(on_gpu),
                             RUN_GPUS=joins.run_gpus),
                      "The runs on those hosts whose GPUs there are unknown (no GPU row): "
                      "a GPU fault reaches them by host, never a run holding another GPU."),
        ]
    if host_faults:
        out.append(Recording(joins.run_hosts, run_host_rows("\nor\n".join(host_faults)),
                             "The runs on the hosts with a host or link fault of this family "
                             "(usually none), read once for the alerts below."))
    return out


def _join(*names: str) -> str:
    return ", ".join(n for n in names if n)


def _indent(expr: str) -> str:
    return "\n".join("  " + line for line in expr.splitlines())


def gpu_scope(fault: str, copy: tuple[str, ...], j: Joins) -> str:
    """A GPU fault attributed by (hostname, gpu), else by hostname, else to nobody."""
    copied = _join(L.GPU_UUID, *copy)
    return "\n".join([
        "(",
        f"  {j.run_gpus}",
        f"  * on ({L.HOSTNAME}, {L.GPU}) group_left ({copied})",
        f"  topk by ({L.HOSTNAME}, {L.GPU}) (1, (",
        _indent(_indent(fault)),
        "  ))",
        ")",
        "or",
        "(",
        f"  {j.gpus_unknown}",
        f"  * on ({L.HOSTNAME}) group_left ({_join(L.GPU, copied)})",
        f"  topk by ({L.HOSTNAME}) (1, (",
        _indent(_indent(fault)),
        f"  ) unless on ({L.HOSTNAME}, {L.GPU}) {j.run_gpus})",
        ")",
        "or",
        "(",
        f"  max by ({_join(L.HOSTNAME, L.GPU, copied)}) (",
        _indent(_indent(fault)),
        "  )",
        f"  unless on ({L.HOSTNAME}, {L.GPU}) {j.run_gpus}",
        f"  unless on ({L.HOSTNAME}) {j.gpus_unknown}",
        ")",
    ])


def host_scope(fault: str, copy: tuple[str, ...], j: Joins) -> str:
    """A host or link fault attributed to every run on the host, else to nobody."""
    return "\n".join([
        "(",
        f"  {j.run_hosts}",
        f"  * on ({L.HOSTNAME}) group_left ({_join(*copy)})",
        f"  topk by ({L.HOSTNAME}) (1, (",
        _indent(_indent(fault)),
        "  ))",
        ")",
        "or",
        "(",
        f"  max by ({_join(L.HOSTNAME, *copy)}) (",
        _indent(_indent(fault)),
        "  )",
        f"  unless on ({L.HOSTNAME}) {j.run_hosts}",
        ")",
    ])


def attributed(scope: str, fault: str, copy: tuple[str, ...], joins: Joins) -> str:
    """The alert expression for an entity scope; run-scoped faults already carry run labels and
    pipeline alerts concern no run."""
    if scope == "gpu":
        return gpu_scope(fault, copy, joins)
    if scope in ("host", "link"):
        return host_scope(fault, copy, joins)
    if scope in ("run", "pipeline"):
        return fault
    raise ValueError(f"unknown scope {scope!r}")
