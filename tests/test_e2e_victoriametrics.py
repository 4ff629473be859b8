"""The shipped rules on a scalable engine: VictoriaMetrics scraping the simulator and vmalert
evaluating the same rule file (Debian's ``victoria-metrics`` package), firing into the real
Alertmanager and the bridge: an XID on a two-host run reaches that run.
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


def test_an_xid_through_vmalert_reaches_the_run_in_the_bridge(tmp_path):
    """One smoke through the whole pipeline on this engine; the cascade's diagnosis is
    test_e2e's (the bridge is the same whichever engine raised the alerts)."""
    config = StackConfig(workdir=tmp_path, hosts=3, engine="victoriametrics", markers=False)
    with Stack(config) as stack:
        hosts = list(stack.cluster.hosts)[:2]
        run = scenarios.RunRef(scenarios.ENTITY, "llm-pretrain", "vmalert2")
        job = scenarios.start_job(stack, run, hosts, scenarios.GPUS)
        try:
            stack.cluster.inject("xid", hosts[1], gpu=3, code=94)

            def raised() -> dict | None:
                view = scenarios.run_view(stack, run)
                return view if view["issues"] else None

            [issue] = wait_for(raised, 120, f"an issue on {run.path} in the bridge", 1.0)["issues"]
        finally:
            job.stop(exit_code=1)
        root = issue["root_cause"]
        assert (root["alertname"], root["hostname"], root["gpu"]) == (
            "GpuContainedEccError", hosts[1], "3")
        # vmalert wrote the alert state and the records back, so post-mortem queries work as on
        # Prometheus.
        alerts = stack.query('ALERTS{alertname="GpuContainedEccError",alertstate="firing"}')
        assert {a["metric"]["wandb_run_id"] for a in alerts} == {run.run_id}
        assert stack.query("gpu_xid:dcgm_xid_errors:recent")
