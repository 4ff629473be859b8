"""W&B source: the running runs of configured projects, placed by what each writer recorded.

The W&B SDK stores every writer's environment in the run config as ``_wandb.e.<writer_id>``:
``host``, ``gpu_nvidia`` (the GPUs NVML sees, with ``uuid``) and ``slurm`` (``SLURM_*`` variables,
lower-cased, prefix stripped). Each writer's host is a placement; its GPUs are those of
``slurm.job_gpus``/``step_gpus`` when set (indices, with the UUID at that NVML index), otherwise
every GPU it lists. A multi-node Slurm run that logs from rank 0 only still maps to all its nodes by
expanding ``slurm.job_nodelist`` (the other nodes without GPU detail).
Queried with raw GraphQL over ``requests`` (``Authorization: Basic base64("api:" + key)``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping
from typing import Any

import requests

from wandb_infra.common import labels
from wandb_infra.common.commands import SourceError
from wandb_infra.common.configfile import ConfigError, read_secret
from wandb_infra.common.labels import NAME_CHARS
from wandb_infra.common.runkey import RunKey
from wandb_infra.common.schema import Key, Section
from wandb_infra.exporter.model import Gpu, RunPlacement, SourceResult
from wandb_infra.exporter.nodelist import (
    MAX_HOSTS,
    NodeListError,
    expand_hostlist,
    gres_gpu_indices,
)
from wandb_infra.exporter.sources import source_keys, valid_run_key

RUNS_QUERY = """
query ExporterRunningRuns($entity: String!, $project: String!, $first: Int!, $after: String) {
  project(name: $project, entityName: $entity) {
    runs(filters: "{\\"state\\":\\"running\\"}", first: $first, after: $after) {
      edges { node { id name displayName state group config } }
      pageInfo { endCursor hasNextPage }
    }
  }
}
"""
MAX_PAGES = 1000

SCHEMA = Section({
    **source_keys("wandb", interval=60, timeout=20),
    "base_url": Key("str", "https://api.wandb.ai", "W&B API base URL (self-managed: its URL)",
                    check=lambda url: url.startswith(("http://", "https://")),
                    expect="an http(s) URL"),
    "api_key": Key("str", None, 'W&B API key ("env:NAME" reads a variable)', optional=True,
                   secret=True),
    "api_key_file": Key("str", None, "file holding the API key (preferred)", optional=True),
    "projects": Key("list[str]", [], '"entity/project" whose running runs are placed '
                    "(required when enabled)"),
    "page_size": Key("int", 100, "runs per GraphQL page", above=0),
}, help="running runs of these projects, placed by each writer's host and GPUs")


def _unwrap(value: object) -> object:
    """Config entries are ``{"value": ..., "desc": ...}`` on the wire; accept bare values too."""
    if isinstance(value, Mapping) and "value" in value and set(value) <= {"value", "desc"}:
        return value["value"]
    return value


def writer_environments(config: object) -> list[Mapping[str, Any]]:
    """The ``_wandb.e.<writer>`` environment records of a run config (dict or JSON string)."""
    if isinstance(config, str):
        try:
            config = json.loads(config) if config else {}
        except ValueError:
            return []
    if not isinstance(config, Mapping):
        return []
    wandb_meta = _unwrap(config.get("_wandb"))
    if not isinstance(wandb_meta, Mapping):
        return []
    envs = wandb_meta.get("e")
    if not isinstance(envs, Mapping):
        return []
    return [env for _, env in sorted(envs.items()) if isinstance(env, Mapping)]


def _indices(slurm: Mapping[str, Any]) -> list[str]:
    for key in ("step_gpus", "job_gpus"):
        raw = slurm.get(key)
        if isinstance(raw, str) and raw.strip():
            try:
                return gres_gpu_indices(f"gpu:0(IDX:{raw.strip()})")
            except NodeListError:
                return []
    return []


def writer_gpus(env: Mapping[str, Any]) -> tuple[Gpu, ...]:
    """GPUs one writer used: Slurm-assigned indices (+UUID at that index) or every listed GPU."""
    listed = env.get("gpu_nvidia", env.get("gpuNvidia")) or []
    uuids = [str(g.get("uuid") or "") if isinstance(g, Mapping) else "" for g in listed] \
        if isinstance(listed, list) else []
    slurm = env.get("slurm")
    indices = _indices(slurm) if isinstance(slurm, Mapping) else []
    if indices:
        return tuple(Gpu(i, uuids[int(i)] if int(i) < len(uuids) else "") for i in indices)
    return tuple(Gpu(str(i), u) for i, u in enumerate(uuids) if u)


def run_placements(run: RunKey, node: Mapping[str, Any], source: str) -> list[RunPlacement]:
    """Placements of one GraphQL run node (may be empty when nothing records a host)."""
    name = str(node.get("displayName") or "")
    group = str(node.get("group") or "")
    out: dict[str, RunPlacement] = {}
    nodelists: list[tuple[str, str]] = []
    for env in writer_environments(node.get("config")):
        host = env.get("host")
        raw_slurm = env.get("slurm")
        slurm: Mapping[str, Any] = raw_slurm if isinstance(raw_slurm, Mapping) else {}
        job_id = str(slurm.get("job_id") or "")
        extra = tuple(e for e in ((labels.RUN_GROUP, group), (labels.SLURM_JOB_ID, job_id)) if e[1])
        if isinstance(host, str) and host and host not in out:
            out[host] = RunPlacement(run, host, source, writer_gpus(env), name, extra)
        nodelist = slurm.get("job_nodelist") or slurm.get("nodelist")
        if isinstance(nodelist, str):
            nodelists.append((nodelist, job_id))
    seen = {h.split(".")[0].lower() for h in out}
    for nodelist, job_id in nodelists:
        try:
            hosts = expand_hostlist(nodelist)
        except NodeListError:
            continue
        extra = tuple(e for e in ((labels.RUN_GROUP, group), (labels.SLURM_JOB_ID, job_id)) if e[1])
        for host in hosts:
            if len(out) >= MAX_HOSTS:  # one run's nodelists; the merger's bound cuts further
                break
            if host.split(".")[0].lower() not in seen:
                seen.add(host.split(".")[0].lower())
                out[host] = RunPlacement(run, host, source, (), name, extra)
    return list(out.values())


class WandbRunsSource:
    """Polls the W&B GraphQL API for running runs of the configured projects."""

    def __init__(self, cfg: Mapping[str, Any], session: requests.Session | None = None) -> None:
        cfg = SCHEMA.resolve(cfg, "sources.wandb")
        self.name = str(cfg["name"])
        self.interval = float(cfg["interval_seconds"])
        self.timeout = float(cfg["timeout_seconds"])
        self.page_size = int(cfg["page_size"])
        self.base_url = str(cfg["base_url"]).rstrip("/")
        key = read_secret(cfg["api_key"], cfg["api_key_file"], "W&B API key")
        if not key:
            raise ConfigError("sources.wandb needs api_key or api_key_file")
        self.api_key = key
        projects = cfg["projects"]
        if not projects:
            raise ConfigError("sources.wandb.projects must be a non-empty list of entity/project")
        self.projects: list[tuple[str, str]] = []
        for item in projects:
            entity, _, project = str(item).partition("/")
            if not (NAME_CHARS.fullmatch(entity) and NAME_CHARS.fullmatch(project)):
                raise ConfigError(f"sources.wandb.projects: {item!r} is not entity/project")
            self.projects.append((entity, project))
        self.session = session or requests.Session()
        self.session.trust_env = False
        token = base64.b64encode(f"api:{key}".encode()).decode()
        self.headers = {"Authorization": f"Basic {token}", "Content-Type": "application/json",
                        "User-Agent": "wandb-infra-exporter"}

    def _pages(self, entity: str, project: str) -> Iterator[list[Mapping[str, Any]]]:
        after: str | None = None
        for _ in range(MAX_PAGES):
            variables = {"entity": entity, "project": project, "first": self.page_size,
                         "after": after}
            try:
                resp = self.session.post(f"{self.base_url}/graphql", headers=self.headers,
                                         json={"query": RUNS_QUERY, "variables": variables,
                                               "operationName": "ExporterRunningRuns"},
                                         timeout=self.timeout)
            except requests.RequestException as exc:
                raise SourceError(f"W&B API unreachable: {type(exc).__name__}") from exc
            if resp.status_code != 200:
                raise SourceError(f"W&B API answered HTTP {resp.status_code} for "
                                  f"{entity}/{project}")
            try:
                body = resp.json()
            except ValueError as exc:
                raise SourceError("W&B API answered with non-JSON") from exc
            if not isinstance(body, Mapping):
                raise SourceError("W&B API answered with a non-object")
            if body.get("errors"):
                raise SourceError(f"W&B API error for {entity}/{project}: "
                                  f"{str(body['errors'])[:300]}")
            proj = (body.get("data") or {}).get("project")
            if proj is None:
                raise SourceError(f"W&B project {entity}/{project} not found")
            runs = proj.get("runs") or {}
            yield [e.get("node") or {} for e in runs.get("edges") or [] if isinstance(e, Mapping)]
            info = runs.get("pageInfo") or {}
            if not info.get("hasNextPage") or not info.get("endCursor"):
                return
            after = str(info["endCursor"])
        raise SourceError(f"more than {MAX_PAGES} pages of runs in {entity}/{project}")

    def poll(self) -> SourceResult:
        """Every running run of every configured project."""
        result = SourceResult()
        for entity, project in self.projects:
            for nodes in self._pages(entity, project):
                for node in nodes:
                    if not isinstance(node, Mapping):
                        result.problems.append("run node is not an object")
                        continue
                    if str(node.get("state", "running")).lower() != "running":
                        continue
                    run = valid_run_key(entity, project, node.get("name"))
                    if run is None:
                        result.problems.append(f"bad run id {str(node.get('name'))[:60]!r}")
                        continue
                    try:
                        result.placements.extend(run_placements(run, node, self.name))
                    except (TypeError, ValueError, AttributeError) as exc:
                        result.problems.append(f"run {run.path()}: unreadable config ({exc})")
        return result
