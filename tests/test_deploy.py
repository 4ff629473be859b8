"""The deploy folder: example configs validate with the real tools, manifests and Dockerfiles point
at files and entry points that exist, and every address agrees with the components' defaults."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from harness.processes import AMTOOL, PROMTOOL
from wandb_infra.bridge.config import DEFAULTS as BRIDGE_DEFAULTS
from wandb_infra.bridge.config import load as load_bridge_config
from wandb_infra.exporter.config import DEFAULTS as EXPORTER_DEFAULTS
from wandb_infra.exporter.config import parse_listen

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
BIN = Path(sys.executable).parent


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.integration
def test_prometheus_example_passes_promtool():
    out = subprocess.run([PROMTOOL, "check", "config", str(DEPLOY / "prometheus" /
                                                          "prometheus.yml")],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.integration
def test_alertmanager_example_passes_amtool_and_routes_runs_to_the_bridge():
    path = DEPLOY / "alertmanager" / "alertmanager.yml"
    out = subprocess.run([AMTOOL, "check-config", str(path)], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    config = yaml.safe_load(path.read_text())
    route = next(r for r in config["route"]["routes"] if r["receiver"] == "wandb.bridge")
    assert route["matchers"] == ['wandb_run_id=~".+"']
    hook = next(r for r in config["receivers"] if r["name"] == "wandb.bridge")["webhook_configs"][0]
    url = urlparse(hook["url"])
    assert url.path == BRIDGE_DEFAULTS["webhook"]["path"]
    assert url.port == BRIDGE_DEFAULTS["listen"]["port"]
    assert hook["http_config"]["authorization"]["type"] == "Bearer"
    assert hook["send_resolved"] is True


def test_prometheus_example_scrapes_the_exporter_on_its_default_port():
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "wandb-infra-exporter")
    target = job["static_configs"][0]["targets"][0]
    assert int(target.rsplit(":", 1)[1]) == parse_listen(EXPORTER_DEFAULTS["listen"])[1]
    assert not job.get("honor_labels"), "the exporter never emits job/instance"


@pytest.mark.integration
@pytest.mark.parametrize("dockerfile", sorted((DEPLOY / "docker").glob("Dockerfile.*")),
                         ids=lambda p: p.name)
def test_dockerfile_copies_existing_files_and_runs_a_real_entry_point(dockerfile):
    text = dockerfile.read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert len(stages) == 2, f"{dockerfile.name}: a build stage and the image"
    build, image = ([line for line in stage.splitlines() if line.startswith("COPY ")]
                    for stage in stages)
    for line in build + image:
        if "--from=" not in line:  # a file of the checkout, not of the build stage
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"{dockerfile.name}: {line}: missing file"
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"].values()
    assert set(package_dirs) <= {line.split()[1] for line in build}, \
        f"{dockerfile.name}: building the wheel needs every package folder"
    # The image holds the built wheel's install and its config, never the source tree.
    config = f"deploy/{dockerfile.suffix.lstrip('.')}.example.yaml"
    assert [line.split()[1] for line in image] == ["--from=build", config], image
    entry = re.search(r'ENTRYPOINT \["([^"]+)"\]', text).group(1)
    assert entry in SCRIPTS, f"{entry} is not a console script in pyproject.toml"
    cmd = yaml.safe_load(re.search(r"CMD (\[.*\])", text).group(1))
    out = subprocess.run([str(BIN / entry), *cmd[:-2], "--help"], capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert cmd[-2] == "--config"
    config_copy = re.search(r"COPY (\S+) " + re.escape(cmd[-1]), text)
    assert config_copy, f"{dockerfile.name}: nothing is copied to {cmd[-1]}"


@pytest.mark.integration
def test_exporter_example_config_is_valid(tmp_path):
    """Valid once its token file exists (the example reads it from a mounted secret)."""
    token = tmp_path / "token"
    token.write_text("t" * 32 + "\n")
    out = subprocess.run([str(BIN / "wandb-infra-exporter"), "--config",
                          str(DEPLOY / "exporter.example.yaml"), "--check-config"],
                         capture_output=True, text=True, check=False,
                         env={**os.environ, "WANDB_INFRA_EXPORTER__AUTH__TOKEN_FILE": str(token)})
    assert out.returncode == 0, out.stderr


def _secret_files(tmp_path: Path) -> dict[str, str]:
    token, key, pages = tmp_path / "token", tmp_path / "key", tmp_path / "pages"
    token.write_text("t" * 32 + "\n")
    key.write_text("local-" + "k" * 40 + "\n")
    pages.write_text("p" * 32 + "\n")
    return {"WANDB_INFRA_BRIDGE__AUTH__BEARER_TOKEN_FILE": str(token),
            "WANDB_INFRA_BRIDGE__AUTH__PAGES_TOKEN_FILE": str(pages),
            "WANDB_INFRA_BRIDGE__WANDB__API_KEY_FILE": str(key)}


def test_bridge_example_config_loads(tmp_path):
    cfg = load_bridge_config(str(DEPLOY / "bridge.example.yaml"), environ=_secret_files(tmp_path))
    assert cfg.port == BRIDGE_DEFAULTS["listen"]["port"]


def test_kubernetes_manifests_are_consistent(tmp_path):
    kustomization = yaml.safe_load((DEPLOY / "kubernetes" / "kustomization.yaml").read_text())
    objects = []
    for resource in kustomization["resources"]:
        path = DEPLOY / "kubernetes" / resource
        assert path.exists(), resource
        objects += _docs(path)
    for obj in objects:
        assert obj.get("apiVersion") and obj.get("kind") and obj["metadata"].get("name"), obj
    by_kind = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    bridge_cm = yaml.safe_load(by_kind[("ConfigMap", "wandb-infra-bridge")]["data"]["bridge.yaml"])
    config_file = tmp_path / "bridge.yaml"
    config_file.write_text(yaml.safe_dump(bridge_cm))
    cfg = load_bridge_config(str(config_file), environ=_secret_files(tmp_path))
    deployment = by_kind[("Deployment", "wandb-infra-bridge")]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == "serve"
    assert container["ports"][0]["containerPort"] == cfg.port
    assert deployment["spec"]["strategy"]["type"] == "Recreate", "one writer per SQLite store"
    exporter_cm = yaml.safe_load(
        by_kind[("ConfigMap", "wandb-infra-exporter")]["data"]["exporter.yaml"])
    exporter = by_kind[("Deployment", "wandb-infra-exporter")]["spec"]["template"]["spec"]
    assert exporter["containers"][0]["ports"][0]["containerPort"] == parse_listen(
        exporter_cm["listen"])[1]
    assert exporter["serviceAccountName"] in {n for k, n in by_kind if k == "ServiceAccount"}
    assert ("PrometheusRule", "wandb-infra-rules") in by_kind
    dashboards = by_kind[("ConfigMap", "wandb-infra-dashboards")]["data"]
    assert set(dashboards) == {p.name for p in (ROOT / "dashboards").glob("*.json")}
