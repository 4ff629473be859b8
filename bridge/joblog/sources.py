"""Where a run's console log is read: each source behind one small interface, each optional, each
failing on its own ("no console log: W&B returned 403") while the others stand.

* ``FileSource``: a local file (``explain --log FILE``);
* ``SlurmFiles``: the job's ``--output``/``--error`` files on a shared filesystem, by srun's
  filename pattern (``%j`` job id, ``%N`` node, ``%t`` task, ``%%``; https://slurm.schedmd.com/
  srun.html#SECTION_FILENAME-PATTERN); ``%N`` files name their node;
* ``KubernetesLogs``: ``GET /api/v1/namespaces/{ns}/pods/{pod}/log`` with ``tailLines``,
  ``limitBytes`` and, for a restarted container, ``previous=true`` (Kubernetes API reference,
  "Pod v1 core: read log"), through the same ``common.kubeapi`` connection as the exporter;
* ``WandbConsole``: W&B's GraphQL ``logLines(last: N)`` with ``number timestamp level label
  line``, the query the wandb SDK itself sends for a run's console log (wandb/wandb,
  ``core/api/graphql/query_run_console_logs.graphql``, ``RunConsoleLogTail``); in shared mode
  each writer's ``label`` is kept apart, one log per writer.

The W&B console capture sees Python's stdout/stderr of the processes that called ``wandb.init``
only (often rank 0), so NCCL's native warnings are usually in the scheduler's or the pod's log.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import requests

from wandb_infra.bridge.joblog.reading import Budget, Reading, Scanner, SourceStatus, tail
from wandb_infra.common.commands import SourceError
from wandb_infra.common.kubeapi import CONNECTION_SECTION, KubeApi
from wandb_infra.common.schema import Key, Section

MAX_FILES = 1024  # files one Slurm template may expand to
NOT_CONFIGURED = "not configured"
WANDB_LINES_MAX = 100_000
_FIELD = re.compile(r"%(\d*)([jNt%])")  # srun's filename pattern fields

CONSOLE_QUERY = """
query RunConsoleLogTail($entity: String!, $project: String!, $runName: String!, $last: Int!) {
  project(name: $project, entityName: $entity) {
    run(name: $runName) {
      logLineCount
      logLines(last: $last) { edges { node { number timestamp level label line } } }
    }
  }
}"""

SCHEMA = Section({
    "max_bytes": Key("int", 8 * 1024 * 1024, "bytes read from the end of each log at most "
                     "(the reading says when this cut the log)", minimum=4096),
    "max_lines": Key("int", 200_000, "lines read from the end of each log at most",
                     minimum=10),
    "wandb": Section({
        "enabled": Key("bool", False, "read the run's console log from W&B (logLines; needs "
                       "wandb.api_key)"),
        "last_lines": Key("int", 10_000, "console lines asked for (the tail)", minimum=1,
                          maximum=WANDB_LINES_MAX),
    }),
    "slurm": Section({
        "output": Key("str", "", "srun/sbatch --output path pattern on a filesystem the bridge "
                      "reads (%j job id, %N node, %t task, %% a percent sign); empty: off"),
        "error": Key("str", "", "the --error path pattern, when stderr goes elsewhere"),
        "max_tasks": Key("int", 64, "at most this many files for a %t pattern", minimum=1,
                         maximum=MAX_FILES),
    }),
    "kubernetes": Section({
        "enabled": Key("bool", False, "read each pod's log (and its previous container's)"),
        "container": Key("str", "", "container name (empty: the pod's only container)"),
        "previous": Key("bool", True, "also read the previous container of a restarted pod"),
        **CONNECTION_SECTION.keys,
    }),
}, help="the job's own console log (explain --log reads files without this section)")


@dataclass(frozen=True)
class LogText:
    """One log as fetched: whole-line bytes, or W&B lines with their timestamps."""

    name: str
    data: bytes = b""
    lines: tuple[tuple[str, float | None], ...] = ()
    host: str | None = None
    cut: bool = False


class LogSource(Protocol):
    """A place a run's console log may be read; ``fetch`` raises ``SourceError`` with a short
    reason when it cannot answer."""

    @property
    def name(self) -> str:
        """What the reading calls this source."""
        ...

    def fetch(self, budget: Budget) -> list[LogText]:
        """The logs this source holds for the run, each within ``budget``."""
        ...


@dataclass(frozen=True)
class FileSource:
    """A local file."""

    path: str
    host: str | None = None

    @property
    def name(self) -> str:
        """The path, as the reading names it."""
        return self.path

    def fetch(self, budget: Budget) -> list[LogText]:
        """The file's tail."""
        try:
            data, cut = tail(self.path, budget)
        except OSError as exc:
            raise SourceError(f"cannot read {self.path}: {exc.strerror or exc}") from exc
        return [LogText(self.path, data, host=self.host, cut=cut)]


def expand(template: str, job_id: str, node: str = "", task: int | None = None) -> str:
    """srun's filename pattern with ``%j``, ``%N``, ``%t`` and ``%%`` filled (``%5t`` style
    zero padding honoured); other ``%`` letters are left as written."""
    values = {"j": job_id, "N": node, "t": "" if task is None else str(task), "%": "%"}
    return _FIELD.sub(lambda m: values[m[2]].zfill(int(m[1] or 0)) if m[2] in "jt"
                      else values[m[2]], template)


@dataclass(frozen=True)
class SlurmFiles:
    """The job's output (and error) files by their srun pattern."""

    templates: tuple[str, ...]
    job_id: str
    nodes: tuple[str, ...] = ()
    max_tasks: int = 64

    @property
    def name(self) -> str:
        """What the reading calls this source."""
        return f"slurm job {self.job_id}"

    def paths(self) -> list[tuple[str, str | None]]:
        """(path, node) for every file the templates name, existing or not."""
        out: dict[str, str | None] = {}
        for template in self.templates:
            nodes: Sequence[str | None] = self.nodes if "%N" in template else (None,)
            tasks: Iterable[int | None] = range(self.max_tasks) if "%t" in template else (None,)
            for node in nodes:
                for task in tasks:
                    if len(out) < MAX_FILES:
                        out.setdefault(expand(template, self.job_id, node or "", task), node)
        return list(out.items())

    def fetch(self, budget: Budget) -> list[LogText]:
        """Each existing file's tail; SourceError when none exists."""
        texts = []
        for path, node in self.paths():
            if not os.path.isfile(path):
                continue
            try:
                data, cut = tail(path, budget)
            except OSError:
                continue
            texts.append(LogText(path, data, host=node, cut=cut))
        if not texts:
            shown = ", ".join(p for p, _ in self.paths()[:3])
            raise SourceError(f"no Slurm output file for job {self.job_id} ({shown})")
        return texts


@dataclass(frozen=True)
class Pod:
    """A pod of the run and the node it ran on."""

    namespace: str
    name: str
    node: str | None = None


@dataclass
class KubernetesLogs:
    """Each pod's log through the Kubernetes API (current container, and the previous one of a
    restarted pod)."""

    api: KubeApi
    pods: tuple[Pod, ...]
    container: str = ""
    previous: bool = True
    name: str = field(default="kubernetes pod logs")

    def _log(self, pod: Pod, budget: Budget, previous: bool) -> bytes | None:
        params = {"timestamps": "false"}
        if budget.max_lines is not None:
            params["tailLines"] = str(budget.max_lines)
        if budget.max_bytes is not None:
            params["limitBytes"] = str(budget.max_bytes)
        if self.container:
            params["container"] = self.container
        if previous:
            params["previous"] = "true"
        resp = self.api.request(
            "GET", f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/log", params=params)
        if previous and resp.status_code in (400, 404):
            return None  # no previous container: the pod never restarted
        if resp.status_code != 200:
            raise SourceError(f"Kubernetes API answered HTTP {resp.status_code} for "
                              f"pods/{pod.name}/log")
        return resp.content

    def fetch(self, budget: Budget) -> list[LogText]:
        """Every pod's log; one pod's failure is named and the others are read."""
        texts, errors = [], []
        for pod in self.pods:
            try:
                for previous in ((True, False) if self.previous else (False,)):
                    data = self._log(pod, budget, previous)
                    if data is None:
                        continue
                    if budget.max_bytes is not None and len(data) >= budget.max_bytes:
                        data = data[data.find(b"\n") + 1:]
                    name = f"{pod.namespace}/{pod.name}" + (" (previous)" if previous else "")
                    texts.append(LogText(name, data, host=pod.node,
                                         cut=budget.max_bytes is not None
                                         and len(data) >= budget.max_bytes - 4096))
            except SourceError as exc:
                errors.append(str(exc))
        if errors and not texts:
            raise SourceError("; ".join(errors[:3]))
        return texts


def _epoch(stamp: Any) -> float | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass
class WandbConsole:
    """The run's console log from W&B's GraphQL API."""

    base_url: str
    api_key: str
    entity: str
    project: str
    run_id: str
    last: int = 10_000
    timeout: float = 30.0
    session: requests.Session = field(default_factory=requests.Session)

    @property
    def name(self) -> str:
        """What the reading calls this source."""
        return f"W&B console log of {self.entity}/{self.project}/{self.run_id}"

    def fetch(self, budget: Budget) -> list[LogText]:
        """The tail of the run's console log, one ``LogText`` per shared-mode writer label."""
        token = base64.b64encode(f"api:{self.api_key}".encode()).decode()
        last = min(self.last, budget.max_lines or self.last, WANDB_LINES_MAX)
        body = {"query": CONSOLE_QUERY, "operationName": "RunConsoleLogTail",
                "variables": {"entity": self.entity, "project": self.project,
                              "runName": self.run_id, "last": last}}
        self.session.trust_env = False
        try:
            resp = self.session.post(f"{self.base_url.rstrip('/')}/graphql", json=body,
                                     headers={"Authorization": f"Basic {token}"},
                                     timeout=self.timeout)
        except requests.RequestException as exc:
            raise SourceError(f"W&B unreachable ({type(exc).__name__})") from exc
        if resp.status_code != 200:
            raise SourceError(f"W&B returned {resp.status_code}")
        try:
            payload = resp.json()
            errors = payload.get("errors")
            if errors:
                raise SourceError(f"W&B: {str(errors[0].get('message', errors[0]))[:200]}")
            run = ((payload.get("data") or {}).get("project") or {}).get("run")
        except (ValueError, AttributeError, TypeError) as exc:
            raise SourceError("W&B answered with a body that is not GraphQL JSON") from exc
        if not run:
            raise SourceError(f"W&B has no run {self.entity}/{self.project}/{self.run_id}")
        return _by_label(self.name, (run.get("logLines") or {}).get("edges") or [], budget)


def _by_label(name: str, edges: list[Any], budget: Budget) -> list[LogText]:
    """W&B's edges as one log per writer label (unlabelled lines: the primary writer)."""
    by: dict[str, list[tuple[str, float | None]]] = {}
    size = 0
    for edge in reversed(edges):  # newest first, so the byte budget keeps the tail
        node = edge.get("node") if isinstance(edge, Mapping) else None
        if not isinstance(node, Mapping) or not isinstance(node.get("line"), str):
            continue
        size += len(node["line"])
        if budget.max_bytes is not None and size > budget.max_bytes:
            break
        by.setdefault(str(node.get("label") or ""), []).append(
            (node["line"], _epoch(node.get("timestamp"))))
    return [LogText(f"{name}" + (f" [{label}]" if label else ""),
                    lines=tuple(reversed(lines)), host=label or None,
                    cut=budget.max_bytes is not None and size > budget.max_bytes)
            for label, lines in sorted(by.items())]


DEFAULT_BUDGET = Budget()


def read(sources: Iterable[LogSource], budget: Budget = DEFAULT_BUDGET) -> Reading:
    """The reading of every source; a source that fails is named and the rest stand."""
    scanner = Scanner()
    index = 0
    for source in sources:
        try:
            texts = source.fetch(budget)
        except SourceError as exc:
            scanner.sources.append(SourceStatus(source.name, error=f"no console log: {exc}"))
            continue
        for text in texts:
            if text.lines:
                for number, (line, epoch) in enumerate(text.lines, 1):
                    scanner.line(line, text.name, index, number, host=text.host, epoch=epoch)
                count, size = len(text.lines), sum(len(x) for x, _ in text.lines)
            else:
                count, size = scanner.feed(text.data, text.name, index, host=text.host), \
                    len(text.data)
            scanner.sources.append(SourceStatus(text.name, count, size, text.cut))
            index += 1
    return scanner.reading()


@dataclass(frozen=True)
class Settings:
    """The ``joblog`` config section, checked."""

    budget: Budget = DEFAULT_BUDGET
    wandb: bool = False
    wandb_last: int = 10_000
    slurm_templates: tuple[str, ...] = ()
    slurm_max_tasks: int = 64
    kubernetes: Mapping[str, Any] | None = None
    container: str = ""
    previous: bool = True

    @property
    def configured(self) -> bool:
        """Whether any source is configured (else the bridge reads no job log)."""
        return self.wandb or bool(self.slurm_templates) or self.kubernetes is not None

    @classmethod
    def from_config(cls, raw: Mapping[str, Any] | None) -> Settings:
        """The section over its defaults (``ConfigError`` names a bad key)."""
        cfg = SCHEMA.resolve(raw, "joblog")
        kube = cfg["kubernetes"]
        return cls(
            budget=Budget(cfg["max_bytes"], cfg["max_lines"]),
            wandb=cfg["wandb"]["enabled"], wandb_last=cfg["wandb"]["last_lines"],
            slurm_templates=tuple(t for t in (cfg["slurm"]["output"], cfg["slurm"]["error"])
                                  if t),
            slurm_max_tasks=cfg["slurm"]["max_tasks"],
            kubernetes={k: kube[k] for k in CONNECTION_SECTION.keys} if kube["enabled"]
            else None,
            container=kube["container"], previous=kube["previous"])


@dataclass(frozen=True)
class RunLogs:
    """Where one run's console log may be, as the bridge knows the run: its W&B path, its Slurm
    job and nodes, its pods."""

    entity: str
    project: str
    run_id: str
    slurm_job_id: str = ""
    nodes: tuple[str, ...] = ()
    pods: tuple[Pod, ...] = ()


@dataclass(frozen=True)
class Unavailable:
    """A source this run cannot use, kept so the reading names it and why."""

    name: str
    reason: str

    def fetch(self, budget: Budget) -> list[LogText]:
        """Always the reason."""
        raise SourceError(self.reason)


def for_run(settings: Settings, run: RunLogs, *, wandb_base_url: str = "",
            wandb_api_key: str | None = None, kube: KubeApi | None = None) -> list[LogSource]:
    """The sources for ``run``: each configured one it can use, and for each other an
    ``Unavailable`` saying why (not configured, no W&B key, no Slurm job id, no pods), so the
    reading names every place it did not read."""
    out: list[LogSource] = []
    wandb_name = f"W&B console log of {run.entity}/{run.project}/{run.run_id}"
    if not settings.wandb:
        out.append(Unavailable(wandb_name, f"{NOT_CONFIGURED} (joblog.wandb.enabled)"))
    elif not wandb_api_key:
        out.append(Unavailable(wandb_name, "no W&B API key (wandb.api_key)"))
    else:
        out.append(WandbConsole(wandb_base_url, wandb_api_key, run.entity, run.project,
                                run.run_id, last=settings.wandb_last))
    if not settings.slurm_templates:
        out.append(Unavailable("Slurm output files", f"{NOT_CONFIGURED} (joblog.slurm.output)"))
    elif not run.slurm_job_id:
        out.append(Unavailable("Slurm output files", "the run has no Slurm job id"))
    else:
        out.append(SlurmFiles(settings.slurm_templates, run.slurm_job_id, run.nodes,
                              settings.slurm_max_tasks))
    if settings.kubernetes is None or kube is None:
        out.append(Unavailable("Kubernetes pod logs",
                               f"{NOT_CONFIGURED} (joblog.kubernetes.enabled)"))
    elif not run.pods:
        out.append(Unavailable("Kubernetes pod logs", "the run has no pods"))
    else:
        out.append(KubernetesLogs(kube, run.pods, settings.container, settings.previous))
    return out
