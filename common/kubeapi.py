"""A connection to the Kubernetes API: in-cluster service account, a kubeconfig (token, token
file or client certificate users) or an explicit API server and token; paged lists.

Used by the exporter (pods, nodes) and by the bridge's optional quarantine (cordon and taint).
Exec plugins and auth providers (cloud CLIs, OIDC) need code this project does not run: they fail
at start in one line instead of as a 401 later.
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

from wandb_infra.common.commands import SourceError
from wandb_infra.common.configfile import ConfigError, read_secret
from wandb_infra.common.schema import Key, Section

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_PAGES = 10_000


def _status_error(status: int, resource: str) -> str:
    """What an unsuccessful list answer means, and what to fix."""
    return {
        401: "Kubernetes API: 401 unauthorized (token missing or expired)",
        403: f"Kubernetes API: 403 forbidden (grant 'list' on '{resource}' to the service "
             "account)",
        410: "Kubernetes API: 410 Gone (list expired)",
    }.get(status, f"Kubernetes API answered HTTP {status}")


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
    """(server, token, ca_file, insecure, client cert) of the kubeconfig's current context."""
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


# The connection keys of every section that talks to the API (sources.kubernetes,
# node_state.kubernetes, quarantine.kubernetes); each declares them with its own schema.
CONNECTION: dict[str, Key] = {
    "in_cluster": Key("bool", False, "use the pod's service account (in-cluster)"),
    "kubeconfig": Key("str", "", "kubeconfig file whose current context is used (token, "
                                 "tokenFile or client certificate users)"),
    "api_server": Key("str", "", "API server URL, with token or token_file"),
    "token": Key("str", None, 'bearer token with api_server ("env:NAME" reads a variable)',
                 optional=True, secret=True),
    "token_file": Key("str", None, "file holding that token (preferred; re-read on every call)",
                      optional=True),
    "ca_file": Key("str", None, "CA bundle of the API server", optional=True),
    "insecure_skip_tls_verify": Key("bool", False, "do not verify the API server's certificate"),
    "timeout_seconds": Key("number", 15, "timeout of one API call", minimum=0.001),
    "page_size": Key("int", 500, "items per list page", minimum=1),
}
CONNECTION_SECTION = Section(CONNECTION)


class KubeApi:
    """Connection settings from one validated config section (``where`` names it in errors),
    and the two calls everyone needs."""

    def __init__(self, cfg: Mapping[str, Any], where: str,
                 session: requests.Session | None = None) -> None:
        self.timeout = float(cfg["timeout_seconds"])
        self.page_size = int(cfg["page_size"])
        self.token_file: str | None = None
        self.token: str | None = None
        client_cert: tuple[str, str] | None = None
        insecure = bool(cfg["insecure_skip_tls_verify"])
        ca_file = cfg["ca_file"]
        if cfg["in_cluster"]:
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get(
                "KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise ConfigError(f"{where}.in_cluster: KUBERNETES_SERVICE_HOST unset")
            self.server = f"https://{host}:{port}"
            self.token_file = str(SA_DIR / "token")
            ca_file = ca_file or str(SA_DIR / "ca.crt")
        elif cfg["kubeconfig"]:
            self.server, self.token, kube_ca, kube_insecure, client_cert = _kubeconfig(
                str(cfg["kubeconfig"]))
            ca_file, insecure = ca_file or kube_ca, insecure or kube_insecure
        elif cfg["api_server"]:
            self.server = str(cfg["api_server"])
            self.token_file = cfg["token_file"]
            if not self.token_file:
                self.token = read_secret(cfg["token"], None, "Kubernetes token")
        else:
            raise ConfigError(f"{where} needs in_cluster, kubeconfig or api_server")
        if self.token_file:
            self.token = read_secret(None, self.token_file, "Kubernetes token")
        self.server = self.server.rstrip("/")
        self.session = session or requests.Session()
        self.session.trust_env = False
        self.session.verify = False if insecure else (ca_file or True)
        self.session.cert = client_cert

    def headers(self) -> dict[str, str]:
        """Accept JSON, with the bearer token (service-account tokens rotate: read each call)."""
        if self.token_file:
            self.token = read_secret(None, self.token_file, "Kubernetes token")
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def request(self, method: str, path: str, *, params: Mapping[str, str] | None = None,
                data: str | None = None, content_type: str | None = None) -> requests.Response:
        """One call; ``SourceError`` when the API cannot be reached."""
        headers = self.headers()
        if content_type:
            headers["Content-Type"] = content_type
        try:
            return self.session.request(method, self.server + path, params=params,
                                        headers=headers, data=data, timeout=self.timeout)
        except requests.RequestException as exc:
            raise SourceError(f"Kubernetes API unreachable: {type(exc).__name__}") from exc

    def list_all(self, path: str, resource: str,
                 params: Mapping[str, str] | None = None) -> list[Mapping[str, Any]]:
        """Every item of a list (all pages); restarts once when the continue token expired."""
        for attempt in range(2):
            items: list[Mapping[str, Any]] = []
            cont = ""
            for _ in range(MAX_PAGES):
                query = {"limit": str(self.page_size), **(params or {}),
                         **({"continue": cont} if cont else {})}
                resp = self.request("GET", path, params=query)
                if resp.status_code == 410 and attempt == 0:
                    break
                if resp.status_code != 200:
                    raise SourceError(_status_error(resp.status_code, resource))
                try:
                    body = resp.json()
                    items.extend(i for i in body["items"] or [] if isinstance(i, Mapping))
                    cont = str((body.get("metadata") or {}).get("continue") or "")
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    raise SourceError(f"Kubernetes API answered with a body that is not a "
                                      f"list of {resource}") from exc
                if not cont:
                    return items
            else:
                raise SourceError(f"more than {MAX_PAGES} pages of {resource}")
        raise SourceError("Kubernetes API: list expired twice (410 Gone)")
