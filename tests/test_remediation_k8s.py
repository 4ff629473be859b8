"""The whole loop on Kubernetes (API stand-in, real exporter, real Prometheus, W&B stand-in):
an XID issue on a Ready node is unsafe with a node-affinity exclusion; the bridge's quarantine
(live) cordons and taints the node; the exporter publishes it, Prometheus scrapes it, and the
same issue's notes flip to safe with the state history and the action taken. kube-state-metrics
series scraped by the same Prometheus are accepted instead of the exporter's."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from harness.bridge_payloads import alert, notification
from harness.exporter_process import running_exporter
from harness.k8s_standin import K8sStandin, make_node
from harness.processes import prom_query, prometheus, scrape_target, wait_for
from harness.wandb_standin import WandbStandin
from tests.views import quarantine_pass, remediation_data, rules_raising
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.wandb_client import WandbClient
from wandb_infra.bridge.prometheus.client import PrometheusClient
from wandb_infra.bridge.prometheus.remediation import NodeStateHistory
from wandb_infra.bridge.quarantine.actuator import check
from wandb_infra.common.runkey import RunKey

pytestmark = pytest.mark.integration
# These alerts name runs the canned Prometheus holds no join metrics for; confirmation by Prometheus
# is tested in test_bridge_confirm.py; the quarantine's alert is raised by a real rule.


def _scrape_config(*targets: str) -> str:
    jobs = "".join(f"  - job_name: j{i}\n    static_configs:\n      - targets: ['{t}']\n"
                   for i, t in enumerate(targets))
    return f"global:\n  scrape_interval: 1s\nscrape_configs:\n{jobs}"


def test_quarantine_cordons_and_the_verdict_flips_through_prometheus(tmp_path):
    with K8sStandin() as k8s, WandbStandin() as wb:
        k8s.set_nodes([make_node(f"gpu-{i:02d}.cluster.local") for i in range(4)])
        token = tmp_path / "token"
        token.write_text(k8s.token)
        config = {"registrations": {"enabled": False},
                  "node_state": {"kubernetes": {"enabled": True, "api_server": k8s.url,
                                                "token_file": str(token),
                                                "interval_seconds": 0.3}}}
        fault = alert("GpuFallenOffBus", category="gpu_hardware", host="gpu-02", gpu="5",
                      run="r1", start=datetime.now(UTC) - timedelta(seconds=30))
        (tmp_path / "prom").mkdir()
        (tmp_path / "prom" / "rules.yml").write_text(rules_raising([fault]))
        rules = f"rule_files: ['{tmp_path / 'prom' / 'rules.yml'}']\nscrape_configs:"
        with running_exporter(config, tmp_path / "exporter") as url, prometheus(
                _scrape_config(url.removeprefix("http://")).replace("scrape_configs:", rules),
                tmp_path / "prom") as prom:
            wb.add_run("team", "proj", "r1")
            store = Store(tmp_path / "bridge.sqlite")
            policy = DeliveryPolicy(flush_interval=0,
                                    node_state_refresh=0.3, quarantine={
                **check(None), "enabled": True, "scheduler": "kubernetes", "dry_run": False,
                "max_fraction": 0.5, "kubernetes": {"api_server": k8s.url,
                                                    "token": k8s.token}})
            worker = DeliveryWorker(
                store, client=WandbClient(wb.url, wb.api_key, timeout=5), markers=None,
                links=GrafanaLinks(""), metrics=BridgeMetrics(), policy=policy,
                prometheus=PrometheusClient(prom.url))
            worker._next_refresh = float("inf")  # first: the verdict before any action
            # a history to read, not only the first scrape: three samples of every node
            wait_for(lambda: prom_query(prom.url, "count(count_over_time("
                                                  "wandb_infra_node_state[1m]) >= 3) == 4"),
                     what="three scrapes of the four nodes' state")
            store.ingest(parse_notification(json.dumps(notification([fault])).encode()),
                         time.time())

            def notes() -> str:
                return wb.run("team", "proj", "r1").notes.replace("\\", "")

            wait_for(lambda: worker.run_once() >= 0 and "**unsafe**" in notes(),
                     what="unsafe before quarantine")
            assert 'values: ["gpu-02"]' in notes()
            worker._next_refresh = 0.0
            wait_for(lambda: quarantine_pass(worker) >= 0 and worker.run_once() >= 0
                     and "**safe**" in notes()
                     and "Quarantine: quarantined gpu-02" in notes(),
                     what="safe after the bridge cordoned the node", timeout=40)
            assert "out of the pool (Ready,SchedulingDisabled,Tainted) from" in notes()
            # alerts name gpu-02 (domain stripped); the node patched is the API's full name
            assert [name for name, _ in k8s.patches] == ["gpu-02.cluster.local"]
            assert "cordoned node gpu-02.cluster.local" in notes()


class _Ksm:
    """A kube-state-metrics lookalike: the three node families, changeable at run time."""

    def __init__(self) -> None:
        self.unschedulable = 0
        self.taints: list[dict[str, str]] = []

    def text(self) -> str:
        out = ["# TYPE kube_node_spec_unschedulable gauge",
               f'kube_node_spec_unschedulable{{node="gpu-09.cluster.local"}} {self.unschedulable}',
               "# TYPE kube_node_spec_taint gauge"]
        out += [f'kube_node_spec_taint{{node="gpu-09.cluster.local",key="{t["key"]}",'
                f'value="{t["value"]}",effect="{t["effect"]}"}} 1' for t in self.taints]
        return "\n".join(out) + "\n"


def test_kube_state_metrics_in_real_prometheus(tmp_path):
    ksm = _Ksm()
    with scrape_target(ksm.text) as target, \
            prometheus(_scrape_config(target), tmp_path / "prom") as prom:
        store = Store(tmp_path / "b.sqlite")
        store.ingest(parse_notification(json.dumps(notification([alert(
            "GpuXidError", category="gpu_hardware", host="gpu-09", gpu="0", run="r1",
            start=datetime.now(UTC) - timedelta(seconds=20), extra={"xid": "119"})]
            )).encode()))
        facts = store.facts(RunKey("team", "proj", "r1"))
        history = NodeStateHistory(PrometheusClient(prom.url))

        def verdict() -> dict[str, Any]:
            return remediation_data(history, facts).get(
                "remediation", {})

        first = wait_for(lambda: (v := verdict()).get("verdict") == "unsafe" and v)
        assert first["hosts"][0]["state"] == "Ready"
        ksm.taints = [{"key": "nvsentinel/gpu-health", "value": "xid-79",
                       "effect": "NoSchedule"},
                      {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
        tainted = wait_for(lambda: (v := verdict()).get("verdict") == "safe" and v)
        assert tainted["hosts"][0]["state"] == "Ready,Tainted"
        assert tainted["hosts"][0]["reason"] == "taint nvsentinel/gpu-health=xid-79:NoSchedule"
