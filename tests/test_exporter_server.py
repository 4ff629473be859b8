"""The real exporter process: registration API, auth, fuzzing, files, CLI, Prometheus scraping."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.exporter_process import EXPORTER, metric_samples, metric_value, running_exporter
from harness.processes import prom_query, prometheus, wait_for
from tests.budget import examples
from tests.inprocess import run_main
from wandb_infra.common import labels
from wandb_infra.exporter import cli

pytestmark = pytest.mark.integration

REG = {"entity": "ent", "project": "proj", "run_id": "run1", "hostname": "gpu01.example.com",
       "gpus": [0, {"index": 1, "uuid": "GPU-1111"}], "slurm_job_id": "42"}


@pytest.fixture(scope="module")
def exporter(tmp_path_factory):
    token_file = tmp_path_factory.mktemp("secret") / "token"
    token_file.write_text("s3cret-token-value\n")
    files = tmp_path_factory.mktemp("regfiles")
    config = {"auth": {"token_file": str(token_file)},
              "sources": {"files": {"enabled": True, "directory": str(files),
                                    "interval_seconds": 0.2}}}
    with running_exporter(config, tmp_path_factory.mktemp("exporter")) as url:
        yield url, files


AUTH = {"Authorization": "Bearer s3cret-token-value"}
JSON = {**AUTH, "Content-Type": "application/json"}  # raw bodies: the API takes JSON only
FIXTURE_HEALTH = HealthCheck.function_scoped_fixture


def test_register_heartbeat_delete(exporter):
    url, _ = exporter
    resp = requests.post(url + "/v1/runs", json=REG, headers=AUTH, timeout=5)
    assert resp.status_code == 201, resp.text
    assert requests.post(url + "/v1/runs", json=REG, headers=AUTH, timeout=5).status_code == 200
    nodes = [s for s in metric_samples(url, labels.NODE_INFO) if s["wandb_run_id"] == "run1"]
    assert nodes == [{"wandb_entity": "ent", "wandb_project": "proj", "wandb_run_id": "run1",
                      "hostname": "gpu01", "source": "registrations", "slurm_job_id": "42"}]
    gpus = sorted((s["gpu"], s.get("gpu_uuid", "")) for s in metric_samples(url, labels.GPU_INFO)
                  if s["wandb_run_id"] == "run1")
    assert gpus == [("0", ""), ("1", "GPU-1111")]
    resp = requests.delete(url + "/v1/runs/ent/proj/run1?hostname=GPU01.example.com", headers=AUTH,
                           timeout=5)
    assert resp.json() == {"deleted": 1}
    assert not [s for s in metric_samples(url, labels.NODE_INFO) if s["wandb_run_id"] == "run1"]


def test_ttl_expires_without_heartbeat(exporter):
    url, _ = exporter
    body = {**REG, "run_id": "short", "ttl_seconds": 1}
    assert requests.post(url + "/v1/runs", json=body, headers=AUTH, timeout=5).status_code == 201
    assert [s for s in metric_samples(url, labels.NODE_INFO) if s["wandb_run_id"] == "short"]
    wait_for(lambda: not [s for s in metric_samples(url, labels.NODE_INFO)
                            if s["wandb_run_id"] == "short"], timeout=10)


def test_auth_required(exporter):
    url, _ = exporter
    assert requests.post(url + "/v1/runs", json=REG, timeout=5).status_code == 401
    bad = {"Authorization": "Bearer wrong"}
    assert requests.post(url + "/v1/runs", json=REG, headers=bad, timeout=5).status_code == 401
    assert requests.delete(url + "/v1/runs/ent/proj/run1", timeout=5).status_code == 401
    assert requests.get(url + "/metrics", timeout=5).status_code == 200


@pytest.mark.parametrize(("body", "reason"), [
    (b"{not json", "not valid JSON"),
    (b"[1,2]", "JSON object"),
    (json.dumps({**REG, "gpus": ["zero"]}).encode(), "GPU index"),
    (json.dumps({**REG, "extra": 1}).encode(), "unknown fields: extra"),
    (json.dumps({k: v for k, v in REG.items() if k != "run_id"}).encode(), "'run_id' is required"),
])
def test_bad_payloads_get_clear_400(exporter, body, reason):
    url, _ = exporter
    errors = metric_value(url, "wandb_infra_exporter_source_errors_total", source="registrations")
    resp = requests.post(url + "/v1/runs", data=body, headers=JSON, timeout=5)
    assert resp.status_code == 400
    assert reason in resp.json()["error"]
    assert metric_value(url, "wandb_infra_exporter_source_errors_total",
                        source="registrations") == errors + 1


def test_healthz_reports_sources(exporter):
    url, _ = exporter
    health = requests.get(url + "/healthz", timeout=5).json()
    assert health["status"] == "ok"
    assert set(health["sources"]) == {"registrations", "files"}
    assert health["sources"]["registrations"]["up"] is True


def test_oversized_body_rejected(exporter):
    url, _ = exporter
    resp = requests.post(url + "/v1/runs", data=b"x" * 200_000, headers=JSON, timeout=5)
    assert resp.status_code == 413


def test_bad_delete_path(exporter):
    url, _ = exporter
    resp = requests.delete(url + "/v1/runs/ent/proj/bad%20id", headers=AUTH, timeout=5)
    assert resp.status_code == 400
    resp = requests.delete(url + "/v1/runs/ent/proj/r?hostname=a%20b", headers=AUTH, timeout=5)
    assert resp.status_code == 400


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                 max_size=5),
    max_leaves=20)
field_values = st.one_of(json_values, st.sampled_from(["e", "GPU-x", "0", "", "a/b", "x" * 300]))
payloads = st.fixed_dictionaries({}, optional={k: field_values for k in (
    "entity", "project", "run_id", "hostname", "gpus", "ttl_seconds", "run_name", "pod")}) | \
    json_values


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[FIXTURE_HEALTH])
@given(payload=payloads)
def test_fuzz_registration_never_breaks_the_exporter(exporter, payload):
    url, _ = exporter
    before = metric_samples(url, labels.NODE_INFO)
    resp = requests.post(url + "/v1/runs", data=json.dumps(payload), headers=JSON, timeout=5)
    assert resp.status_code in (200, 201, 400), resp.text
    if resp.status_code == 400:
        assert resp.json()["error"]
        assert metric_samples(url, labels.NODE_INFO) == before
    else:
        requests.delete(f"{url}/v1/runs/{payload['entity']}/{payload['project']}/"
                        f"{payload['run_id']}", headers=AUTH, timeout=5)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[FIXTURE_HEALTH])
@given(raw=st.binary(max_size=300))
def test_fuzz_raw_bytes(exporter, raw):
    url, _ = exporter
    resp = requests.post(url + "/v1/runs", data=raw, headers=JSON, timeout=5)
    assert resp.status_code in (200, 201, 400)


def test_registration_files(exporter):
    url, files = exporter
    (files / "job7.json").write_text(json.dumps([{**REG, "run_id": "filerun", "gpus": [3]}]))
    (files / "broken.json").write_text("{oops")
    (files / "ignored.tmp").write_text("{oops")
    got = wait_for(lambda: [s for s in metric_samples(url, labels.GPU_INFO)
                              if s["wandb_run_id"] == "filerun"])
    assert [(s["gpu"], s["source"]) for s in got] == [("3", "files")]
    errors = wait_for(lambda: [s for s in metric_samples(
        url, "wandb_infra_exporter_source_errors_total") if s["source"] == "files"])
    assert errors
    (files / "job7.json").unlink()
    wait_for(lambda: not [s for s in metric_samples(url, labels.GPU_INFO)
                            if s["wandb_run_id"] == "filerun"])


def test_prometheus_scrapes_the_join_metrics(exporter, tmp_path):
    url, _ = exporter
    body = {**REG, "run_id": "promrun", "hostname": "gpu07"}
    assert requests.post(url + "/v1/runs", json=body, headers=AUTH, timeout=5).status_code == 201
    target = url.removeprefix("http://")
    config = (f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: exporter\n"
              f"    static_configs:\n      - targets: ['{target}']\n")
    with prometheus(config, tmp_path / "prom") as prom:
        result = wait_for(lambda: prom_query(
            prom.url, 'wandb_run_gpu_info{wandb_run_id="promrun"}'), timeout=30)
        assert {(r["metric"]["hostname"], r["metric"]["gpu"]) for r in result} == \
            {("gpu07", "0"), ("gpu07", "1")}
        joined = prom_query(prom.url, 'max by (hostname, wandb_run_id) (wandb_run_node_info'
                                      '{wandb_run_id="promrun"})')
        assert [r["metric"] for r in joined] == [{"hostname": "gpu07", "wandb_run_id": "promrun"}]
        up = prom_query(prom.url, 'wandb_infra_exporter_source_up{source="registrations"}')
        assert up and up[0]["value"][1] == "1"


def test_cli_help_and_config_errors(tmp_path):
    out = run_main(cli.main, ["--help"]).stdout
    for key in ("listen", "grace_seconds", "auth.token", "hostnames.rewrites", "sources.slurm",
                "sources.wandb", "sources.kubernetes", "sources.files", "WANDB_INFRA_EXPORTER"):
        assert key in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: nowhere\n")
    proc = run_main(cli.main, ["--config", str(bad)])
    assert proc.returncode == 2 and "listen: must be host:port" in proc.stderr
    bad.write_text("sources:\n  slurm:\n    enabled: true\n    mode: sacct\n")
    proc = run_main(cli.main, ["--config", str(bad)])
    assert proc.returncode == 2 and "mode" in proc.stderr
    bad.write_text("colour: red\n")
    proc = run_main(cli.main, ["--config", str(bad)])
    assert proc.returncode == 2 and "colour: unknown key (known: listen, " in proc.stderr
    for text, reason in (
            ("sources:\n  files:\n    enabled: true\n    directory: /tmp\n"
             "    interval_seconds: soon\n", "interval_seconds: must be a number > 0, not 'soon'"),
            ("registrations:\n  default_ttl_seconds: 100\n  max_ttl_seconds: 10\n",
             "default_ttl_seconds"),
            ("sources:\n  files:\n    enabled: true\n    directory: /tmp\n"
             "    interval_seconds: 0\n",
             "sources.files.interval_seconds: must be a number > 0, not 0")):
        bad.write_text(text)
        proc = run_main(cli.main, ["--config", str(bad), "--check-config"])
        assert proc.returncode == 2 and reason in proc.stderr, proc.stderr
    env = {"WANDB_INFRA_EXPORTER__SOURCES__FILES__ENABLED": "true"}
    proc = run_main(cli.main, ["--check-config"], env={**env, "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "sources.files.directory is required" in proc.stderr


def test_example_config_is_valid(tmp_path):
    example = Path(__file__).resolve().parent.parent / "deploy" / "exporter.example.yaml"
    token = tmp_path / "token"
    token.write_text("example-token\n")
    env = {"PATH": "/usr/bin:/bin", "WANDB_INFRA_EXPORTER__SOURCES__SLURM__ENABLED": "true",
           "WANDB_INFRA_EXPORTER__AUTH__TOKEN_FILE": str(token)}
    proc = subprocess.run([EXPORTER, "--config", str(example), "--check-config"],
                          capture_output=True, text=True, timeout=30, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "polled sources: slurm" in proc.stdout
