"""Kubernetes source: running pods that carry a W&B run id, mapped to ``spec.nodeName``.

A pod names its run with a label or annotation (default ``wandb.ai/run-id``, plus optional
``wandb.ai/entity``/``wandb.ai/project``), or with ``WANDB_RUN_ID``/``WANDB_PROJECT``/
``WANDB_ENTITY`` in a container's env (what W&B Launch sets). The connection (in-cluster, kubeconfig
or API server + token) and the paged list are ``common.kubeapi``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import requests

from wandb_infra.common import labels
from wandb_infra.common.kubeapi import CONNECTION, KubeApi
from wandb_infra.common.schema import Key, Section
from wandb_infra.exporter.model import RunPlacement, SourceResult
from wandb_infra.exporter.sources import source_keys, valid_run_key

SCHEMA = Section({
    **source_keys("kubernetes", interval=30, timeout=None),
    **CONNECTION,
    "namespace": Key("str", "", "list pods of this namespace only (empty: all; needs a "
                     "cluster-wide 'list' on pods)"),
    "label_selector": Key("str", "", "list only pods matching this label selector"),
    "run_id_key": Key("str", "wandb.ai/run-id", "label or annotation holding the run id "
                      "(else WANDB_RUN_ID in a container's env)"),
    "entity_key": Key("str", "wandb.ai/entity", "label or annotation holding the entity"),
    "project_key": Key("str", "wandb.ai/project", "label or annotation holding the project"),
    "default_entity": Key("str", "", "entity of a pod that names none"),
    "default_project": Key("str", "", "project of a pod that names none"),
}, help="running pods that carry a W&B run id (label, annotation or WANDB_* env)")


def _env_of(pod: Mapping[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    spec = pod.get("spec") or {}
    for container in spec.get("containers") or []:
        for item in (container or {}).get("env") or []:
            if isinstance(item, Mapping) and isinstance(item.get("value"), str):
                env.setdefault(str(item.get("name")), item["value"])
    return env


class KubernetesSource:
    """Lists running pods through the Kubernetes API."""

    def __init__(self, cfg: Mapping[str, Any], session: requests.Session | None = None) -> None:
        cfg = SCHEMA.resolve(cfg, "sources.kubernetes")
        self.api = KubeApi(cfg, "sources.kubernetes", session)
        self.name = str(cfg["name"])
        self.interval = float(cfg["interval_seconds"])
        self.namespace = str(cfg["namespace"])
        self.label_selector = str(cfg["label_selector"])
        self.run_id_key = str(cfg["run_id_key"])
        self.entity_key = str(cfg["entity_key"])
        self.project_key = str(cfg["project_key"])
        self.default_entity = str(cfg["default_entity"])
        self.default_project = str(cfg["default_project"])

    def list_pods(self) -> list[Mapping[str, Any]]:
        """Every running pod (all pages)."""
        path = (f"/api/v1/namespaces/{self.namespace}/pods" if self.namespace
                else "/api/v1/pods")
        params = {"fieldSelector": "status.phase=Running"}
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        return self.api.list_all(path, "pods", params)

    def placement_of(self, pod: Mapping[str, Any]) -> RunPlacement | None:
        """The run a running pod belongs to, on its node (None when it names no run)."""
        meta = pod.get("metadata") or {}
        tags = {**(meta.get("annotations") or {}), **(meta.get("labels") or {})}
        env = _env_of(pod)
        run_id = tags.get(self.run_id_key) or env.get("WANDB_RUN_ID")
        if not run_id:
            return None
        entity = tags.get(self.entity_key) or env.get("WANDB_ENTITY") or self.default_entity
        project = tags.get(self.project_key) or env.get("WANDB_PROJECT") or self.default_project
        run = valid_run_key(entity, project, run_id)
        node = (pod.get("spec") or {}).get("nodeName")
        status = (pod.get("status") or {}).get("phase", "Running")
        if run is None or not isinstance(node, str) or not node or status != "Running":
            return None
        extra = tuple(e for e in ((labels.NAMESPACE, str(meta.get("namespace") or "")),
                                  (labels.POD, str(meta.get("name") or "")),
                                  (labels.RUN_GROUP, env.get("WANDB_RUN_GROUP", ""))) if e[1])
        return RunPlacement(run, node, self.name, (), "", extra)

    def poll(self) -> SourceResult:
        """All running pods that name a run; a malformed pod is skipped and reported."""
        result = SourceResult()
        for pod in self.list_pods():
            try:
                placement = self.placement_of(pod)
            except (TypeError, AttributeError) as exc:
                result.problems.append(f"skipped malformed pod: {exc}")
                continue
            if placement:
                result.placements.append(placement)
        return result
