"""A local HTTP server answering the Kubernetes API's pod list the way a real API server does.

A cluster cannot run here, so the Kubernetes source is tested against this: ``GET /api/v1/pods`` and
``/api/v1/namespaces/<ns>/pods`` returning ``PodList`` objects, ``limit``/``continue`` paging,
``fieldSelector`` (``status.phase``, ``spec.nodeName``) and equality ``labelSelector``, bearer-token
auth (401), an RBAC denial switch (403), and expiring continue tokens (410 ``Expired``), each with
the ``Status`` body the real server sends.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


def make_pod(name: str, node: str | None, namespace: str = "default", *,
             labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
             env: dict[str, str] | None = None, phase: str = "Running") -> dict[str, Any]:
    """A Pod object with the fields a real API server returns (trimmed)."""
    spec: dict[str, Any] = {"containers": [
        {"name": "trainer", "image": "trainer:1",
         "env": [{"name": k, "value": v} for k, v in (env or {}).items()]
         + [{"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                         "labels": labels or {}, "annotations": annotations or {}},
            "spec": spec, "status": {"phase": phase}}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class K8sStandin:
    """Context manager: ``.url``, ``.token``, ``.pods`` (list of Pod dicts) and switches:
    ``forbidden`` (403), ``expire_continue_tokens`` (next N continues get 410), ``garbage_items``
    (malformed objects put unfiltered into the first page, for robustness tests)."""

    def __init__(self, token: str = "k8s-test-token-0123456789") -> None:  # noqa: S107
        self.token = token
        self.pods: list[dict[str, Any]] = []
        self.garbage_items: list[Any] = []
        self.forbidden = False
        self.expire_continue_tokens = 0
        self.requests: list[dict[str, list[str]]] = []
        self.resource_version = 1000
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.url = ""

    def __enter__(self) -> K8sStandin:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def set_pods(self, pods: list[dict[str, Any]]) -> None:
        """Replace the cluster's pods (a new resourceVersion, so old continue tokens expire)."""
        with self._lock:
            self.pods = list(pods)
            self.resource_version += 1

    def list_pods(self, namespace: str | None, query: dict[str, list[str]]
                  ) -> tuple[int, dict[str, Any]]:
        """The API server's answer to one list request."""
        with self._lock:
            self.requests.append(query)
            if self.forbidden:
                where = f"in the namespace \"{namespace}\"" if namespace else "at the cluster scope"
                return 403, _status(403, "Forbidden", 'pods is forbidden: User "system:'
                                    'serviceaccount:monitoring:exporter" cannot list resource '
                                    f'"pods" in API group "" {where}')
            pods = [p for p in self.pods
                    if namespace is None or p["metadata"]["namespace"] == namespace]
            pods = [p for p in pods if _selected(p, query)]
            pods.sort(key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
            start = 0
            if query.get("continue"):
                try:
                    rv, offset = base64.b64decode(query["continue"][0]).decode().split(":")
                    start = int(offset)
                except ValueError:
                    return 400, _status(400, "BadRequest", "invalid continue token")
                if self.expire_continue_tokens > 0 or int(rv) != self.resource_version:
                    self.expire_continue_tokens = max(0, self.expire_continue_tokens - 1)
                    return 410, _status(410, "Expired", "The provided continue parameter is "
                                        "too old to display a consistent list result.")
            limit = int(query.get("limit", ["0"])[0] or 0) or len(pods) or 1
            page = pods[start:start + limit]
            nxt = start + len(page)
            meta: dict[str, Any] = {"resourceVersion": str(self.resource_version)}
            if nxt < len(pods):
                meta["continue"] = base64.b64encode(
                    f"{self.resource_version}:{nxt}".encode()).decode()
                meta["remainingItemCount"] = len(pods) - nxt
            garbage = self.garbage_items if start == 0 else []
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": meta,
                         "items": [*garbage, *page]}


def _selected(pod: dict[str, Any], query: dict[str, list[str]]) -> bool:
    for selector in query.get("fieldSelector", []):
        for term in filter(None, selector.split(",")):
            key, _, value = term.partition("=")
            actual = {"status.phase": pod["status"].get("phase"),
                      "spec.nodeName": pod["spec"].get("nodeName", ""),
                      "metadata.namespace": pod["metadata"]["namespace"]}.get(key)
            if actual != value:
                return False
    for selector in query.get("labelSelector", []):
        for term in filter(None, selector.split(",")):
            key, eq, value = term.partition("=")
            labels = pod["metadata"].get("labels") or {}
            if (eq and labels.get(key) != value) or (not eq and key not in labels):
                return False
    return True


def _handler(server: K8sStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            url = urlparse(self.path)
            if self.headers.get("Authorization", "") != f"Bearer {server.token}":
                self._send(401, _status(401, "Unauthorized", "Unauthorized"))
                return
            parts = url.path.strip("/").split("/")
            namespace = None
            if parts == ["api", "v1", "pods"]:
                pass
            elif len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"] \
                    and parts[4] == "pods":
                namespace = parts[3]
            else:
                self._send(404, _status(404, "NotFound", "the server could not find the "
                                        "requested resource"))
                return
            code, body = server.list_pods(namespace, parse_qs(url.query))
            self._send(code, body)

    return Handler
