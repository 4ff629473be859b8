"""The exporter's registration API is closed by default and validates whole values."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
import requests
import yaml
from aiohttp import web

from harness.bridge_payloads import serve_app
from harness.exporter_process import EXPORTER, running_exporter
from harness.processes import free_port
from tests.inprocess import Result, run_main
from wandb_infra.exporter.cli import main
from wandb_infra.exporter.hostnames import HostnameMapper
from wandb_infra.exporter.placements import PlacementMerger
from wandb_infra.exporter.pushed import RegistrationStore
from wandb_infra.exporter.server import HostToken, build_app

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "hardening-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REG = {"entity": "ent", "project": "proj", "run_id": "run1", "hostname": "gpu01"}


def _check(tmp_path: Path, config: dict, env: dict[str, str] | None = None) -> Result:
    """``wandb-infra-exporter --config FILE --check-config`` with only ``env`` set."""
    path = tmp_path / "exporter.yaml"
    path.write_text(yaml.safe_dump(config))
    return run_main(main, ["--config", str(path), "--check-config"],
                    env={"PATH": "/usr/bin:/bin", **(env or {})})


@pytest.mark.parametrize("listen", ["0.0.0.0:9842", "[::]:9842", "10.1.2.3:9842",
                                    "gpu01.example.com:9842", ":9842"])
def test_open_registration_api_off_loopback_refuses_to_start(tmp_path, listen):
    proc = _check(tmp_path, {"listen": listen})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing to start" in lines[0], proc.stderr
    assert "auth.token_file" in lines[0]


@pytest.mark.integration
def test_the_process_refuses_to_start_with_the_same_line(tmp_path):
    """Starting (not checking) the installed console script: the same one line, exit 2."""
    path = tmp_path / "exporter.yaml"
    path.write_text(yaml.safe_dump({"listen": "0.0.0.0:9842"}))
    proc = subprocess.run([EXPORTER, "--config", str(path)], capture_output=True, text=True,
                          timeout=30, check=False, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert "refusing to start" in line and "auth.token_file" in line


@pytest.mark.parametrize("config", [
    {"listen": "127.0.0.1:9842"}, {"listen": "localhost:9842"}, {"listen": "[::1]:9842"},
    {"listen": "127.0.0.2:9842"},
    {"listen": "0.0.0.0:9842", "registrations": {"enabled": False}},
    {"listen": "0.0.0.0:9842", "auth": {"token": "env:EXPORTER_TOKEN"}},
])
def test_loopback_a_token_or_no_registration_api_may_start(tmp_path, config):
    proc = _check(tmp_path, config, env={"EXPORTER_TOKEN": TOKEN})
    assert proc.returncode == 0, proc.stderr


def test_shipped_configs_use_a_token(tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    example = yaml.safe_load((ROOT / "deploy" / "exporter.example.yaml").read_text())
    assert example["auth"]["token_file"]
    assert _check(tmp_path, example).returncode == 2  # its token file is not on this machine
    override = {"WANDB_INFRA_EXPORTER__AUTH__TOKEN_FILE": str(token)}
    assert _check(tmp_path, example, env=override).returncode == 0
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "exporter.yaml").read_text()))
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    config = yaml.safe_load(config_map["data"]["exporter.yaml"])
    token_path = Path(config["auth"]["token_file"])
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    [name] = [n for n, path in mounts.items() if path == str(token_path.parent)]
    assert volumes[name]["secret"]["secretName"]
    config.pop("sources")  # the Kubernetes source needs a cluster; the auth check does not
    assert "cannot read auth token" in _check(tmp_path, config).stderr
    config["auth"]["token_file"] = str(token)
    assert _check(tmp_path, config).returncode == 0


@pytest.mark.integration
def test_slurm_scripts_send_the_default_token_file(tmp_path):
    """prolog/epilog read /etc/wandb-infra-exporter/token unless told otherwise."""
    common = (ROOT / "deploy" / "slurm" / "common.sh").read_text()
    assert 'WANDB_INFRA_EXPORTER_TOKEN_FILE:-/etc/wandb-infra-exporter/token' in common
    seen: list[str] = []

    def app_factory() -> web.Application:
        async def handler(request: web.Request) -> web.Response:
            seen.append(request.headers.get("Authorization", ""))
            return web.json_response({}, status=201)
        app = web.Application()
        app.router.add_post("/v1/runs", handler)
        return app

    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    with serve_app(app_factory()) as url:
        env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_COMMENT": "wandb:ent/proj/run1",
               "SLURMD_NODENAME": "gpu01", "WANDB_INFRA_EXPORTER_URL": url,
               "WANDB_INFRA_EXPORTER_TOKEN_FILE": str(token),
               "WANDB_INFRA_EXPORTER_ENV_FILE": str(tmp_path / "none")}
        subprocess.run(["bash", str(ROOT / "deploy" / "slurm" / "prolog.sh")], env=env,
                       check=True, timeout=30)
    assert seen == [f"Bearer {TOKEN}"]


@pytest.fixture(scope="module")
def api():
    store = RegistrationStore()
    registry = PlacementMerger(HostnameMapper(), grace_seconds=300,
                               live_sources=[("registrations", store.active)],
                               live_version=store.version)
    with serve_app(build_app(registry, store, token=TOKEN), free_port()) as url:
        yield url, store


@pytest.mark.parametrize(("field", "value"), [
    ("run_id", "run1\n"), ("entity", "ent\n"), ("project", "proj\n"), ("hostname", "gpu01\n"),
    ("run_name", "name\n"), ("slurm_job_id", "42\n"), ("gpus", ["GPU-1111\n"]),
    ("gpus", [{"uuid": "GPU-1111\n"}]), ("gpus", ["\u00b2"]),
])
def test_trailing_newlines_and_unicode_digits_are_refused(api, field, value):
    url, store = api
    before = len(store)
    resp = requests.post(url + "/v1/runs", json={**REG, field: value}, headers=AUTH, timeout=5)
    assert resp.status_code == 400, resp.text
    assert len(store) == before


def test_delete_with_a_trailing_newline_does_not_touch_the_real_run(api):
    url, store = api
    assert requests.post(url + "/v1/runs", json={**REG, "run_id": "keep"}, headers=AUTH,
                         timeout=5).status_code in (200, 201)
    for path in ("/v1/runs/ent/proj/keep%0A", "/v1/runs/ent%0A/proj/keep",
                 "/v1/runs/ent/proj/keep?hostname=gpu01%0A"):
        resp = requests.delete(url + path, headers=AUTH, timeout=5)
        assert resp.status_code == 400, resp.text
    assert any(p.run.run_id == "keep" for p in store.active())


@pytest.mark.parametrize("body", [b"[" * 30_000 + b"]" * 30_000,
                                  b"{\"a\":" * 10_000 + b"1" + b"}" * 10_000])
def test_deeply_nested_json_is_a_400_not_a_500(api, body):
    url, _ = api
    resp = requests.post(url + "/v1/runs", data=body, timeout=5,
                         headers={**AUTH, "Content-Type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert "nested" in resp.json()["error"]


NODE = "node-token-gpu01-0123456789"


@pytest.fixture(scope="module")
def bound_api():
    store = RegistrationStore()
    registry = PlacementMerger(HostnameMapper(), grace_seconds=300,
                               live_sources=[("registrations", store.active)],
                               live_version=store.version)
    app = build_app(registry, store, token=TOKEN,
                    host_tokens=[HostToken(NODE, ("gpu01",)), HostToken("rack-b-token",
                                                                        ("gpu1*",))])
    with serve_app(app, free_port()) as url:
        yield url, store


def test_a_host_bound_token_registers_and_deletes_only_its_hosts(bound_api):
    url, store = bound_api
    node = {"Authorization": f"Bearer {NODE}"}
    post = lambda body, headers: requests.post(url + "/v1/runs", json=body,  # noqa: E731
                                               headers=headers, timeout=5)
    assert post({**REG, "hostname": "GPU01.example.com"}, node).status_code == 201
    assert post({**REG, "hostname": "gpu02"}, AUTH).status_code == 201  # the admin token
    refused = post({**REG, "hostname": "gpu02", "run_id": "fake"}, node)
    assert refused.status_code == 403 and "gpu02" in refused.json()["error"]
    assert post({**REG, "hostname": "gpu17"}, {"Authorization": "Bearer rack-b-token"}
                ).status_code == 201
    delete = lambda path, headers: requests.delete(url + path, headers=headers,  # noqa: E731
                                                   timeout=5)
    assert delete("/v1/runs/ent/proj/run1?hostname=gpu02", node).status_code == 403
    assert delete("/v1/runs/ent/proj/run1", node).status_code == 403  # all hosts: not its own
    assert sorted(p.host for p in store.active()) == ["gpu01", "gpu02", "gpu17"]
    assert delete("/v1/runs/ent/proj/run1?hostname=gpu01", node).json() == {"deleted": 1}
    assert delete("/v1/runs/ent/proj/run1", AUTH).json() == {"deleted": 2}
    assert post(REG, {"Authorization": "Bearer wrong"}).status_code == 401


def test_host_tokens_in_the_config(tmp_path):
    node_token = tmp_path / "gpu01.token"
    node_token.write_text(NODE + "\n")
    config = {"listen": "0.0.0.0:9842",
              "auth": {"host_tokens": [{"token_file": str(node_token), "hosts": ["gpu01"]}]}}
    assert _check(tmp_path, config).returncode == 0  # host tokens alone satisfy the rule
    for bad, reason in (([{"token_file": str(node_token)}], "hosts"),
                        ([{"hosts": ["gpu01"]}], "token"),
                        ({"gpu01": NODE}, "must be a list")):
        proc = _check(tmp_path, {**config, "auth": {"host_tokens": bad}})
        assert proc.returncode == 2 and reason in proc.stderr, proc.stderr


def test_registrations_are_bounded_in_the_series_they_publish():
    store = RegistrationStore(max_series=10)
    registry = PlacementMerger(HostnameMapper(), grace_seconds=300,
                               live_sources=[("registrations", store.active)],
                               live_version=store.version)
    with serve_app(build_app(registry, store, token=TOKEN), free_port()) as url:
        def post(host: str, gpus: int) -> int:
            return requests.post(url + "/v1/runs", json={**REG, "hostname": host,
                                                         "gpus": list(range(gpus))},
                                 headers=AUTH, timeout=5).status_code
        assert post("a", 4) == 201 and post("b", 3) == 201  # 5 + 4 series
        assert post("c", 0) == 201  # 10
        assert post("d", 0) == 503
        assert post("a", 4) == 200  # a heartbeat of the same size always fits
        assert post("a", 5) == 503  # growing does not
        assert requests.delete(url + "/v1/runs/ent/proj/run1?hostname=b", headers=AUTH,
                               timeout=5).json() == {"deleted": 1}
        assert post("d", 3) == 201


@pytest.mark.integration
def test_idle_connections_to_the_exporter_are_closed(tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    config = {"auth": {"token_file": str(token)}, "idle_timeout_seconds": 0.5}
    with running_exporter(config, tmp_path / "exporter") as url:
        port = int(url.rsplit(":", 1)[1])
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
        for sock in idle:
            sock.settimeout(5)
            assert sock.recv(1) == b""  # closed by the exporter, well before 5 s
            sock.close()
        assert requests.get(url + "/healthz", timeout=5).status_code == 200
    assert _check(tmp_path, {"listen": "127.0.0.1:9842", "idle_timeout_seconds": 0}
                  ).returncode == 2
