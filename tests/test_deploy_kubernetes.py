"""The Kubernetes manifests as kube-prometheus-stack sees them: built with the real
``kubectl kustomize``, every object checked against its published schema (prometheus-operator's
CRDs and Kubernetes' OpenAPI document, vendored under ``tests/data/kubernetes/`` with provenance
in ``tests/data/README.md``), the ``release`` label the chart selects by, the bridge scraped, the
AlertmanagerConfig reading the bridge's token from its Secret, and the page token from it too."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import textwrap
import tomllib
from functools import cache
from pathlib import Path
from urllib.parse import urlparse

import jsonschema
import pytest
import yaml

from wandb_infra.bridge.config import DEFAULTS as BRIDGE_DEFAULTS
from wandb_infra.bridge.config import load as load_bridge_config
from wandb_infra.common import labels as contract
from wandb_infra.common import nodestate

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "kubernetes"
DATA = ROOT / "tests" / "data" / "kubernetes"
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
RELEASE = "kube-prometheus-stack"
OPERATOR_KINDS = {"PrometheusRule", "ServiceMonitor", "AlertmanagerConfig"}
# Labels Prometheus sets on every target of a ServiceMonitor (what honorLabels arbitrates).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "endpoint", "container"}


class _CrdLoader(yaml.SafeLoader):
    """PyYAML reads a bare ``=`` as YAML 1.1's value tag; the CRDs' matchType enum has one."""


_CrdLoader.add_constructor("tag:yaml.org,2002:value",
                           lambda loader, node: loader.construct_scalar(node))


def kustomize(path: Path) -> list[dict]:
    """The objects ``kubectl kustomize`` builds from ``path``."""
    out = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True,
                         check=False, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@cache
def built() -> tuple[dict, ...]:
    return tuple(kustomize(K8S))


def _find(kind: str, name: str) -> dict:
    return next(o for o in built() if o["kind"] == kind and o["metadata"]["name"] == name)


# --- schemas -----------------------------------------------------------------------------------

def _strict(node: object, *, crd: bool) -> object:
    """The schema as the API server applies it with kubectl's default strict field validation:
    unknown fields are errors (additionalProperties: false wherever properties are listed and
    unknown fields are not preserved); CRD int-or-string and list-type=set translated to JSON
    Schema; Kubernetes' own IntOrString and Quantity accept numbers as the API server does."""
    if isinstance(node, list):
        return [_strict(v, crd=crd) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v, crd=crd) if k not in {"enum", "required", "default"} else v
           for k, v in node.items()}
    if "properties" in out and not isinstance(out["properties"], dict):
        return out
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    if not crd and out.get("format") == "int-or-string":
        return {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    return out


@cache
def core_definitions() -> dict:
    document = json.loads((DATA / "core-v1.36-definitions.json").read_text())
    definitions = _strict(document["definitions"], crd=False)
    definitions["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {
        "anyOf": [{"type": "string"}, {"type": "number"}]}
    return definitions


@cache
def schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> a JSON Schema for the whole object."""
    definitions = core_definitions()
    out: dict[tuple[str, str], dict] = {}
    for name, definition in definitions.items():
        for gvk in definition.get("x-kubernetes-group-version-kind", []):
            api = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
            out[(api, gvk["kind"])] = {"definitions": definitions,
                                       "$ref": f"#/definitions/{name}"}
    meta = {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    for path in sorted(DATA.glob("monitoring.coreos.com_*.yaml")):
        crd = yaml.load(path.read_text(), Loader=_CrdLoader)  # noqa: S506 (a SafeLoader)
        for version in crd["spec"]["versions"]:
            schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]), crd=True)
            schema["properties"]["metadata"] = meta
            schema["definitions"] = definitions
            api = f"{crd['spec']['group']}/{version['name']}"
            out[(api, crd["spec"]["names"]["kind"])] = schema
    return out


def schema_errors(obj: dict) -> list[str]:
    schema = schemas().get((obj["apiVersion"], obj["kind"]))
    assert schema is not None, f"no vendored schema for {obj['apiVersion']} {obj['kind']}"
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(obj)]


# --- kustomize and schemas ---------------------------------------------------------------------

def test_kubectl_kustomize_has_components():
    out = subprocess.run([KUBECTL, "version", "--client", "-o", "json"], capture_output=True,
                         text=True, check=False, timeout=60)
    assert out.returncode == 0, out.stderr
    version = json.loads(out.stdout)["kustomizeVersion"]
    major = int(re.match(r"v(\d+)", version).group(1))
    assert major >= 4, f"kustomize {version} has no components (kubectl >= 1.21 needed)"


def test_kustomize_builds_every_listed_object():
    kinds = sorted({o["kind"] for o in built()})
    assert kinds == ["AlertmanagerConfig", "ClusterRole", "ClusterRoleBinding", "ConfigMap",
                     "Deployment", "PersistentVolumeClaim", "PrometheusRule", "Service",
                     "ServiceAccount", "ServiceMonitor"]
    monitors = {o["metadata"]["name"] for o in built() if o["kind"] == "ServiceMonitor"}
    assert monitors == {"wandb-infra-exporter", "wandb-infra-bridge"}


def test_every_object_matches_its_published_schema():
    failures = {f"{o['kind']}/{o['metadata']['name']}": errors
                for o in built() if (errors := schema_errors(o))}
    assert not failures, json.dumps(failures, indent=1)


@pytest.mark.parametrize(("kind", "name", "mutate", "expected"), [
    ("ServiceMonitor", "wandb-infra-exporter",
     lambda o: o["spec"]["endpoints"][0].update(honourLabels=True), "honourLabels"),
    ("AlertmanagerConfig", "wandb-infra-bridge",
     lambda o: o["spec"]["route"]["matchers"][0].update(matchType="~="), "matchType"),
    ("AlertmanagerConfig", "wandb-infra-bridge",
     lambda o: o["spec"]["receivers"][0]["webhookConfigs"][0].update(maxAlerts=-1), "maxAlerts"),
    ("PrometheusRule", "wandb-infra-rules",
     lambda o: o["spec"]["groups"][0]["rules"][0].update(expr=None), "expr"),
    ("Deployment", "wandb-infra-bridge",
     lambda o: o["spec"]["template"]["spec"]["containers"][0].update(volumeMount=[]),
     "volumeMount"),
    ("Service", "wandb-infra-bridge",
     lambda o: o["spec"]["ports"][0].update(port="http"), "port"),
    ("ConfigMap", "wandb-infra-bridge",
     lambda o: o["metadata"].update(label={}), "label"),
])
def test_the_schema_check_catches_mistakes(kind, name, mutate, expected):
    """A check that cannot fail proves nothing: misspelled fields, bad enums, negative counts and
    wrong types are each reported."""
    obj = copy.deepcopy(_find(kind, name))
    assert not schema_errors(obj)
    mutate(obj)
    errors = schema_errors(obj)
    assert errors and any(expected in e for e in errors), errors


# --- kube-prometheus-stack selection -----------------------------------------------------------

def test_operator_objects_carry_the_release_label_kube_prometheus_stack_selects():
    """The chart's Prometheus selects rules and monitors by `release: <release>` by default."""
    for obj in built():
        if obj["kind"] in OPERATOR_KINDS:
            assert obj["metadata"]["labels"].get("release") == RELEASE, obj["metadata"]["name"]
        else:
            assert "release" not in obj["metadata"].get("labels", {}), obj["metadata"]["name"]


def test_the_release_label_is_overridden_by_the_documented_patch(tmp_path):
    """The overlay docs/deploy-kubernetes.md shows, for a release not named
    kube-prometheus-stack, built with kubectl kustomize."""
    doc = (ROOT / "docs" / "deploy-kubernetes.md").read_text()
    overlay = re.search(r"```yaml\n( *# kustomization\.yaml of your overlay.*?)\n *```", doc,
                        re.S)
    assert overlay, "the overlay example is missing from docs/deploy-kubernetes.md"
    config = yaml.safe_load(textwrap.dedent(overlay.group(1)))
    config["resources"] = [os.path.relpath(K8S, tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(config))
    objects = kustomize(tmp_path)
    released = {(o["kind"], o["metadata"]["name"]): o["metadata"]["labels"]["release"]
                for o in objects if o["kind"] in OPERATOR_KINDS}
    assert len(released) == 4
    assert set(released.values()) == {"prom"}


# --- scraping ----------------------------------------------------------------------------------

def _selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


@pytest.mark.parametrize("name", ["wandb-infra-exporter", "wandb-infra-bridge"])
def test_servicemonitor_selects_its_service_and_a_named_port(name):
    monitor = _find("ServiceMonitor", name)
    services = [o for o in built() if o["kind"] == "Service"
                and o["metadata"]["namespace"] == monitor["metadata"]["namespace"]
                and _selects(monitor["spec"]["selector"], o["metadata"].get("labels", {}))]
    assert [s["metadata"]["name"] for s in services] == [name]
    ports = {p["name"] for p in services[0]["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in ports
        assert endpoint.get("path", "/metrics") == "/metrics"


def test_exporter_servicemonitor_honours_labels_and_nothing_is_overridden():
    """honorLabels keeps wandb_run_pod_info's namespace/pod; it is safe because the
    only target labels the exporter emits are exactly those two."""
    endpoint = _find("ServiceMonitor", "wandb-infra-exporter")["spec"]["endpoints"][0]
    assert endpoint["honorLabels"] is True
    emitted = {*contract.NODE_INFO_LABELS, *contract.GPU_INFO_LABELS, *contract.POD_INFO_LABELS,
               *nodestate.STATE_LABELS, "source", "version", "pythonversion"}
    assert emitted & TARGET_LABELS == {"namespace", "pod"}
    bridge = _find("ServiceMonitor", "wandb-infra-bridge")["spec"]["endpoints"][0]
    assert not bridge.get("honorLabels")


# --- Alertmanager and secrets ------------------------------------------------------------------

def test_alertmanagerconfig_sends_run_alerts_to_the_bridge_with_its_secret_token():
    amc = _find("AlertmanagerConfig", "wandb-infra-bridge")
    route = amc["spec"]["route"]
    example = yaml.safe_load((ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
    plain = next(r for r in example["route"]["routes"] if r["receiver"] == route["receiver"])
    assert [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in route["matchers"]] == \
        plain["matchers"]
    assert route["groupBy"] == plain["group_by"]
    assert route["continue"] is True
    assert [{"source_matchers": [f'{m["name"]}{m["matchType"]}"{m["value"]}"'
                                 for m in rule["sourceMatch"]],
             "target_matchers": [f'{m["name"]}{m.get("matchType", "=")}"{m["value"]}"'
                                 for m in rule["targetMatch"]],
             "equal": rule["equal"]} for rule in amc["spec"]["inhibitRules"]] == \
        example["inhibit_rules"]
    hook = amc["spec"]["receivers"][0]["webhookConfigs"][0]
    assert hook["sendResolved"] is True and hook["maxAlerts"] == 0
    url = urlparse(hook["url"])
    service = _find("Service", "wandb-infra-bridge")
    assert url.hostname == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert url.port == service["spec"]["ports"][0]["port"]
    assert url.path == BRIDGE_DEFAULTS["webhook"]["path"]
    credentials = hook["httpConfig"]["authorization"]["credentials"]
    assert hook["httpConfig"]["authorization"]["type"] == "Bearer"
    # The same Secret and key the bridge mounts and reads its webhook token from.
    deployment = _find("Deployment", "wandb-infra-bridge")["spec"]["template"]["spec"]
    volume = next(v for v in deployment["volumes"] if "secret" in v)
    assert credentials["name"] == volume["secret"]["secretName"]
    assert amc["metadata"]["namespace"] == deployment.get("namespace", "monitoring")
    mount = next(m for m in deployment["containers"][0]["volumeMounts"]
                 if m["name"] == volume["name"])["mountPath"]
    config = yaml.safe_load(_find("ConfigMap", "wandb-infra-bridge")["data"]["bridge.yaml"])
    assert config["auth"]["bearer_token_file"] == f"{mount}/{credentials['key']}"


def test_bridge_reads_every_secret_from_the_mounted_secret_keys_the_comment_creates(tmp_path):
    """The bridge's config names files under the Secret's mount; the `kubectl create secret`
    command in bridge.yaml creates exactly those keys, and the bridge loads with them, the page
    token included."""
    text = (K8S / "bridge.yaml").read_text()
    created = set(re.findall(r"--from-(?:file|literal)=([a-z-]+)=", text))
    deployment = _find("Deployment", "wandb-infra-bridge")["spec"]["template"]["spec"]
    volume = next(v for v in deployment["volumes"] if "secret" in v)
    mount = next(m for m in deployment["containers"][0]["volumeMounts"]
                 if m["name"] == volume["name"])["mountPath"]
    raw = _find("ConfigMap", "wandb-infra-bridge")["data"]["bridge.yaml"]
    config = yaml.safe_load(raw)
    files = [config["auth"]["bearer_token_file"], config["auth"]["pages_token_file"],
             config["wandb"]["api_key_file"]]
    assert {f.removeprefix(mount + "/") for f in files} == created
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    values = {"bearer-token": "b" * 64, "pages-token": "p" * 48,
              "wandb-api-key": "local-" + "k" * 40}
    for key, value in values.items():
        (secrets / key).write_text(value + "\n")
    local = tmp_path / "bridge.yaml"
    local.write_text(raw.replace(mount, str(secrets)))
    cfg = load_bridge_config(str(local), environ={})
    assert cfg.secrets.pages_token == values["pages-token"]
    assert cfg.secrets.bearer_token == values["bearer-token"]
    assert cfg.port == deployment["containers"][0]["ports"][0]["containerPort"]


# --- the quarantine component -------------------------------------------------------------------

def test_quarantine_component_gives_only_its_container_the_node_rights(tmp_path):
    """Opted in from an overlay: every object passes its schema; the pod mounts no token for
    the bridge container; the quarantine container alone mounts the token of the account whose
    ClusterRole may get, list and patch nodes (nothing more), and runs the quarantine command."""
    overlay = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
               "resources": [os.path.relpath(K8S, tmp_path)],
               "components": [os.path.relpath(K8S / "components" / "quarantine", tmp_path)]}
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    objects = kustomize(tmp_path)
    for obj in objects:
        assert schema_errors(obj) == [], (obj["kind"], obj["metadata"]["name"])
    by = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    pod = by[("Deployment", "wandb-infra-bridge")]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    containers = {c["name"]: c for c in pod["containers"]}
    assert containers["bridge"]["args"][0] == "serve"
    assert containers["quarantine"]["args"][:1] == ["quarantine"]

    def token_mounted(container: dict) -> bool:
        return any(m["name"] == "quarantine-token" for m in container.get("volumeMounts", []))

    assert token_mounted(containers["quarantine"]) and not token_mounted(containers["bridge"])
    role = by[("ClusterRole", "wandb-infra-quarantine")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"],
                              "verbs": ["get", "list", "patch"]}]
    secret = by[("Secret", "wandb-infra-quarantine-token")]
    assert secret["type"] == "kubernetes.io/service-account-token"
    env = {e["name"]: e["value"] for e in containers["quarantine"]["env"]}
    assert env["WANDB_INFRA_BRIDGE__QUARANTINE__KUBERNETES__TOKEN_FILE"].startswith(
        "/var/run/secrets/quarantine/")
    # without the component nothing may patch anything
    assert not [r for o in built() if o["kind"] in ("ClusterRole", "Role")
                for r in o["rules"] if set(r["verbs"]) - {"get", "list", "watch"}]


# --- the site overlay: images and GPU telemetry ------------------------------------------------

SITE = ROOT / "deploy" / "kubernetes-site"
GUIDE = ROOT / "docs" / "deploy-kubernetes.md"
# The Service the GPU Operator creates for dcgm-exporter (NVIDIA/gpu-operator,
# assets/state-dcgm-exporter/0600_service.yaml), in the namespace NVIDIA's install guide uses.
GPU_OPERATOR_SERVICE = {"namespace": "gpu-operator", "labels": {"app": "nvidia-dcgm-exporter"},
                        "ports": {"gpu-metrics"}}


@cache
def site() -> tuple[dict, ...]:
    return tuple(kustomize(SITE))


def _images(objects: tuple[dict, ...]) -> set[str]:
    return {c["image"] for o in objects if o["kind"] == "Deployment"
            for c in o["spec"]["template"]["spec"]["containers"]}


def test_the_site_overlay_names_the_images_the_guide_builds_and_pushes():
    doc = GUIDE.read_text()
    shell = {k: re.search(rf"^{k}=(\S+)", doc, re.M) for k in ("REGISTRY", "TAG")}
    assert all(shell.values()), "REGISTRY= and TAG= are missing from the guide"
    values = {k: m.group(1) for k, m in shell.items() if m}
    def expand(text: str) -> str:
        return text.replace("$REGISTRY", values["REGISTRY"]).replace("$TAG", values["TAG"])
    built_images = {expand(tag): dockerfile for dockerfile, tag in re.findall(
        r"^docker build -f (deploy/docker/Dockerfile\.\w+) -t (\S+) \.$", doc, re.M)}
    pushed = {expand(tag) for tag in re.findall(r"^docker push (\S+)$", doc, re.M)}
    assert len(built_images) == 2 and pushed == set(built_images)
    assert all((ROOT / dockerfile).exists() for dockerfile in built_images.values())
    assert _images(site()) == set(built_images)
    assert values["TAG"] == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "version"]


def test_the_base_names_no_registry_so_an_unset_image_cannot_be_pulled_by_mistake():
    assert _images(built()) == {"wandb-infra-bridge:0.1.0", "wandb-infra-exporter:0.1.0"}


def test_every_site_object_matches_its_published_schema():
    failures = {f"{o['kind']}/{o['metadata']['name']}": errors
                for o in site() if (errors := schema_errors(o))}
    assert not failures, json.dumps(failures, indent=1)


def test_the_site_overlay_scrapes_the_gpu_operators_dcgm_exporter():
    """Enabled (in the site overlay, not in the base), selected by kube-prometheus-stack's
    Prometheus, selecting the operator's Service and port, the GPU's pod labels kept."""
    (monitor,) = [o for o in site() if o["kind"] == "ServiceMonitor"
                  and o["metadata"]["name"] == "nvidia-dcgm-exporter"]
    assert not [o for o in built() if o["metadata"]["name"] == "nvidia-dcgm-exporter"]
    assert monitor["metadata"]["labels"]["release"] == RELEASE
    spec = monitor["spec"]
    assert GPU_OPERATOR_SERVICE["namespace"] in spec["namespaceSelector"]["matchNames"]
    assert _selects(spec["selector"], GPU_OPERATOR_SERVICE["labels"])
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] in GPU_OPERATOR_SERVICE["ports"]
    assert endpoint["honorLabels"] is True
    assert endpoint["interval"] == "30s"


def test_job_logs_component_gives_the_bridge_container_only_pod_log_reads(tmp_path):
    """Opted in from an overlay: every object passes its schema; the bridge container alone
    mounts the token of an account that may only `get pods/log`, and its configuration (from
    the component's environment) enables the Kubernetes log source with that token."""
    overlay = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
               "resources": [os.path.relpath(K8S, tmp_path)],
               "components": [os.path.relpath(K8S / "components" / "job-logs", tmp_path)]}
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    objects = kustomize(tmp_path)
    for obj in objects:
        assert schema_errors(obj) == [], (obj["kind"], obj["metadata"]["name"])
    by = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    pod = by[("Deployment", "wandb-infra-bridge")]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (bridge,) = pod["containers"]
    assert {"name": "job-logs-token", "mountPath": "/var/run/secrets/job-logs",
            "readOnly": True} in bridge["volumeMounts"]
    assert by[("ClusterRole", "wandb-infra-job-logs")]["rules"] == [
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}]
    env = {e["name"]: e["value"] for e in bridge["env"] if "value" in e}
    token = tmp_path / "token"
    token.write_text("t" * 40)
    env = {k: str(token) if k.endswith(("TOKEN_FILE", "CA_FILE")) else v
           for k, v in env.items()}
    joblog = load_bridge_config(None, environ=env, insecure_no_auth=True).raw["joblog"]
    assert joblog["kubernetes"]["enabled"] is True
    assert joblog["kubernetes"]["api_server"] == "https://kubernetes.default.svc"
