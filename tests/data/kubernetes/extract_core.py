"""Extract ``core-v1.36-definitions.json`` from Kubernetes' published OpenAPI v2 document.

Keeps the definitions reachable from the kinds the deploy manifests may use, without their
``description`` texts (the upstream document is 4 MB, mostly prose); nothing else is changed.
Usage (provenance in ``tests/data/README.md``):

    cd tests/data/kubernetes && python extract_core.py swagger.json core-v1.36-definitions.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KINDS = [
    "io.k8s.api.core.v1.ConfigMap", "io.k8s.api.core.v1.Secret", "io.k8s.api.core.v1.Service",
    "io.k8s.api.core.v1.ServiceAccount", "io.k8s.api.core.v1.PersistentVolumeClaim",
    "io.k8s.api.core.v1.Namespace", "io.k8s.api.apps.v1.Deployment",
    "io.k8s.api.apps.v1.DaemonSet", "io.k8s.api.apps.v1.StatefulSet",
    "io.k8s.api.rbac.v1.ClusterRole", "io.k8s.api.rbac.v1.ClusterRoleBinding",
    "io.k8s.api.rbac.v1.Role", "io.k8s.api.rbac.v1.RoleBinding",
    "io.k8s.api.networking.v1.NetworkPolicy",
    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
]
PREFIX = "#/definitions/"


def _strip(node: object) -> object:
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def _refs(node: object) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"].removeprefix(PREFIX)} if isinstance(node.get("$ref"), str) else set()
        for value in node.values():
            found |= _refs(value)
        return found
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node)) if node else set()
    return set()


def extract(document: dict) -> dict:
    """The definitions reachable from KINDS, descriptions removed."""
    definitions = document["definitions"]
    keep: dict[str, object] = {}
    todo = list(KINDS)
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep[name] = _strip(definitions[name])
        todo += sorted(_refs(keep[name]) - keep.keys())
    return {"info": document["info"], "definitions": dict(sorted(keep.items()))}


def main(argv: list[str]) -> int:
    """Read the upstream document, write the subset."""
    source, target = argv
    subset = extract(json.loads(Path(source).read_text(encoding="utf-8")))
    Path(target).write_text(json.dumps(subset, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
