"""Slurm source: running jobs whose comment (or name) names a W&B run.

Convention: submit with ``--comment wandb:<entity>/<project>/<run_id>`` (anywhere in the comment).
Optionally a job-name regex with named groups ``entity``, ``project``, ``run_id`` (missing groups
fall back to ``default_entity``/``default_project``). Reads ``squeue --json`` (22.05 and newer
schemas, where numbers became ``{"set", "number"}`` objects and states lists) or
``scontrol show job -d``. Each node of the job gets a placement; GPU indices come from the per-node
GRES detail (``gpu:2(IDX:0,2)``).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from wandb_infra.common import labels
from wandb_infra.common.commands import MAX_OUTPUT_BYTES, json_list
from wandb_infra.common.runkey import RunKey
from wandb_infra.common.schema import Key, Section
from wandb_infra.exporter.model import Gpu, RunPlacement, SourceResult
from wandb_infra.exporter.nodelist import NodeListError, expand_hostlist, gres_gpu_indices
from wandb_infra.exporter.sources import (
    SchedulerCommand,
    compile_regex,
    source_keys,
    valid_run_key,
)

DEFAULT_COMMENT_REGEX = (
    r"wandb:(?P<entity>[^/\s]+)/(?P<project>[^/\s]+)/(?P<run_id>[A-Za-z0-9_.\-]+)"
)
COMMANDS = {"squeue_json": ["squeue", "--json"], "scontrol": ["scontrol", "show", "job", "-d"]}

SCHEMA = Section({
    **source_keys("slurm", interval=15, timeout=10),
    "mode": Key("str", "squeue_json", "squeue_json (squeue --json) or scontrol "
                "(scontrol show job -d)", choices=tuple(COMMANDS)),
    "command": Key("list[str]", None, "run this instead of the mode's command, e.g. [ssh, "
                   "slurm-head, squeue, --json]", optional=True),
    "comment_regex": Key("str", DEFAULT_COMMENT_REGEX, "regex over the job comment with named "
                         "groups run_id and optionally entity, project (empty: not read)"),
    "job_name_regex": Key("str", "", "regex over the job name, the same groups (empty: not "
                          "read)"),
    "default_entity": Key("str", "", "entity of a run whose regex match has none"),
    "default_project": Key("str", "", "project of a run whose regex match has none"),
    "max_output_bytes": Key("int", MAX_OUTPUT_BYTES, "more output is refused as a source error "
                            "(about 5x that in memory while parsing)", above=0),
}, help="running jobs whose comment (or name) names a W&B run")


@dataclass(frozen=True)
class SlurmJob:
    """The fields we need from one job, whatever the input format."""

    job_id: str
    name: str
    state: str
    comment: str
    nodes: list[str]
    gres_per_node: list[str]


@dataclass(frozen=True)
class RunNaming:
    """How a job names its run: comment regex, optional job-name regex, defaults."""

    comment_regex: re.Pattern[str] | None
    name_regex: re.Pattern[str] | None
    default_entity: str = ""
    default_project: str = ""

    def run_of(self, job: SlurmJob) -> RunKey | None:
        """The run a job belongs to, or None when it names none (or names it badly)."""
        for pattern, text in ((self.comment_regex, job.comment), (self.name_regex, job.name)):
            if pattern is None or not text:
                continue
            match = pattern.search(text)
            if not match:
                continue
            groups = match.groupdict()
            key = valid_run_key(groups.get("entity") or self.default_entity,
                                groups.get("project") or self.default_project,
                                groups.get("run_id"))
            if key:
                return key
        return None


def _number(value: object) -> str:
    """A job id from 22.05 (int) or newer (``{"set": true, "number": 5}``) JSON."""
    if isinstance(value, Mapping):
        if not value.get("set", True):
            return ""
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | str):
        return ""
    return str(value)


def _state(value: object) -> str:
    """22.05: ``"RUNNING"``; newer: a list of the base state plus flags."""
    if isinstance(value, list):
        names = [str(v) for v in value]
        return "RUNNING" if "RUNNING" in names else (names[0] if names else "")
    return str(value or "")


def _job_nodes(job: Mapping[str, Any]) -> list[str]:
    nodes = job.get("nodes")
    if isinstance(nodes, str) and nodes.strip():
        return expand_hostlist(nodes)
    resources = job.get("job_resources")
    if isinstance(resources, Mapping):
        inner = resources.get("nodes")
        if isinstance(inner, str):
            return expand_hostlist(inner)
        if isinstance(inner, Mapping):
            if isinstance(inner.get("list"), str):
                return expand_hostlist(inner["list"])
            alloc = inner.get("allocation")
            if isinstance(alloc, list):
                return [str(n["name"]) for n in alloc if isinstance(n, Mapping) and n.get("name")]
        alloc = resources.get("allocated_nodes")
        if isinstance(alloc, list):
            return [str(n["nodename"]) for n in alloc
                    if isinstance(n, Mapping) and n.get("nodename")]
    return []


def parse_squeue_json(text: str) -> tuple[list[SlurmJob], list[str]]:
    """Jobs from ``squeue --json``; malformed jobs are skipped and reported as problems."""
    jobs, problems = [], []
    for raw in json_list(text, "squeue --json", "jobs"):
        try:
            if not isinstance(raw, Mapping):
                raise TypeError("job is not an object")
            gres = raw.get("gres_detail") or []
            if not isinstance(gres, list):
                raise TypeError("gres_detail is not a list")
            jobs.append(SlurmJob(
                job_id=_number(raw.get("job_id")),
                name=str(raw.get("name") or ""),
                state=_state(raw.get("job_state")),
                comment=str(raw.get("comment") or ""),
                nodes=_job_nodes(raw),
                gres_per_node=[str(g) for g in gres],
            ))
        except (TypeError, KeyError, NodeListError) as exc:
            problems.append(f"skipped malformed squeue job: {exc}")
    return jobs, problems


_DETAIL = re.compile(r"^\s*Nodes=(\S+)\s.*?GRES=(\S*)")


def parse_scontrol(text: str) -> tuple[list[SlurmJob], list[str]]:
    """Jobs from ``scontrol show job -d`` (blank-line separated records)."""
    jobs, problems = [], []
    for block in re.split(r"\n\s*\n", text):
        if "JobId=" not in block:
            continue
        fields: dict[str, str] = {}
        gres_by_node: dict[str, str] = {}
        for line in block.splitlines():
            stripped = line.strip()
            if stripped.startswith("Comment="):
                fields["Comment"] = stripped[len("Comment="):].strip()
                continue
            detail = _DETAIL.match(line)
            if detail:
                try:
                    for node in expand_hostlist(detail.group(1)):
                        gres_by_node[node] = detail.group(2)
                except NodeListError as exc:
                    problems.append(f"skipped GRES detail: {exc}")
                continue
            name = re.search(r"JobName=(.*)$", stripped)
            if name and stripped.startswith("JobId="):
                fields["JobName"] = name.group(1).strip()
                stripped = stripped[:name.start()]
            for token in stripped.split():
                key, sep, value = token.partition("=")
                if sep and key not in fields:
                    fields[key] = value
        try:
            nodes = expand_hostlist(fields.get("NodeList", ""))
        except NodeListError as exc:
            problems.append(f"skipped job {fields.get('JobId')}: {exc}")
            continue
        jobs.append(SlurmJob(
            job_id=fields.get("JobId", ""), name=fields.get("JobName", ""),
            state=fields.get("JobState", ""),
            comment="" if fields.get("Comment") == "(null)" else fields.get("Comment", ""),
            nodes=nodes, gres_per_node=[gres_by_node.get(n, "") for n in nodes],
        ))
    return jobs, problems


def placements_from_jobs(jobs: Sequence[SlurmJob], naming: RunNaming,
                         source: str = "slurm") -> tuple[list[RunPlacement], list[str]]:
    """One placement per (running job that names a run, node), GPUs from that node's GRES."""
    out, problems = [], []
    for job in jobs:
        if job.state.upper() != "RUNNING":
            continue
        key = naming.run_of(job)
        if key is None:
            continue
        for i, node in enumerate(job.nodes):
            gres = job.gres_per_node[i] if i < len(job.gres_per_node) else ""
            try:
                gpus = tuple(Gpu(index=idx) for idx in gres_gpu_indices(gres))
            except NodeListError as exc:
                problems.append(f"job {job.job_id}: {exc}")
                gpus = ()
            extra = ((labels.SLURM_JOB_ID, job.job_id),) if job.job_id else ()
            out.append(RunPlacement(run=key, host=node, source=source, gpus=gpus, extra=extra))
    return out, problems


class SlurmSource:
    """Polls squeue/scontrol with a timeout; a failing command raises SourceError."""

    def __init__(self, cfg: Mapping[str, Any], runner: Any = subprocess.run) -> None:
        cfg = SCHEMA.resolve(cfg, "sources.slurm")
        self.name = str(cfg["name"])
        self.interval = float(cfg["interval_seconds"])
        self.command = SchedulerCommand.from_section(cfg, COMMANDS, runner)
        self.naming = RunNaming(
            comment_regex=compile_regex(cfg["comment_regex"], "sources.slurm.comment_regex"),
            name_regex=compile_regex(cfg["job_name_regex"], "sources.slurm.job_name_regex"),
            default_entity=cfg["default_entity"], default_project=cfg["default_project"])

    def poll(self) -> SourceResult:
        """Run the command and turn running jobs into placements."""
        parse = parse_squeue_json if self.command.mode == "squeue_json" else parse_scontrol
        jobs, problems = parse(self.command.output())
        placements, more = placements_from_jobs(jobs, self.naming, self.name)
        return SourceResult(placements, problems + more)
