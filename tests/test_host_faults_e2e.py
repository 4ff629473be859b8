"""Issue 28 end to end: node_exporter series (vmstat from node_exporter's own collector fixture,
tests/data/node_exporter/e2e-output.txt; the filesystem collector's documented labels) and the
exporter's join metric scraped by a real Prometheus running the shipped rules (``for`` and the
slower tiers 60 times faster), alerts through a real Alertmanager on the shipped routing
(deploy/alertmanager/alertmanager.yml) to the bridge process. A host OOM kill and a local
filesystem remounted read-only each reach the run on that host as a host-resource root cause, with
the restart decision the catalog's recovery action gives."""

from __future__ import annotations

import contextlib
import re
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from demo.stack import ALERTMANAGER_EXAMPLE, BRIDGE_RECEIVER, RULES_FILE, scale_rules
from harness.processes import (
    alertmanager,
    free_port,
    prom_query,
    prometheus,
    running,
    scrape_target,
    wait_for,
)
from tests.test_host_faults_upstream import NODE
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.catalog.recovery import SPECS

pytestmark = pytest.mark.integration

ENTITY, PROJECT = "acme", "llm"
# (run, host) for each fault: one run per host, so each run's diagnosis is about one fault
OOM = ("oomrun", "gpu-node-1")
READ_ONLY = ("rorun", "gpu-node-2")
OOM_LINE = re.compile(r"^node_vmstat_oom_kill \S+$", re.M)


@dataclass
class Node:
    """One node_exporter: the fixture's vmstat family with the OOM kill count the test sets,
    uname with a FQDN nodename, and a local ext4 checkpoint mount the test can remount
    read-only."""

    host: str
    oom_kills: int = 0
    read_only: int = 0
    vmstat: str = field(default="", init=False)

    def __post_init__(self) -> None:
        lines = [line for line in NODE.read_text().splitlines()
                 if line.removeprefix("# HELP ").removeprefix("# TYPE ")
                 .startswith("node_vmstat_")]
        self.vmstat = "\n".join(lines) + "\n"
        assert OOM_LINE.search(self.vmstat), "the fixture lost node_vmstat_oom_kill"

    def text(self) -> str:
        uname = (f'node_uname_info{{domainname="(none)",machine="x86_64",'
                 f'nodename="{self.host}.cluster.example.com",release="6.1.0-28-amd64",'
                 f'sysname="Linux",version="#1 SMP"}} 1\n')
        mount = ('node_filesystem_readonly{device="/dev/nvme0n1p2",fstype="ext4",'
                 f'mountpoint="/checkpoints"}} {self.read_only}\n')
        return OOM_LINE.sub(f"node_vmstat_oom_kill {self.oom_kills}", self.vmstat) + uname + mount


def _exporter() -> str:
    """What the exporter publishes: ``wandb_run_node_info`` placing each run on its host, and
    Slurm's state of each host (allocated to the run, so schedulable)."""
    lines = ["# TYPE wandb_run_node_info gauge"]
    lines += [f'wandb_run_node_info{{wandb_entity="{ENTITY}",wandb_project="{PROJECT}",'
              f'wandb_run_id="{run}",wandb_run_name="run-{run}",hostname="{host}",'
              f'source="slurm"}} 1' for run, host in (OOM, READ_ONLY)]
    lines.append("# TYPE wandb_infra_node_state gauge")
    lines += [f'wandb_infra_node_state{{hostname="{host}",scheduler="slurm",state="ALLOCATED"}} 1'
              for _, host in (OOM, READ_ONLY)]
    return "\n".join(lines) + "\n"


def _am_config(bridge: str, token_file: Path) -> str:
    """The shipped routing, with the bridge's route waiting 1 s instead of 30 s."""
    config = yaml.safe_load(ALERTMANAGER_EXAMPLE.read_text())
    for route in config["route"]["routes"]:
        if route["receiver"] == BRIDGE_RECEIVER:
            route["group_wait"], route["group_interval"] = "1s", "1s"
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = bridge + "/alertmanager"
            hook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    return yaml.safe_dump(config, sort_keys=False)


def _prom_config(rules: Path, am: str, nodes: list[str], exporter: str) -> str:
    return yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am]}]}]},
        "scrape_configs": [
            {"job_name": "node", "static_configs": [{"targets": nodes}]},
            {"job_name": "wandb-infra-exporter", "static_configs": [{"targets": [exporter]}]}]})


@dataclass
class World:
    """The running pipeline: the nodes the test changes, Alertmanager and the bridge."""

    nodes: dict[str, Node]
    am: str
    bridge: str
    token: str

    def view(self, run: str) -> dict[str, Any]:
        """The bridge's JSON view of one run ({} before it has heard of the run)."""
        resp = requests.get(f"{self.bridge}/runs/{ENTITY}/{PROJECT}/{run}", timeout=10,
                            headers={"Accept": "application/json",
                                     "Authorization": f"Bearer {self.token}"})
        if resp.status_code == 404:
            return {}
        resp.raise_for_status()
        return resp.json()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[World]:
    workdir = tmp_path_factory.mktemp("host-faults-e2e")
    token = secrets.token_urlsafe(32)
    token_file = workdir / "token"
    token_file.write_text(token + "\n")
    rules = workdir / RULES_FILE.name
    rules.write_text(scale_rules(RULES_FILE.read_text(), 1 / 60))
    nodes = {host: Node(host) for _, host in (OOM, READ_ONLY)}
    prom_port, bridge_port = free_port(), free_port()
    bridge_config = workdir / "bridge.yaml"
    bridge_config.write_text(yaml.safe_dump({
        "listen": {"host": "127.0.0.1", "port": bridge_port},
        "auth": {"bearer_token_file": str(token_file)},
        "store": {"path": str(workdir / "bridge.sqlite")},
        "grafana": {"base_url": "http://grafana.invalid"},
        "prometheus": {"url": f"http://127.0.0.1:{prom_port}", "node_state_refresh_seconds": 1.0},
    }))
    with contextlib.ExitStack() as stack:
        targets = [stack.enter_context(scrape_target(n.text)) for n in nodes.values()]
        exporter = stack.enter_context(scrape_target(_exporter))
        bridge = stack.enter_context(running(
            [sys.executable, "-m", "wandb_infra.bridge.cli", "serve", "--config",
             str(bridge_config)], workdir, "bridge", bridge_port, "/readyz"))
        am = stack.enter_context(alertmanager(_am_config(bridge.url, token_file),
                                              workdir / "am"))
        prom = stack.enter_context(prometheus(
            _prom_config(rules, am.url.removeprefix("http://"), targets, exporter),
            workdir / "prom", port=prom_port))
        # healthy first: the OOM count and the mount's writable state are in the history, and
        # every host is named (the normalise-targets tier runs every 4 s here)
        for expr in ("count(count_over_time(node_filesystem_readonly[1m]) >= 3) == 2",
                     "count(instance:node_exporter_hostname:info) == 2",
                     "count(wandb_run_node_info) == 2"):
            wait_for(partial(prom_query, prom.url, expr), 60, expr, 0.5)
        yield World(nodes, am.url, bridge.url, token)


def _issue_rooted_at(world: World, run: str, alertname: str) -> dict[str, Any] | None:
    view = world.view(run)
    for issue in view.get("issues", []):
        if issue["root_cause"]["alertname"] == alertname and view.get("remediation"):
            return view
    return None


def _sent_to_bridge(am: str, alertname: str, run: str) -> list[dict[str, Any]]:
    alerts = requests.get(am + "/api/v2/alerts", params={"filter": [
        f'alertname="{alertname}"', f'wandb_run_id="{run}"']}, timeout=10).json()
    return [a for a in alerts if BRIDGE_RECEIVER in {r["name"] for r in a["receivers"]}]


def test_oom_kill_and_read_only_mount_reach_their_runs_as_host_resource_faults(world):
    world.nodes[OOM[1]].oom_kills = 2
    world.nodes[READ_ONLY[1]].read_only = 1
    described = {"HostOomKill": f"The OOM killer ran 2 time(s) on {OOM[1]} in the last 10 "
                                "minutes (node_vmstat_oom_kill).",
                 "FilesystemReadOnly": f"/checkpoints on {READ_ONLY[1]} is read-only "
                                       "(readonly = 1) since it was remounted so"}
    for (run, host), alertname in ((OOM, "HostOomKill"), (READ_ONLY, "FilesystemReadOnly")):
        view = wait_for(partial(_issue_rooted_at, world, run, alertname), 90,
                        f"{alertname} as the root cause of {run} in the bridge", 0.5)
        assert _sent_to_bridge(world.am, alertname, run), f"{alertname} not routed to the bridge"
        (issue,) = view["issues"]
        root = issue["root_cause"]
        assert (root["hostname"], root["cause_class"]) == (host, "host_resource")
        assert root["description"].startswith(described[alertname])
        rem = view["remediation"]
        assert rem["needs"] == SPECS[ALERTS[alertname].needs].needs
        assert [h["hostname"] for h in rem["hosts"]] == [host]
    # an OOM kill needs only an application restart: the node stays in service
    oom = world.view(OOM[0])["remediation"]
    assert (oom["verdict"], oom["exclusion"]) == ("safe", "")
    # a read-only local mount needs the node serviced: unsafe while Slurm still schedules it
    read_only = world.view(READ_ONLY[0])["remediation"]
    assert read_only["verdict"] == "unsafe"
    assert read_only["exclusion"] == f"sbatch --exclude={READ_ONLY[1]}"
    assert "the fault on gpu-node-2 is still present" in read_only["detail"]
