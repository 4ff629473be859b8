"""Run the real ``wandb-infra-exporter`` console script on loopback for a test, then stop it."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from harness.processes import free_port, running

EXPORTER = str(Path(sys.executable).parent / "wandb-infra-exporter")


@contextlib.contextmanager
def running_exporter(config: Mapping[str, Any], workdir: Path, port: int | None = None,
                     env: Mapping[str, str] | None = None) -> Iterator[str]:
    """Start the exporter with ``config`` (listen forced to 127.0.0.1); yield its base URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    path = workdir / "exporter.yaml"
    registrations = {"state_file": str(workdir / "registrations.json"),
                     **config.get("registrations", {})}  # never the shared default path
    path.write_text(yaml.safe_dump({**config, "listen": f"127.0.0.1:{port}",
                                    "registrations": registrations}))
    with running([EXPORTER, "--config", str(path)], workdir, "exporter", port, "/healthz",
                 env=env) as service:
        yield service.url


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
