"""Wrap a per-entity fault expression so the alert carries the run labels (contract 2).

PromQL refuses many-to-many joins, and a failed join drops the whole rule, so the run info metric
is always on the many side and the fault side is made unique per join key with ``topk by``. The
run side comes from the deduplicated join records of ``normalise.run_rules`` (``max by`` over the
info metrics, so exporter replicas collapse). Three
cases per GPU fault: the run that holds the GPU (several runs may share one), runs on the host
whose GPUs are unknown (never a GPU another run holds), and no run at all (the fault still
alerts, without run labels). Host and link faults attribute to every run on the host.
"""

from __future__ import annotations

from bridge.catalog import series as s
from exporter import labels as L

RUN = ", ".join(L.RUN_LABELS)


def _join(*names: str) -> str:
    return ", ".join(n for n in names if n)


def _indent(expr: str) -> str:
    return "\n".join("  " + line for line in expr.splitlines())


def gpu_scope(fault: str, copy: tuple[str, ...]) -> str:
    """A GPU fault attributed by (hostname, gpu), else by hostname, else to nobody."""
    copied = _join(L.GPU_UUID, *copy)
    return "\n".join([
        "(",
        f"  {s.RUN_GPUS}",
        f"  * on ({L.HOSTNAME}, {L.GPU}) group_left ({copied})",
        f"  topk by ({L.HOSTNAME}, {L.GPU}) (1, (",
        _indent(_indent(fault)),
        "  ))",
        ")",
        "or",
        "(",
        f"  {s.RUN_HOSTS_GPUS_UNKNOWN}",
        f"  * on ({L.HOSTNAME}) group_left ({_join(L.GPU, copied)})",
        f"  topk by ({L.HOSTNAME}) (1, (",
        _indent(_indent(fault)),
        f"  ) unless on ({L.HOSTNAME}, {L.GPU}) {s.RUN_GPUS})",
        ")",
        "or",
        "(",
        f"  max by ({_join(L.HOSTNAME, L.GPU, copied)}) (",
        _indent(_indent(fault)),
        "  )",
        f"  unless on ({L.HOSTNAME}, {L.GPU}) {s.RUN_GPUS}",
        f"  unless on ({L.HOSTNAME}) {s.RUN_HOSTS_GPUS_UNKNOWN}",
        ")",
    ])


def host_scope(fault: str, copy: tuple[str, ...]) -> str:
    """A host or link fault attributed to every run on the host, else to nobody."""
    return "\n".join([
        "(",
        f"  {s.RUN_HOSTS}",
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
        f"  unless on ({L.HOSTNAME}) {s.RUN_HOSTS}",
        ")",
    ])


def attributed(scope: str, fault: str, copy: tuple[str, ...]) -> str:
    """The alert expression for an entity scope; run-scoped faults already carry run labels."""
    if scope == "gpu":
        return gpu_scope(fault, copy)
    if scope in ("host", "link"):
        return host_scope(fault, copy)
    if scope == "run":
        return fault
    raise ValueError(f"unknown scope {scope!r}")
