"""Run the real ``wandb-infra-exporter`` console script on loopback for a test, then stop it."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.services import env_without_proxies, free_port, wait_http

EXPORTER = str(Path(sys.executable).parent / "wandb-infra-exporter")


@contextlib.contextmanager
def running_exporter(config: Mapping[str, Any], workdir: Path, port: int | None = None,
                     env: Mapping[str, str] | None = None) -> Iterator[str]:
    """Start the exporter with ``config`` (listen forced to 127.0.0.1); yield its base URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    cfg = {**config, "listen": f"127.0.0.1:{port}"}
    path = workdir / "exporter.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log = workdir / "exporter.log"
    with log.open("wb") as handle:
        proc = subprocess.Popen([EXPORTER, "--config", str(path)], stdout=handle,
                                stderr=subprocess.STDOUT, env={**env_without_proxies(),
                                                               **(env or {})},
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/healthz", timeout=30, proc=proc)
        yield url
    except BaseException:
        print(log.read_text(errors="replace")[-4000:])
        raise
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def metric_samples(url: str, name: str) -> list[dict[str, str]]:
    """Label sets of every sample of ``name`` in the exporter's /metrics."""
    text = requests.get(url + "/metrics", timeout=10).text
    return [dict(s.labels) for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name]


def metric_value(url: str, name: str, **match: str) -> float | None:
    """Value of the first sample of ``name`` whose labels include ``match`` (None if absent)."""
    text = requests.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in match.items()):
                return sample.value
    return None
