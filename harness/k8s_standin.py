"""A local HTTP server answering the Kubernetes API's pod list the way a real API server does.

A cluster cannot run here, so the Kubernetes source is tested against this: ``GET /api/v1/pods`` and
``/api/v1/namespaces/<ns>/pods`` returning ``PodList`` objects, ``limit``/``continue`` paging,
``fieldSelector`` (``status.phase``, ``spec.nodeName``) and equality ``labelSelector``, bearer-token
auth (401), an RBAC denial switch (403), and expiring continue tokens (410 ``Expired``), each with
the ``Status`` body the real server sends.

Nodes: ``GET /api/v1/nodes`` (``NodeList``, ``limit``/``continue``), ``GET /api/v1/nodes/<name>``
and ``PATCH /api/v1/nodes/<name>`` with ``application/merge-patch+json`` (what cordon and taint
writes use): each write bumps the node's ``metadata.resourceVersion``; a patch carrying a stale
``metadata.resourceVersion`` gets 409 ``Conflict``, as does the next patch after
``conflict_next_patches`` is set (another writer got there first); ``patch_forbidden`` answers 403.

Pod logs: ``GET /api/v1/namespaces/<ns>/pods/<pod>/log`` as ``text/plain`` with ``tailLines``,
``limitBytes`` and ``previous`` (Kubernetes API reference, "read log of the specified Pod"): 404
``NotFound`` for an unknown pod, 400 ``BadRequest`` when the previous container is asked for and
the pod never restarted, ``logs_forbidden`` answers 403.
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


def make_node(name: str, *, ready: bool = True, unschedulable: bool = False,
              taints: list[dict[str, str]] | None = None,
              conditions: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A Node object with the fields a real API server returns (trimmed)."""
    spec: dict[str, Any] = {}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    conds = [{"type": "Ready", "status": "True" if ready else "False",
              "reason": "KubeletReady" if ready else "KubeletNotReady"},
             {"type": "MemoryPressure", "status": "False"}, *(conditions or [])]
    return {"metadata": {"name": name, "uid": f"uid-node-{name}", "resourceVersion": "1",
                         "labels": {"kubernetes.io/hostname": name}},
            "spec": spec, "status": {"conditions": conds}}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (null deletes a key; lists replace)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


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
        self.nodes: dict[str, dict[str, Any]] = {}
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.conflict_next_patches = 0
        self.patch_forbidden = False
        self.logs: dict[tuple[str, str, bool], bytes] = {}
        self.logs_forbidden = False
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

    def set_log(self, namespace: str, pod: str, text: bytes, previous: bool = False) -> None:
        """A pod's container log (``previous``: the container before its last restart)."""
        with self._lock:
            self.logs[(namespace, pod, previous)] = text

    def read_log(self, namespace: str, pod: str, query: dict[str, list[str]]
                 ) -> tuple[int, bytes | dict[str, Any]]:
        """The API server's answer to one log read: the tail by ``tailLines``, then cut to
        ``limitBytes`` (from the start of that tail, as the kubelet stops reading there)."""
        with self._lock:
            previous = query.get("previous", ["false"])[0] == "true"
            if self.logs_forbidden:
                return 403, _status(403, "Forbidden", 'pods "' + pod + '" is forbidden: cannot '
                                    'get resource "pods/log"')
            if not any(k[:2] == (namespace, pod) for k in self.logs):
                return 404, _status(404, "NotFound", f'pods "{pod}" not found')
            text = self.logs.get((namespace, pod, previous))
            if text is None:
                return 400, _status(400, "BadRequest", 'previous terminated container "trainer" '
                                    f'in pod "{pod}" not found')
        if "tailLines" in query:
            keep = int(query["tailLines"][0])
            lines = text.splitlines(keepends=True)
            text = b"".join(lines[-keep:] if keep else [])
        if "limitBytes" in query:
            text = text[:int(query["limitBytes"][0])]
        return 200, text

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


    def set_nodes(self, nodes: list[dict[str, Any]]) -> None:
        """Replace the cluster's nodes."""
        with self._lock:
            self.nodes = {n["metadata"]["name"]: n for n in nodes}

    def list_nodes(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        """A NodeList page."""
        with self._lock:
            self.requests.append(query)
            if self.forbidden:
                return 403, _status(403, "Forbidden", 'nodes is forbidden: User "system:'
                                    'serviceaccount:monitoring:exporter" cannot list resource '
                                    '"nodes" in API group "" at the cluster scope')
            names = sorted(self.nodes)
            start = int(query["continue"][0]) if query.get("continue") else 0
            limit = int(query.get("limit", ["0"])[0] or 0) or len(names) or 1
            page = names[start:start + limit]
            meta: dict[str, Any] = {"resourceVersion": str(self.resource_version)}
            if start + len(page) < len(names):
                meta["continue"] = str(start + len(page))
            return 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": meta,
                         "items": [json.loads(json.dumps(self.nodes[n])) for n in page]}

    def get_node(self, name: str) -> tuple[int, dict[str, Any]]:
        """One Node, or 404."""
        with self._lock:
            node = self.nodes.get(name)
            if node is None:
                return 404, _status(404, "NotFound", f'nodes "{name}" not found')
            return 200, json.loads(json.dumps(node))

    def patch_node(self, name: str, patch: Any) -> tuple[int, dict[str, Any]]:
        """A merge patch of one Node, with the API server's optimistic concurrency."""
        with self._lock:
            if self.patch_forbidden:
                return 403, _status(403, "Forbidden", f'nodes "{name}" is forbidden: cannot '
                                    'patch resource "nodes" in API group ""')
            node = self.nodes.get(name)
            if node is None:
                return 404, _status(404, "NotFound", f'nodes "{name}" not found')
            if not isinstance(patch, dict):
                return 400, _status(400, "BadRequest", "patch is not an object")
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            current = node["metadata"]["resourceVersion"]
            if self.conflict_next_patches > 0 or (wanted is not None and wanted != current):
                self.conflict_next_patches = max(0, self.conflict_next_patches - 1)
                node["metadata"]["resourceVersion"] = str(int(current) + 1)  # the other writer
                return 409, _status(409, "Conflict", f'Operation cannot be fulfilled on nodes '
                                    f'"{name}": the object has been modified; please apply your '
                                    'changes to the latest version and try again')
            self.patches.append((name, patch))
            updated = merge_patch(node, patch)
            updated["metadata"]["resourceVersion"] = str(int(current) + 1)
            self.nodes[name] = updated
            return 200, json.loads(json.dumps(updated))


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

        def _send(self, code: int, body: dict[str, Any] | bytes) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(body, bytes)
                             else "application/json")
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
            if parts == ["api", "v1", "nodes"]:
                self._send(*server.list_nodes(parse_qs(url.query)))
                return
            if len(parts) == 4 and parts[:3] == ["api", "v1", "nodes"]:
                self._send(*server.get_node(parts[3]))
                return
            if len(parts) == 7 and parts[:3] == ["api", "v1", "namespaces"] \
                    and parts[4] == "pods" and parts[6] == "log":
                self._send(*server.read_log(parts[3], parts[5], parse_qs(url.query)))
                return
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

        def do_PATCH(self) -> None:
            url = urlparse(self.path)
            if self.headers.get("Authorization", "") != f"Bearer {server.token}":
                self._send(401, _status(401, "Unauthorized", "Unauthorized"))
                return
            parts = url.path.strip("/").split("/")
            if len(parts) != 4 or parts[:3] != ["api", "v1", "nodes"]:
                self._send(404, _status(404, "NotFound", "the server could not find the "
                                        "requested resource"))
                return
            if self.headers.get("Content-Type", "").split(";")[0] != \
                    "application/merge-patch+json":
                self._send(415, _status(415, "UnsupportedMediaType", "the body of the request "
                                        "was in an unknown format"))
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                patch = json.loads(self.rfile.read(length) or b"null")
            except ValueError:
                self._send(400, _status(400, "BadRequest", "invalid JSON"))
                return
            self._send(*server.patch_node(parts[3], patch))

    return Handler
