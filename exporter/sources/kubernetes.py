"""Kubernetes source: running pods that carry a W&B run id, mapped to ``spec.nodeName``.

A pod names its run with a label or annotation (default ``wandb.ai/run-id``, plus optional
``wandb.ai/entity``/``wandb.ai/project``), or with ``WANDB_RUN_ID``/``WANDB_PROJECT``/
``WANDB_ENTITY`` in a container's env (what W&B Launch sets). Auth: in-cluster service account, a
kubeconfig (token users), or an explicit API server + token. Lists use ``limit``/``continue``
paging; an expired continue token (410) restarts the list once; 401/403 say what to fix.
"""

from __future__ import annotations

import base64
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import requests
import yaml

from exporter import labels
from exporter.configfile import ConfigError, read_secret
from exporter.model import RunPlacement, SourceError, SourceResult
from exporter.sources import valid_run_key

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_PAGES = 10_000
_STATUS_ERRORS = {
    401: "Kubernetes API: 401 unauthorized (token missing or expired)",
    403: "Kubernetes API: 403 forbidden (grant 'list' on 'pods' to the service account)",
    410: "Kubernetes API: 410 Gone (list expired)",
}


def _data_file(data: str, suffix: str) -> str:
    """A kubeconfig ``*-data`` field (base64) as a private temporary file, for ``requests``."""
    with tempfile.NamedTemporaryFile("wb", suffix=suffix, delete=False) as handle:
        os.chmod(handle.name, 0o600)
        handle.write(base64.b64decode(data))
        return handle.name


def _client_cert(user: Mapping[str, Any]) -> tuple[str, str] | None:
    """The user's client certificate and key files (paths or ``*-data``), if it has them."""
    cert = user.get("client-certificate") or (
        _data_file(user["client-certificate-data"], ".crt")
        if user.get("client-certificate-data") else None)
    key = user.get("client-key") or (
        _data_file(user["client-key-data"], ".key") if user.get("client-key-data") else None)
    return (str(cert), str(key)) if cert and key else None


def _kubeconfig(path: str) -> tuple[str, str | None, str | None, bool, tuple[str, str] | None]:
    """(server, token, ca_file, insecure, client cert) of the kubeconfig's current context.

    Supported users: a token, a token file, or a client certificate. Exec plugins and auth
    providers (cloud CLIs, OIDC) need code this exporter does not run: they fail here in one
    line instead of as a 401 later.
    """
    try:
        data = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read kubeconfig {path}: {exc}") from exc
    try:
        ctx_name = data["current-context"]
        ctx = next(c["context"] for c in data["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in data["clusters"] if c["name"] == ctx["cluster"])
        user: Mapping[str, Any] = next(
            (u["user"] for u in data.get("users") or [] if u["name"] == ctx.get("user")), {})
    except (KeyError, TypeError, StopIteration) as exc:
        raise ConfigError(f"kubeconfig {path}: current context incomplete ({exc})") from exc
    token = user.get("token")
    if not token and user.get("tokenFile"):
        token = read_secret(None, user["tokenFile"], "kubeconfig tokenFile")
    cert = _client_cert(user)
    if not token and not cert:
        how = ("an exec plugin (" + str((user.get("exec") or {}).get("command", "?")) + ")"
               if user.get("exec") else "an auth provider" if user.get("auth-provider")
               else "no credentials")
        raise ConfigError(
            f"kubeconfig {path}: user {ctx.get('user')!r} has {how}; supported are token, "
            "tokenFile and client certificates: run the exporter in-cluster (in_cluster: true) "
            "or set sources.kubernetes.api_server with token[_file]")
    ca_file = cluster.get("certificate-authority")
    if not ca_file and cluster.get("certificate-authority-data"):
        ca_file = _data_file(cluster["certificate-authority-data"], ".crt")
    return (str(cluster["server"]), token, ca_file,
            bool(cluster.get("insecure-skip-tls-verify", False)), cert)


def _env_of(pod: Mapping[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    spec = pod.get("spec") or {}
    for container in spec.get("containers") or []:
        for item in (container or {}).get("env") or []:
            if isinstance(item, Mapping) and isinstance(item.get("value"), str):
                env.setdefault(str(item.get("name")), item["value"])
    return env


class KubernetesSource:
    """Lists running pods through the Kubernetes API with ``requests``."""

    def __init__(self, cfg: Mapping[str, Any], session: requests.Session | None = None) -> None:
        self.name = str(cfg.get("name") or "kubernetes")
        self.interval = float(cfg.get("interval_seconds", 30))
        self.timeout = float(cfg.get("timeout_seconds", 15))
        self.page_size = int(cfg.get("page_size", 500))
        self.namespace = str(cfg.get("namespace") or "")
        self.label_selector = str(cfg.get("label_selector") or "")
        self.run_id_key = str(cfg.get("run_id_key") or "wandb.ai/run-id")
        self.entity_key = str(cfg.get("entity_key") or "wandb.ai/entity")
        self.project_key = str(cfg.get("project_key") or "wandb.ai/project")
        self.default_entity = str(cfg.get("default_entity") or "")
        self.default_project = str(cfg.get("default_project") or "")
        self.token_file: str | None = None
        self.token: str | None = None
        client_cert: tuple[str, str] | None = None
        insecure = bool(cfg.get("insecure_skip_tls_verify", False))
        ca_file = cfg.get("ca_file")
        if cfg.get("in_cluster"):
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get(
                "KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise ConfigError("sources.kubernetes.in_cluster: KUBERNETES_SERVICE_HOST unset")
            self.server = f"https://{host}:{port}"
            self.token_file = str(SA_DIR / "token")
            ca_file = ca_file or str(SA_DIR / "ca.crt")
        elif cfg.get("kubeconfig"):
            self.server, self.token, kube_ca, kube_insecure, client_cert = _kubeconfig(
                str(cfg["kubeconfig"]))
            ca_file, insecure = ca_file or kube_ca, insecure or kube_insecure
        elif cfg.get("api_server"):
            self.server = str(cfg["api_server"])
            self.token_file = cfg.get("token_file")
            if not self.token_file:
                self.token = read_secret(cfg.get("token"), None, "Kubernetes token")
        else:
            raise ConfigError("sources.kubernetes needs in_cluster, kubeconfig or api_server")
        if self.token_file:
            self.token = read_secret(None, self.token_file, "Kubernetes token")
        self.server = self.server.rstrip("/")
        self.session = session or requests.Session()
        self.session.trust_env = False
        self.session.verify = False if insecure else (ca_file or True)
        self.session.cert = client_cert

    def _headers(self) -> dict[str, str]:
        if self.token_file:  # service-account tokens rotate: read each poll
            self.token = read_secret(None, self.token_file, "Kubernetes token")
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def list_pods(self) -> list[Mapping[str, Any]]:
        """Every running pod (all pages); restarts once when the continue token expired."""
        path = (f"/api/v1/namespaces/{self.namespace}/pods" if self.namespace
                else "/api/v1/pods")
        for attempt in range(2):
            pods: list[Mapping[str, Any]] = []
            cont = ""
            for _ in range(MAX_PAGES):
                status, items, cont = self._page(path, cont)
                if status == 410 and attempt == 0:
                    break
                if status != 200:
                    raise SourceError(_STATUS_ERRORS.get(
                        status, f"Kubernetes API answered HTTP {status}"))
                pods.extend(items)
                if not cont:
                    return pods
            else:
                raise SourceError(f"more than {MAX_PAGES} pages of pods")
        raise SourceError("Kubernetes API: list expired twice (410 Gone)")

    def _page(self, path: str, cont: str) -> tuple[int, list[Mapping[str, Any]], str]:
        params = {"limit": str(self.page_size), "fieldSelector": "status.phase=Running"}
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        if cont:
            params["continue"] = cont
        try:
            resp = self.session.get(self.server + path, params=params, headers=self._headers(),
                                    timeout=self.timeout)
        except requests.RequestException as exc:
            raise SourceError(f"Kubernetes API unreachable: {type(exc).__name__}") from exc
        if resp.status_code != 200:
            return resp.status_code, [], ""
        try:
            body = resp.json()
            items = [p for p in body["items"] or [] if isinstance(p, Mapping)]
            next_cont = (body.get("metadata") or {}).get("continue") or ""
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SourceError("Kubernetes API answered with a non-PodList body") from exc
        return 200, items, str(next_cont)

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
