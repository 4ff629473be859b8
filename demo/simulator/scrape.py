"""Prometheus scrape configuration for the simulator: target groups, scrape configs and a whole
prometheus.yml.

Why: one aiohttp server serves every host's targets (``/dcgm/<host>/metrics``,
``/node/<host>/metrics``), so Prometheus must reach each through ``__metrics_path__`` and see an
``instance`` label per host, as if each host ran its own exporter on the usual port.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from demo.simulator.model import SimulatorError

DCGM_PORT = 9400
NODE_PORT = 9100


def target_groups(address: str, hosts: Iterable[str], exporter: str) -> list[dict[str, Any]]:
    """file_sd / http_sd target groups: one target per host, its own path and ``instance``."""
    port = DCGM_PORT if exporter == "dcgm" else NODE_PORT
    return [
        {"targets": [address],
         "labels": {"__metrics_path__": f"/{exporter}/{name}/metrics",
                    "instance": f"{name}:{port}"}}
        for name in hosts
    ]


def scrape_configs(
    address: str, hosts: Iterable[str], *, interval: str = "15s", file_sd_dir: Path | None = None,
    dcgm_job: str = "dcgm", node_job: str = "node", runs_job: str | None = None,
) -> list[dict[str, Any]]:
    """Scrape configs for the simulator: static, or file_sd when ``file_sd_dir`` is given (the
    files are written there). ``runs_job`` adds the join-metric stand-in."""
    host_list = list(hosts)
    configs: list[dict[str, Any]] = []
    for exporter, job in (("dcgm", dcgm_job), ("node", node_job)):
        groups = target_groups(address, host_list, exporter)
        entry: dict[str, Any] = {"job_name": job, "scrape_interval": interval,
                                 "scrape_timeout": _timeout_for(interval)}
        if file_sd_dir is not None:
            file_sd_dir.mkdir(parents=True, exist_ok=True)
            path = file_sd_dir / f"{exporter}.json"
            path.write_text(json.dumps(groups, indent=1))
            entry["file_sd_configs"] = [{"files": [str(path)], "refresh_interval": "30s"}]
        else:
            entry["static_configs"] = groups
        configs.append(entry)
    if runs_job:
        configs.append({"job_name": runs_job, "scrape_interval": interval,
                        "metrics_path": "/runs/metrics",
                        "static_configs": [{"targets": [address]}]})
    return configs


def _timeout_for(interval: str) -> str:
    seconds = interval_seconds(interval)
    return f"{max(1, min(10, int(seconds * 0.8)))}s"


def interval_seconds(duration: str) -> float:
    """A Prometheus duration (``15s``, ``1m``) in seconds, or a SimulatorError."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in ("ms", "s", "m", "h"):
        if duration.endswith(unit) and duration[: -len(unit)].isdigit():
            return int(duration[: -len(unit)]) * units[unit]
    raise SimulatorError(f"bad duration {duration!r}; use e.g. 15s, 1m")


def prometheus_config(
    address: str, hosts: Iterable[str], *, interval: str = "15s", rule_files: Iterable[str] = (),
    file_sd_dir: Path | None = None, extra_scrape_configs: Iterable[dict[str, Any]] = (),
    runs_job: str | None = None,
) -> str:
    """A complete prometheus.yml (YAML text) scraping the simulator."""
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": list(rule_files),
        "scrape_configs": [*scrape_configs(address, hosts, interval=interval,
                                           file_sd_dir=file_sd_dir, runs_job=runs_job),
                           *extra_scrape_configs],
    }
    return yaml.safe_dump(config, sort_keys=False)
