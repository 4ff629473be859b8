"""The whole pipeline on loopback, from the example configs in ``deploy/``.

simulator (dcgm-exporter + node_exporter) and exporter (join metrics) -> Prometheus with the shipped
rules -> Alertmanager -> bridge -> W&B (real, the test stand-in, or none: the bridge's own pages).
``make demo``, the end-to-end tests and the end-to-end benchmark all start it through ``Stack``, so
what the tests check is what the demo shows. Only addresses, intervals and the rules' ``for``
durations differ from the shipped files (scaled down so a demo takes minutes, not hours).
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

from demo.simulator.scrape import target_groups
from harness import processes
from harness.simulator_process import RemoteCluster, Simulated, simulator
from wandb_infra.catalog import runbook
from wandb_infra.catalog.alerts import duration_seconds
from wandb_infra.catalog.vocabulary import ANNOTATION_FOR_SECONDS

ROOT = Path(__file__).resolve().parent.parent
RULES_FILE = ROOT / "alert_rules" / "wandb-infra.rules.yml"
PROMETHEUS_EXAMPLE = ROOT / "deploy" / "prometheus" / "prometheus.yml"
ENGINES = ("prometheus", "victoriametrics")
ALERTMANAGER_EXAMPLE = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
BRIDGE_RECEIVER = "wandb.bridge"

_WINDOW = re.compile(r"\[(\d+[smhdwy])(?::(\d+[smhdwy]))?\]|\boffset (\d+[smhdwy])\b")


def scale_windows(expr: str, scale: float, scrape_seconds: float) -> str:
    """``expr`` with every range window, subquery step and ``offset`` multiplied by ``scale``.

    A window keeps at least four scrapes (``rate`` needs two samples, and one missed scrape must
    not empty it); a subquery step at least one scrape."""
    def seconds(value: float) -> str:
        return f"{max(1, round(value))}s"

    def scaled(match: re.Match[str]) -> str:
        window, step, offset = match.groups()
        if offset:
            return "offset " + seconds(duration_seconds(offset) * scale)
        out = "[" + seconds(max(4 * scrape_seconds, duration_seconds(window) * scale))
        if step:
            out += ":" + seconds(max(scrape_seconds, duration_seconds(step) * scale))
        return out + "]"
    return _WINDOW.sub(scaled, expr)


def scale_rules(text: str, scale: float, minimum_seconds: int = 0,
                interval_scale: float | None = None, scrape_seconds: float | None = None) -> str:
    """The shipped rule file with every ``for``/``keep_firing_for`` multiplied by ``scale``
    (and the ``for_seconds`` annotation that tells the bridge the delay kept in step), and the
    slower tiers' group ``interval`` by ``interval_scale`` (default ``scale``), so a stack with a
    short global interval keeps the tiers' proportions. With ``scrape_seconds`` (the stack's
    scrape interval) the expressions' windows are scaled like the tiers they read across
    (``scale_windows``, by ``interval_scale``, default ``scale``): a condition
    read as a rate over minutes is then seen within seconds, for tests that measure what follows
    an alert rather than how long its evidence lasts."""
    data = yaml.safe_load(text)
    for group in data["groups"]:
        if "interval" in group:
            seconds = duration_seconds(group["interval"]) * (interval_scale or scale)
            group["interval"] = f"{max(1, minimum_seconds, round(seconds))}s"
        for rule in group["rules"]:
            for key in ("for", "keep_firing_for"):
                if key in rule:
                    seconds = max(minimum_seconds, round(duration_seconds(rule[key]) * scale))
                    rule[key] = f"{seconds}s"
            if scrape_seconds is not None:
                rule["expr"] = scale_windows(str(rule["expr"]), interval_scale or scale,
                                             scrape_seconds)
            if ANNOTATION_FOR_SECONDS in rule.get("annotations", {}):
                rule["annotations"][ANNOTATION_FOR_SECONDS] = str(
                    round(duration_seconds(rule["for"])))
    return yaml.safe_dump(data, sort_keys=False, width=1000)


def point_runbook(text: str, base: str) -> str:
    """The rule file with every ``runbook_url`` under the shipped default base (the bridge's
    in-cluster Service) moved to ``base``, so the stack's links open its own bridge's runbook."""
    data = yaml.safe_load(text)
    for rule in (r for g in data["groups"] for r in g["rules"]):
        url = rule.get("annotations", {}).get("runbook_url", "")
        if url.startswith(runbook.DEFAULT_BASE + "/"):
            rule["annotations"]["runbook_url"] = base + url.removeprefix(runbook.DEFAULT_BASE)
    return yaml.safe_dump(data, sort_keys=False, width=1000)


@dataclass
class StackConfig:
    """What differs between the demo, the end-to-end tests and production intervals.

    ``wandb_*`` configure the bridge's W&B; ``jobs_online`` makes the training-job stand-ins
    create their runs there too (real W&B), instead of offline runs. ``engine`` is where the
    rules run: ``prometheus``, or ``victoriametrics`` (VictoriaMetrics scraping, vmalert
    evaluating the same rule file)."""

    workdir: Path
    hosts: int = 66
    flavour: str = "hostname"
    interval_seconds: int = 2
    for_scale: float = 0.1
    group_wait: str = "2s"
    group_interval: str = "5s"
    wandb_base_url: str | None = None
    wandb_api_key: str | None = None
    markers: bool = True
    grafana_url: str = "http://localhost:3000"
    flush_interval_seconds: float = 1.0
    log_level: str = "info"
    jobs_online: bool = False
    engine: str = "prometheus"
    bridge_sections: dict[str, Any] = field(default_factory=dict)  # more bridge config sections


class Stack:
    """Starts every component in dependency order and stops them in reverse."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.workdir = config.workdir
        self.token = secrets.token_urlsafe(32)
        self.simulator: Simulated | None = None
        self.exporter: processes.Service | None = None
        self.bridge: processes.Service | None = None
        self.alertmanager: processes.Service | None = None
        self.prometheus: processes.Service | None = None
        self.vmalert: processes.Service | None = None
        # Chosen before the bridge starts, so its page plots and run lookups can query it.
        self.query_port = processes.free_port()
        self._exit = contextlib.ExitStack()
        if config.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, not {config.engine!r}")

    # ---- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Simulator, exporter, bridge, Alertmanager, Prometheus; each waits until ready."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.token_file.write_text(self.token + "\n")
        self.token_file.chmod(0o600)
        # in its own process: the caller's threads (scenarios, jobs, a W&B stand-in) cannot
        # starve the exporters Prometheus scrapes
        self.simulator = self._exit.enter_context(simulator(
            self.workdir / "simulator", self.config.hosts, self.config.flavour))
        self.exporter = self._start_exporter()
        self.bridge = self._start_bridge()
        self.alertmanager = self._start_alertmanager()
        if self.config.engine == "victoriametrics":
            self.prometheus, self.vmalert = self._start_victoria_metrics()
        else:
            self.prometheus = self._start_prometheus()

    def stop(self) -> None:
        """Stop everything started so far, newest first."""
        self._exit.close()

    @property
    def cluster(self) -> RemoteCluster:
        """The simulated cluster, to inject faults and assign runs (once started)."""
        assert self.simulator is not None, "the stack is not started"
        return self.simulator.cluster

    @property
    def token_file(self) -> Path:
        """The bearer token shared by Alertmanager, the bridge and the exporter."""
        return self.workdir / "token"

    # ---- components ----------------------------------------------------------------------------

    def _script(self, name: str) -> str:
        return str(Path(sys.executable).parent / name)

    def _service(self, name: str, cmd: list[str], ready_path: str, port: int) -> processes.Service:
        return self._exit.enter_context(
            processes.running(cmd, self.workdir, name, port, ready_path))

    def _start_exporter(self) -> processes.Service:
        port = processes.free_port()
        assert self.simulator is not None
        # Slurm's node states as the simulator plays them (a drained faulty node), read the way
        # the exporter reads `scontrol show node -o`.
        fetch = ("import sys, urllib.request; "
                 "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())")
        config = {
            "listen": f"127.0.0.1:{port}",
            "log_level": self.config.log_level,
            "auth": {"token_file": str(self.token_file)},
            "registrations": {"state_file": str(self.workdir / "registrations.json")},
            "node_state": {"slurm": {
                "enabled": True, "interval_seconds": 1,
                "command": [sys.executable, "-c", fetch, self.simulator.url + "/slurm/nodes"]}},
        }
        path = self.workdir / "exporter.yaml"
        path.write_text(yaml.safe_dump(config))
        return self._service("exporter", [self._script("wandb-infra-exporter"), "--config",
                                          str(path)], "/healthz", port)

    def _start_bridge(self) -> processes.Service:
        port = processes.free_port()
        wandb: dict[str, Any] = {"markers": self.config.markers,
                                 "flush_interval_seconds": self.config.flush_interval_seconds,
                                 "backoff_base_seconds": 0.5, "backoff_max_seconds": 5.0,
                                 "state_check_interval_seconds": 5.0}
        if self.config.wandb_api_key:
            key_file = self.workdir / "wandb-api-key"
            key_file.write_text(self.config.wandb_api_key + "\n")
            key_file.chmod(0o600)
            wandb["api_key_file"] = str(key_file)
        if self.config.wandb_base_url:
            wandb["base_url"] = self.config.wandb_base_url
        config = {
            "listen": {"host": "127.0.0.1", "port": port},
            "log_level": self.config.log_level,
            "auth": {"bearer_token_file": str(self.token_file), "public_pages": True},
            "store": {"path": str(self.workdir / "bridge.sqlite")},
            "wandb": wandb,
            "grafana": {"base_url": self.config.grafana_url},
            "prometheus": {"url": f"http://127.0.0.1:{self.query_port}",
                           "node_state_refresh_seconds": 2.0},
            **self.config.bridge_sections,
        }
        path = self.workdir / "bridge.yaml"
        path.write_text(yaml.safe_dump(config))
        return self._service("bridge", [self._script("wandb-infra-bridge"), "serve", "--config",
                                        str(path)], "/readyz", port)

    def _start_alertmanager(self) -> processes.Service:
        assert self.bridge is not None
        config = yaml.safe_load(ALERTMANAGER_EXAMPLE.read_text())
        for route in config["route"].get("routes", []):
            if route.get("receiver") == BRIDGE_RECEIVER:
                route["group_wait"] = self.config.group_wait
                route["group_interval"] = self.config.group_interval
        for receiver in config["receivers"]:
            for hook in receiver.get("webhook_configs", []):
                hook["url"] = self.bridge.url + "/alertmanager"
                hook["http_config"]["authorization"]["credentials_file"] = str(self.token_file)
        return self._exit.enter_context(processes.alertmanager(
            yaml.safe_dump(config, sort_keys=False), self.workdir / "alertmanager"))

    def _start_prometheus(self) -> processes.Service:
        promdir = self.workdir / "prometheus"
        config = self._prometheus_config(promdir)
        return self._exit.enter_context(
            processes.prometheus(yaml.safe_dump(config, sort_keys=False), promdir,
                                 port=self.query_port))

    def _prometheus_config(self, promdir: Path) -> dict[str, Any]:
        """The example prometheus.yml pointed at this stack, with the scaled rules and the
        simulator's target files written under ``promdir``."""
        assert self.simulator and self.exporter and self.bridge and self.alertmanager
        (promdir / "rules").mkdir(parents=True, exist_ok=True)
        (promdir / "targets").mkdir(parents=True, exist_ok=True)
        (promdir / "rules" / RULES_FILE.name).write_text(point_runbook(
            scale_rules(RULES_FILE.read_text(), self.config.for_scale), self.bridge.url))
        hosts = list(self.cluster.hosts)
        for exporter in ("dcgm", "node"):
            groups = target_groups(self.simulator.address, hosts, exporter)
            (promdir / "targets" / f"{exporter}.json").write_text(json.dumps(groups, indent=1))
        config = yaml.safe_load(PROMETHEUS_EXAMPLE.read_text())
        interval = f"{self.config.interval_seconds}s"
        config["global"] = {"scrape_interval": interval, "evaluation_interval": interval}
        alertmanager = self.alertmanager.url.removeprefix("http://")
        config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [alertmanager]
        for job in config["scrape_configs"]:
            if job["job_name"] == "wandb-infra-exporter":
                job["static_configs"][0]["targets"] = [self.exporter.url.removeprefix("http://")]
            if job["job_name"] == "wandb-infra-bridge":
                job["static_configs"][0]["targets"] = [self.bridge.url.removeprefix("http://")]
        return config

    def _start_victoria_metrics(self) -> tuple[processes.Service, processes.Service]:
        """VictoriaMetrics with the Prometheus example's scrape jobs, and vmalert running the
        same (scaled) rule file, writing records and ``ALERTS`` back and notifying
        Alertmanager. ``self.prometheus`` then points at VictoriaMetrics' query API."""
        assert self.simulator and self.exporter and self.alertmanager
        config = self._prometheus_config(self.workdir / "victoria-metrics")
        scrape = {"global": {"scrape_interval": config["global"]["scrape_interval"]},
                  "scrape_configs": config["scrape_configs"]}
        vm = self._exit.enter_context(processes.victoria_metrics(
            yaml.safe_dump(scrape, sort_keys=False), self.workdir / "victoria-metrics",
            port=self.query_port))
        rules = self.workdir / "victoria-metrics" / "rules" / RULES_FILE.name
        vmalert = self._exit.enter_context(processes.vmalert(
            rules, vm.url, self.alertmanager.url, self.workdir / "vmalert",
            interval=f"{self.config.interval_seconds}s"))
        return vm, vmalert

    # ---- using it ------------------------------------------------------------------------------

    def bridge_json(self, path: str) -> Any:
        """GET a bridge page as JSON."""
        return self._bridge_get(path, "application/json").json()

    def bridge_text(self, run_path: str) -> str:
        """A run's page as plain text (what ``explain`` prints for it)."""
        return self._bridge_get(f"/runs/{run_path}?format=text", "text/plain").text

    def _bridge_get(self, path: str, accept: str) -> requests.Response:
        assert self.bridge is not None
        resp = requests.get(self.bridge.url + path, timeout=10,
                            headers={"Accept": accept, "Authorization": f"Bearer {self.token}"})
        resp.raise_for_status()
        return resp

    def query(self, expr: str) -> list[dict]:
        """Instant PromQL query against the stack's Prometheus."""
        assert self.prometheus is not None
        return processes.prom_query(self.prometheus.url, expr)
