"""The exporter process while its sources hang past their timeout, then answer garbage.

Existing tests cover a Slurm outage, W&B 503s, Kubernetes garbage items and registration fuzzing
one at a time; here two sources (W&B and Kubernetes) fail together in the real process: the last
good mapping stays for the grace period with each source reported down, /metrics keeps
answering, the mapping is dropped after the grace period, and everything comes back by itself.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import pytest
import requests

from harness.bridge_process import raw_status
from harness.exporter_process import metric_samples, metric_value, running_exporter
from harness.k8s_standin import K8sStandin, make_pod
from harness.processes import Reply, http_stub, wait_for
from harness.wandb_standin import WandbStandin
from tests.test_exporter_wandb import env, wire_config
from wandb_infra.common import labels

pytestmark = pytest.mark.integration

GRACE = 5.0
GARBAGE = b"<html><body>502 Bad Gateway</body></html>\x00\xff"


class FaultProxy:
    """Forwards to ``upstream`` (mode 'ok'), hangs ('hang') or answers 200 with garbage."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.mode = "ok"
        self._stub = http_stub(self._answer)
        self.url = ""

    def _answer(self, path: str, headers: Mapping[str, str]) -> Reply:
        if self.mode == "hang":
            time.sleep(3)  # the simulated hang, past the sources' 1 s timeout; not a wait
        if self.mode in ("hang", "garbage"):
            return 200, "application/json", GARBAGE
        resp = requests.get(self.upstream + path, timeout=10,
                            headers={"Authorization": headers.get("Authorization", "")})
        return resp.status_code, "application/json", resp.content

    def __enter__(self) -> FaultProxy:
        self.url = "http://" + self._stub.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stub.__exit__(None, None, None)


def _hosts(url: str) -> set[tuple[str, str]]:
    return {(s["source"], s["hostname"]) for s in metric_samples(url, labels.NODE_INFO)}


def _up(url: str, source: str) -> float | None:
    return metric_value(url, "wandb_infra_exporter_source_up", source=source)


def test_sources_hanging_then_garbage_keep_mapping_for_grace_then_recover(tmp_path: Path):
    with WandbStandin() as wb, K8sStandin() as k8s, FaultProxy(k8s.url) as proxy:
        wb.add_run("team", "llm", "live", config=wire_config(env("gpu01", 2)))
        k8s.set_pods([make_pod("trainer-0", "node-k", "ml", labels={"wandb.ai/run-id": "k1"})])
        (tmp_path / "key").write_text(wb.api_key + "\n")
        config = {"grace_seconds": GRACE, "log_level": "debug", "sources": {
            "wandb": {"enabled": True, "base_url": wb.url, "api_key_file": str(tmp_path / "key"),
                      "projects": ["team/llm"], "interval_seconds": 0.3, "timeout_seconds": 1},
            "kubernetes": {"enabled": True, "api_server": proxy.url, "token": "env:K8S_TOKEN",
                           "default_entity": "team", "default_project": "k",
                           "interval_seconds": 0.3, "timeout_seconds": 1}}}
        both = {("wandb", "gpu01"), ("kubernetes", "node-k")}
        with running_exporter(config, tmp_path / "exporter", env={"K8S_TOKEN": k8s.token}) as url:
            wait_for(lambda: _hosts(url) == both, 20, what="both sources mapped")
            wb.slow(3, times=None)
            proxy.mode = "hang"
            failed_at = time.monotonic()
            wait_for(lambda: _up(url, "wandb") == 0 and _up(url, "kubernetes") == 0, GRACE - 1,
                     "both sources reported down within the grace period", 0.1)
            assert _hosts(url) == both, "last good mapping kept within the grace period"
            assert time.monotonic() - failed_at < GRACE
            wb.clear_faults()
            wb.fail(200, times=None, body=GARBAGE.decode("latin-1"))
            proxy.mode = "garbage"
            wait_for(lambda: not _hosts(url), GRACE + 5, what="mapping dropped after grace")
            assert time.monotonic() - failed_at >= GRACE - 0.5
            assert _up(url, "wandb") == 0 and _up(url, "kubernetes") == 0
            assert metric_value(url, "wandb_infra_exporter_source_errors_total",
                                source="wandb") >= 2
            health = requests.get(url + "/healthz", timeout=5)
            assert health.status_code in (200, 503)
            wb.clear_faults()
            proxy.mode = "ok"
            wait_for(lambda: _hosts(url) == both and _up(url, "wandb") == 1
                     and _up(url, "kubernetes") == 1, 20, what="recovered by itself")
        log = (tmp_path / "exporter" / "exporter.log").read_text()
        assert wb.api_key not in log and k8s.token not in log
        assert "Traceback" not in log
        for source, error in (("wandb", "ReadTimeout"), ("kubernetes", "ReadTimeout"),
                              ("wandb", "non-JSON"), ("kubernetes", "not a list of pods")):
            assert any(f'"source": "{source}"' in line and error in line
                       for line in log.splitlines()), (source, error)


RAW_CREDENTIALS = [b"Bearer \xff\xfe", "Bearer s3cr\u00e9t".encode("latin-1"), b"Bearer s3cre",
                   "Bearer s3cr\u00e9t".encode(), b"Bearer \x80" * 50, b"Bearer s3cret-token-x"]


def test_registration_api_rejects_any_wrong_credential_bytes_with_401(tmp_path: Path):
    (tmp_path / "token").write_text("s3cret-token\n")
    with running_exporter({"auth": {"token_file": str(tmp_path / "token")}},
                          tmp_path / "exporter") as url:
        port = int(url.rsplit(":", 1)[1])
        for header in RAW_CREDENTIALS:
            for method, path in (("POST", "/v1/runs"), ("DELETE", "/v1/runs/e/p/r")):
                assert raw_status(port, method, path, header) == 401, (method, header)
        assert raw_status(port, "POST", "/v1/runs", b"Bearer s3cret-token") == 400
        assert requests.get(url + "/healthz", timeout=5).status_code == 200
