"""The shipped rules on a scalable engine: VictoriaMetrics scraping the simulator and vmalert
evaluating the same rule file (Debian's ``victoria-metrics`` package), firing into the real
Alertmanager and the bridge on the demo's XID scenario (a smaller run than test_e2e's: 8 hosts).
"""

from __future__ import annotations

import subprocess

import pytest

from demo import scenarios
from demo.stack import ROOT, Stack, StackConfig
from harness.processes import VMALERT, wait_for
from wandb_infra.alert_rules.generate import RULES_FILE

pytestmark = pytest.mark.e2e


def test_vmalert_accepts_every_rule_and_template():
    proc = subprocess.run([VMALERT, "-dryRun", "-rule.validateTemplates",
                           f"-rule={ROOT / 'alert_rules' / RULES_FILE}"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_xid_cascade_through_vmalert_reaches_the_bridge(tmp_path):
    config = StackConfig(workdir=tmp_path, hosts=10, engine="victoriametrics", markers=False)
    with Stack(config) as stack:
        hosts = list(stack.cluster.hosts)[:8]
        run, view = scenarios.xid94_cascade(stack, hosts, faulty=2)
        [issue] = view["issues"]
        root = issue["root_cause"]
        assert (root["alertname"], root["hostname"], root["gpu"]) == (
            "GpuContainedEccError", hosts[2], "3")
        stalled = {c["hostname"] for c in issue["consequences"]
                   if c["alertname"] == "TrainingStalled"}
        assert stalled == set(hosts)
        # vmalert wrote the alert state back, so post-mortem queries work as on Prometheus.
        alerts = stack.query('ALERTS{alertname="GpuContainedEccError",alertstate="firing"}')
        assert {a["metric"]["wandb_run_id"] for a in alerts} == {run.run_id}
        wait_for(lambda: stack.query("gpu_xid:dcgm_xid_errors:recent"), 30,
                 "the XID record written back by vmalert")
