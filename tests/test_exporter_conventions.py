"""Prometheus exporter conventions: a landing page at /, gzip when the scraper accepts it (and
Prometheus itself scraping the gzipped body)."""

from __future__ import annotations

import gzip
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from harness.exporter_process import running_exporter
from harness.processes import prom_query, prometheus, wait_for
from wandb_infra.common import labels

pytestmark = pytest.mark.integration

TOKEN = "t" * 32


def _register(url: str, hosts: int) -> None:
    for i in range(hosts):
        resp = requests.post(url + "/v1/runs", timeout=10,
                             headers={"Authorization": f"Bearer {TOKEN}"},
                             json={"entity": "acme", "project": "llm", "run_id": "r1",
                                   "hostname": f"gpu-node-{i:03d}", "gpus": ["0", "1"]})
        assert resp.status_code in (200, 201), resp.text


def test_landing_page_links_metrics_and_health(tmp_path):
    with running_exporter({"auth": {"token": TOKEN}}, tmp_path) as url:
        page = requests.get(url + "/", timeout=10)
        assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
        assert 'href="metrics"' in page.text and 'href="healthz"' in page.text


def test_metrics_gzipped_only_when_accepted(tmp_path):
    with running_exporter({"auth": {"token": TOKEN}}, tmp_path) as url:
        _register(url, 50)
        plain = requests.get(url + "/metrics", timeout=10,
                             headers={"Accept-Encoding": "identity"})
        assert "Content-Encoding" not in plain.headers
        raw = requests.get(url + "/metrics", timeout=10, stream=True,
                           headers={"Accept-Encoding": "gzip"}).raw.read()
        assert gzip.decompress(raw).decode().count(labels.GPU_INFO + "{") == 100
        assert len(raw) * 5 < len(plain.content)


def test_prometheus_scrapes_the_gzipped_exposition(tmp_path):
    with running_exporter({"auth": {"token": TOKEN}}, tmp_path / "exporter") as url:
        _register(url, 3)
        target = url.removeprefix("http://")
        config = ("global: {scrape_interval: 1s}\nscrape_configs: [{job_name: x, "
                  f"static_configs: [{{targets: ['{target}']}}]}}]\n")
        with prometheus(config, tmp_path / "prom") as prom:
            rows = wait_for(lambda: prom_query(prom.url, f"count({labels.GPU_INFO})"), 30,
                            "the join metrics in Prometheus")
            assert rows[0]["value"][1] == "6"


def test_build_info_and_process_metrics(tmp_path):
    with running_exporter({"auth": {"token": TOKEN}}, tmp_path) as url:
        text = requests.get(url + "/metrics", timeout=10).text
    [build] = [line for line in text.splitlines()
               if line.startswith("wandb_infra_exporter_build_info{")]
    assert 'version="' in build and build.endswith(" 1.0")
    for family in ("process_resident_memory_bytes", "process_open_fds", "python_info",
                   "python_gc_collections_total"):
        assert f"\n{family}" in text, family


def test_web_listen_address_flag_and_a_taken_port_in_one_line(tmp_path):
    exporter = str(Path(sys.executable).parent / "wandb-infra-exporter")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([exporter, f"--web.listen-address=127.0.0.1:{port}"],
                              capture_output=True, text=True, timeout=60, check=False,
                              env={**os.environ, "WANDB_INFRA_EXPORTER__AUTH__TOKEN": TOKEN})
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if "cannot listen" in line]
    assert len(lines) == 1 and "in use" in lines[0].lower(), proc.stderr
    assert "Traceback" not in proc.stderr
    checked = subprocess.run([exporter, "--web.listen-address=127.0.0.1:19999", "--check-config"],
                             capture_output=True, text=True, timeout=60, check=False)
    assert "would listen on 127.0.0.1:19999" in checked.stdout, checked.stderr


@pytest.mark.parametrize(("config", "message"), [
    ({"sources": {"slurm": {"enabled": True, "intervall_seconds": 5}}},
     "sources.slurm.intervall_seconds: unknown key (known: enabled, name, "),
    ({"sources": {"slurm": {"enabled": True, "interval_seconds": "soon"}}},
     "sources.slurm.interval_seconds: must be a number > 0, not 'soon'"),
    ({"registrations": {"max_entires": 5}},
     "registrations.max_entires: unknown key (known: enabled, "),
    ({"node_state": {"kubernetes": {"enabled": False, "toleratd_taints": []}}},
     "node_state.kubernetes.toleratd_taints: unknown key (known: "),
])
def test_nested_typos_and_types_are_named_in_one_line(tmp_path, config, message):
    path = tmp_path / "exporter.yaml"
    path.write_text(yaml.safe_dump({"listen": "127.0.0.1:9842", **config}))
    proc = subprocess.run([str(Path(sys.executable).parent / "wandb-infra-exporter"),
                           "--config", str(path), "--check-config"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert message in line and "Traceback" not in proc.stderr
