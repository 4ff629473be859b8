"""The Kubernetes source against harness/k8s_standin.py (a cluster cannot run here)."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
import yaml

from harness.exporter_process import metric_samples, running_exporter
from harness.k8s_standin import K8sStandin, make_pod
from harness.processes import wait_for
from wandb_infra.common import labels
from wandb_infra.common.commands import SourceError
from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.runkey import RunKey
from wandb_infra.exporter.sources.kubernetes import KubernetesSource


@pytest.fixture
def k8s():
    with K8sStandin() as server:
        server.set_pods([
            make_pod("launch-0", "node-a", "ml", env={
                "WANDB_RUN_ID": "abc123", "WANDB_PROJECT": "llm", "WANDB_ENTITY": "team",
                "WANDB_RUN_GROUP": "g1"}),
            make_pod("labelled-0", "node-b", "ml", labels={"wandb.ai/run-id": "lab1"},
                     annotations={"wandb.ai/entity": "team", "wandb.ai/project": "vision"}),
            make_pod("labelled-1", "node-c.example.com", "ml",
                     labels={"wandb.ai/run-id": "lab1", "wandb.ai/entity": "team",
                             "wandb.ai/project": "vision"}),
            make_pod("annotated", "node-d", "research",
                     annotations={"wandb.ai/run-id": "ann1"}),
            make_pod("pending", None, "ml", labels={"wandb.ai/run-id": "p1"}, phase="Pending"),
            make_pod("no-run", "node-a", "ml"),
            make_pod("bad-id", "node-a", "ml", labels={"wandb.ai/run-id": "has space"}),
        ])
        yield server


def src(server, **extra):
    return KubernetesSource({"api_server": server.url, "token": server.token, "page_size": 2,
                             "default_entity": "team", "default_project": "misc", **extra})


def test_pods_with_run_ids_map_to_nodes(k8s):
    result = src(k8s).poll()
    got = {(p.run.path(), p.host, dict(p.extra).get("pod")) for p in result.placements}
    assert got == {("team/llm/abc123", "node-a", "launch-0"),
                   ("team/vision/lab1", "node-b", "labelled-0"),
                   ("team/vision/lab1", "node-c.example.com", "labelled-1"),
                   ("team/misc/ann1", "node-d", "annotated")}
    launch = next(p for p in result.placements if p.run == RunKey("team", "llm", "abc123"))
    assert dict(launch.extra) == {"namespace": "ml", "pod": "launch-0", "wandb_run_group": "g1"}
    assert len(k8s.requests) == 3  # 5 running pods, pages of 2
    assert all(q["fieldSelector"] == ["status.phase=Running"] for q in k8s.requests)


def test_namespace_and_label_selector(k8s):
    result = src(k8s, namespace="research").poll()
    assert [p.run.run_id for p in result.placements] == ["ann1"]
    result = src(k8s, label_selector="wandb.ai/run-id").poll()
    assert {p.run.run_id for p in result.placements} == {"lab1"}


def test_expired_continue_restarts_once(k8s):
    k8s.expire_continue_tokens = 1
    result = src(k8s).poll()
    assert len(result.placements) == 4
    k8s.expire_continue_tokens = 5
    with pytest.raises(SourceError, match="410"):
        src(k8s).poll()


def test_auth_errors_are_clear(k8s):
    with pytest.raises(SourceError, match="401 unauthorized"):
        KubernetesSource({"api_server": k8s.url, "token": "wrong"}).poll()
    k8s.forbidden = True
    with pytest.raises(SourceError, match=r"403 forbidden.*list.*pods"):
        src(k8s).poll()


def _kubeconfig(path, server: str, user: dict) -> str:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u"}}]}))
    return str(path)


@pytest.mark.parametrize(("user", "named"), [
    ({"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws",
               "args": ["eks", "get-token"]}}, "an exec plugin (aws)"),
    ({"auth-provider": {"name": "oidc"}}, "an auth provider"),
    ({}, "no credentials"),
])
def test_kubeconfig_users_we_cannot_authenticate_fail_in_one_line(tmp_path, user, named):
    with pytest.raises(ConfigError) as err:
        KubernetesSource({"kubeconfig": _kubeconfig(tmp_path / "config", "https://k", user)})
    message = str(err.value)
    assert named in message and "in_cluster" in message and "\n" not in message


def test_kubeconfig_client_certificate_data_is_used(tmp_path):
    user = {"client-certificate-data": base64.b64encode(b"CERT").decode(),
            "client-key-data": base64.b64encode(b"KEY").decode()}
    source = KubernetesSource({"kubeconfig": _kubeconfig(tmp_path / "config", "https://k",
                                                         user)})
    cert, key = source.api.session.cert
    assert Path(cert).read_bytes() == b"CERT" and Path(key).read_bytes() == b"KEY"
    assert oct(os.stat(key).st_mode & 0o777) == "0o600"


def test_kubeconfig_and_token_file(k8s, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(k8s.token + "\n")
    assert len(src(k8s, token=None, token_file=str(token_file)).poll().placements) == 4
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "c", "cluster": {
            "server": k8s.url,
            "certificate-authority-data": base64.b64encode(b"unused").decode()}}],
        "users": [{"name": "u", "user": {"token": k8s.token}}],
        "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u"}}]}))
    source = KubernetesSource({"kubeconfig": str(kubeconfig), "default_entity": "team",
                               "default_project": "misc"})
    assert len(source.poll().placements) == 4
    kubeconfig.write_text("current-context: nope\n")
    with pytest.raises(ConfigError, match="current context"):
        KubernetesSource({"kubeconfig": str(kubeconfig)})
    with pytest.raises(ConfigError):
        KubernetesSource({})


def test_garbage_answers_do_not_crash(k8s):
    k8s.set_pods([make_pod("ok", "node-z", "ml", labels={"wandb.ai/run-id": "fine"})])
    k8s.garbage_items = [{"metadata": "nonsense", "spec": [], "status": {}}, 42,
                         {"metadata": {"labels": {"wandb.ai/run-id": ["x"]}},
                          "spec": {"nodeName": "n"}, "status": {"phase": "Running"}}]
    result = src(k8s).poll()
    assert [p.run.run_id for p in result.placements] == ["fine"]
    assert len(result.problems) == 1


@pytest.mark.integration
def test_exporter_process_with_kubernetes(k8s, tmp_path):
    config = {"sources": {"kubernetes": {
        "enabled": True, "api_server": k8s.url, "token": "env:K8S_TOKEN",
        "default_entity": "team", "default_project": "misc", "interval_seconds": 0.3}}}
    with running_exporter(config, tmp_path / "exporter", env={"K8S_TOKEN": k8s.token}) as url:
        wait_for(lambda: len(metric_samples(url, labels.NODE_INFO)) >= 4, 20,
                 "four node-info series")
        nodes = {(s["wandb_run_id"], s["hostname"], s["source"])
                 for s in metric_samples(url, labels.NODE_INFO)}
        assert nodes == {("abc123", "node-a", "kubernetes"), ("lab1", "node-b", "kubernetes"),
                         ("lab1", "node-c", "kubernetes"), ("ann1", "node-d", "kubernetes")}
        assert metric_samples(url, labels.GPU_INFO) == []
        pods = {(s["wandb_run_id"], s["hostname"], s["namespace"], s["pod"])
                for s in metric_samples(url, labels.POD_INFO)}
        assert pods == {("abc123", "node-a", "ml", "launch-0"),
                        ("lab1", "node-b", "ml", "labelled-0"),
                        ("lab1", "node-c", "ml", "labelled-1"),
                        ("ann1", "node-d", "research", "annotated")}
    assert k8s.token not in (tmp_path / "exporter" / "exporter.log").read_text()


@pytest.mark.integration
def test_every_pod_of_a_run_on_a_node_is_published(k8s, tmp_path):
    """Node info names one pod per (run, host); the pod info metric has each of them, so the
    rules can tell which of a run's pods holds a GPU (and a replaced pod is not lost)."""
    k8s.set_pods([make_pod(f"rank-{i}", "node-a", "ml", labels={"wandb.ai/run-id": "r8"})
                  for i in range(3)])
    config = {"sources": {"kubernetes": {
        "enabled": True, "api_server": k8s.url, "token": "env:K8S_TOKEN",
        "default_entity": "team", "default_project": "misc", "interval_seconds": 0.3}}}
    with running_exporter(config, tmp_path / "exporter", env={"K8S_TOKEN": k8s.token}) as url:
        wait_for(lambda: len(metric_samples(url, labels.POD_INFO)) >= 3, 20,
                 "three pod-info series")
        assert sorted(s["pod"] for s in metric_samples(url, labels.POD_INFO)) == [
            "rank-0", "rank-1", "rank-2"]
        assert len(metric_samples(url, labels.NODE_INFO)) == 1


def test_in_cluster_service_account(k8s, tmp_path, monkeypatch):
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(k8s.token)
    (sa / "ca.crt").write_text("unused")
    monkeypatch.setattr("wandb_infra.common.kubeapi.SA_DIR", sa)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST"):
        KubernetesSource({"in_cluster": True})
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    source = KubernetesSource({"in_cluster": True})
    assert source.api.server == "https://10.0.0.1:6443"
    assert source.api.session.verify == str(sa / "ca.crt")
    (sa / "token").write_text("rotated-token")
    assert source.api.headers()["Authorization"] == "Bearer rotated-token"
