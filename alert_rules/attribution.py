"""Attribution: which run each GPU, host or link fault goes to, decided once per fault family.

The rules are the one place where a fault meets its runs: the bridge does not join again, it only
confirms each alert it receives against Prometheus' own ``ALERTS`` (bridge/prometheus/confirm.py),
so the run labels an alert carries are the ones these joins gave it.

One group (``attribution``, every cycle) records the join of each family (GPU, host, link): the
entities with a fault signal of the family (any entity in the sparse records its alerts read),
and the runs on them. ``wandb_run_node_info`` is read once for the hosts any family signals and
``wandb_run_gpu_info`` once for the hosts with a signalled or stalled GPU; each family filters
those rows. Every alert of the family multiplies its fault by its family's rows; none reads the
join metrics itself. The stall (TrainingStalled) is joined to its runs from the same GPU rows
(``stall_join``), so no other rule reads the join metrics for it either.

GPU faults go to the runs holding the GPU (``wandb_run_gpu_info`` or the Kubernetes pod rows;
several runs may share one), else to the runs on the host whose GPUs are unknown (never to a run
holding another GPU; one alert per run, with the worst GPU's labels: PromQL has no many-to-many
join), else to nobody (the alert fires without run labels). Host and link faults go to every run
on the host (with the worst entity's labels), else to nobody (one alert per entity).

Group order: the alerts read these records from another group, so a record may be one evaluation
older than the fault. Each branch therefore selects the rows it joins positively (a GPU is in
``unheld`` or it is not; a host is in ``without_run`` or it is not): a fault the join has not seen
yet fires one evaluation later, never without its run labels or on another run.
"""

from __future__ import annotations

from dataclasses import dataclass

from wandb_infra.alert_rules import tiers
from wandb_infra.alert_rules.normalise import Recording, promql, run_gpu_rows, run_host_rows
from wandb_infra.catalog import series as s
from wandb_infra.common import labels as L

RUN = ", ".join(L.RUN_LABELS)
# The fault families, each named after the alert scope it attributes.
FAMILIES = ("gpu", "host", "link")
WHAT = {"gpu": "GPU", "host": "host", "link": "host with a link"}
# The runs on every host signalled by any family: the one read of the node join metric.
ON_SIGNALLED = f"wandb_run_hostname:{L.NODE_INFO}:on_signalled_hosts"


@dataclass(frozen=True)
class Join:
    """The record names of one family's join (``<level>:<family>_faults:<what>``)."""

    family: str

    def name(self, level: str, what: str) -> str:
        return f"{level}:{self.family}_faults:{what}"

    @property
    def signalled(self) -> str:
        return self.name("gpu" if self.family == "gpu" else "hostname", "signalled")

    @property
    def held(self) -> str:
        return self.name("wandb_run_gpu", "held")

    @property
    def gpus_unknown(self) -> str:
        return self.name("wandb_run_hostname", "gpus_unknown")

    @property
    def by_host(self) -> str:
        return self.name("gpu", "by_host")

    @property
    def runs(self) -> str:
        return self.name("wandb_run_gpu" if self.family == "gpu" else "wandb_run_hostname",
                         "runs")

    @property
    def without_run(self) -> str:
        return self.name("hostname", "without_run")


SIGNALLED = """
group by (${BY}) (
  ${INPUTS}
)
"""
GPUS_UNKNOWN = """
(${O} and on (hostname) ${S})
unless on (hostname, ${RUN})
${HELD}
"""
BY_HOST = """
(${S} unless on (hostname, gpu) ${H})
and on (hostname)
${U}
"""
GPU_RUNS = """
(${H} and on (hostname, gpu) ${S})
or
(${S} unless on (hostname, gpu) ${H} unless on (hostname) ${U})
"""


def _signalled(family: str, inputs: list[str]) -> Recording:
    j = Join(family)
    return Recording(
        j.signalled, promql(SIGNALLED, BY="hostname, gpu" if family == "gpu" else "hostname",
                            INPUTS="\nor ".join(inputs)),
        f"Every {WHAT[family]} in a record the {family} alerts read (usually none, never more "
        "than those with a fault): the entities whose runs the joins below look up.")


def _family_join(family: str, pod_tier: str | None) -> list[Recording]:
    """The run rows of one family's signalled entities, filtered from ``ON_SIGNALLED``."""
    j = Join(family)
    if family != "gpu":
        return [
            Recording(j.runs, promql("${O}\nand on (hostname)\n${S}", O=ON_SIGNALLED,
                                     S=j.signalled),
                      f"The runs on each signalled {WHAT[family]}: a {family} alert goes to "
                      "every run on its host, with the worst entity's labels."),
            Recording(j.without_run, promql("${S}\nunless on (hostname)\n${R}", S=j.signalled,
                                            R=j.runs),
                      f"The signalled hosts with no run: a {family} alert there fires once per "
                      "entity, without run labels."),
        ]
    # The pod rows are recorded at ``pod_tier`` and, if that outlives the lookback, read over
    # their last evaluation, so they can outlive a run by that long: only those of runs on their
    # host now count.
    pod_rows = (f"({tiers.reading(s.POD_GPU_ROWS, pod_tier)} "
                f"and on (hostname, {RUN}) {ON_SIGNALLED})")
    return [
        Recording(j.held, run_gpu_rows(f"{j.signalled} or {s.GPU_STALLED}", pod_rows=pod_rows),
                  "The run rows (host, GPU, run) of every host with a signalled or stalled GPU, "
                  f"from {L.GPU_INFO} or the Kubernetes pod rows of the runs on the host now: "
                  "read once per cycle for every GPU alert and the stall below."),
        Recording(j.gpus_unknown,
                  promql(GPUS_UNKNOWN, O=ON_SIGNALLED, S=j.signalled, HELD=j.held),
                  "The runs on those hosts whose GPUs there are unknown (no GPU row)."),
        Recording(j.by_host, promql(BY_HOST, S=j.signalled, H=j.held, U=j.gpus_unknown),
                  "The signalled GPUs no run holds on a host with such runs: a GPU alert "
                  "there goes to those runs, by host."),
        Recording(j.runs, promql(GPU_RUNS, S=j.signalled, H=j.held, U=j.gpus_unknown),
                  "Each signalled GPU with the runs holding it (several may share one), or, "
                  "when no run holds it and no run with unknown GPUs is on its host, without "
                  "run labels (the alert then names no run)."),
    ]


def join_records(inputs: dict[str, list[str]], by_record: dict[str, str | None]
                 ) -> list[Recording]:
    """Every family's join, recorded once: the signalled entities of each (``inputs``: the
    records the family's alerts read), the runs on any signalled host (the one read of
    ``wandb_run_node_info``), then each family's rows filtered from those. ``by_record``: each
    record's tier, for how the pod rows are read."""
    hosts = "\nor ".join(
        f"group by (hostname) ({Join(f).signalled} or {s.GPU_STALLED})" if f == "gpu"
        else Join(f).signalled for f in FAMILIES)
    return [
        *(_signalled(f, inputs[f]) for f in FAMILIES),
        Recording(ON_SIGNALLED, run_host_rows(hosts),
                  f"The runs on every host with a signalled or stalled GPU, a signalled host or "
                  f"link ({L.NODE_INFO}), read once per cycle for all three families and the "
                  "stall's pod rows."),
        *(r for f in FAMILIES for r in _family_join(f, by_record[s.POD_GPU_ROWS])),
    ]


RUN_STALLED = """
(
  max by (${RUN}, hostname) (${HELD} * on (hostname, gpu) group_left () ${GPU_STALLED})
  unless on (${RUN}, hostname)
  (${HELD} unless on (hostname, gpu) ${GPU_STALLED})
  and on (${RUN}, hostname)
  (${HELD} and on (hostname, gpu) ${GPU_HUNG})
)
or ${RUN_HOST_STALLED_SOLE}
"""


def stall_join() -> Recording:
    """The runs stalled on a host, from the GPU family's rows (``held`` reads the hosts of the
    stalled GPUs too), so the stall is joined to its runs like every fault, once."""
    return Recording(
        s.RUN_HOST_STALLED, promql(RUN_STALLED, HELD=Join("gpu").held),
        "Runs stalled on a host, valued with the stalled GPUs' activity: every GPU the run holds "
        "there is stalled and one is hung (or the run's GPUs are unknown and it is alone on the "
        "host, as recorded by the stall group). TrainingStalled fires on it.")


def _join(*names: str) -> str:
    return ", ".join(n for n in names if n)


# An alert's join stays on one line up to this width, else its fault continues on the next.
LINE_MAX = 150


def _product(join: str, fault: str) -> list[str]:
    """``join fault`` on one line when it fits ``LINE_MAX``, else the fault indented below."""
    line = f"{join} {fault}"
    return [line] if len(line) <= LINE_MAX else [join, "  " + fault]


def gpu_scope(fault: str, copy: tuple[str, ...]) -> str:
    """A GPU fault attributed by (hostname, gpu) (its runs, or none), else by hostname."""
    j = Join("gpu")
    copied = _join(L.GPU_UUID, *copy)
    by_host = f"{fault} and on ({L.HOSTNAME}, {L.GPU}) {j.by_host}"
    return "\n".join([
        *_product(f"{j.runs} * on ({L.HOSTNAME}, {L.GPU}) group_left ({copied})",
                  f"topk by ({L.HOSTNAME}, {L.GPU}) (1, {fault})"),
        "or",
        *_product(f"{j.gpus_unknown} * on ({L.HOSTNAME}) group_left ({_join(L.GPU, copied)})",
                  f"topk by ({L.HOSTNAME}) (1, {by_host})"),
    ])


def host_scope(fault: str, copy: tuple[str, ...], family: str) -> str:
    """A host or link fault attributed to every run on the host (the worst entity's labels),
    else to nobody (one alert per entity)."""
    j = Join(family)
    return "\n".join([
        *_product(f"{j.runs} * on ({L.HOSTNAME}) group_left ({_join(*copy)})",
                  f"topk by ({L.HOSTNAME}) (1, {fault})"),
        "or",
        f"max by ({_join(L.HOSTNAME, *copy)}) ({fault}) and on ({L.HOSTNAME}) {j.without_run}",
    ])


def attributed(scope: str, fault: str, copy: tuple[str, ...]) -> str:
    """The alert expression for an entity scope; run-scoped faults already carry run labels and
    pipeline alerts concern no run."""
    if scope == "gpu":
        return gpu_scope(fault, copy)
    if scope in ("host", "link"):
        return host_scope(fault, copy, scope)
    if scope in ("run", "pipeline"):
        return fault
    raise ValueError(f"unknown scope {scope!r}")
