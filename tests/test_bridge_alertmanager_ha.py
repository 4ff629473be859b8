"""Two real Alertmanagers (an HA pair without clustering, so neither suppresses the other's
notifications) both send the same alerts to the bridge process, plus ``repeat_interval``
re-sends and both pairs' resolved notifications: one issue per alert in W&B, closed once.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests

from harness.bridge_payloads import TOKEN
from harness.bridge_process import bridge_env, section_blocks, start_bridge
from harness.processes import alertmanager, wait_for
from harness.wandb_standin import WandbStandin
from wandb_infra.bridge.projection.notes import BEGIN

pytestmark = pytest.mark.integration

RUNS = [f"ha{i}" for i in range(8)]
NAMES = ("GpuXidError", "NodeDown", "InfinibandLinkDown")
CATEGORY = {"GpuXidError": "gpu_hardware", "NodeDown": "node", "InfinibandLinkDown": "network"}


def _am_config(port: int, token_file: Path) -> str:
    return f"""
route:
  receiver: bridge
  group_by: [alertname, wandb_run_id]
  group_wait: 500ms
  group_interval: 1s
  repeat_interval: 2s
receivers:
  - name: bridge
    webhook_configs:
      - url: http://127.0.0.1:{port}/alertmanager
        send_resolved: true
        http_config:
          authorization: {{type: Bearer, credentials_file: {token_file}}}
"""


def _alerts(start: datetime, ends: datetime | None = None) -> list[dict]:
    """What Prometheus sends to every Alertmanager: same labels, same startsAt."""
    out = []
    for run in RUNS:
        for k, name in enumerate(NAMES):
            item = {"labels": {"alertname": name, "severity": "critical",
                               "category": CATEGORY[name], "hostname": f"{run}n{k}",
                               "wandb_entity": "team", "wandb_project": "proj",
                               "wandb_run_id": run},
                    "annotations": {"summary": f"{name}.", "impact": "The run stops.",
                                    "remediation": "Drain the node."},
                    "startsAt": (start + timedelta(minutes=15 * k)).isoformat()}
            if ends is not None:
                item["endsAt"] = ends.isoformat()
            out.append(item)
    return out


def test_ha_pair_and_repeats_give_one_issue_each(tmp_path: Path):
    total = len(RUNS) * len(NAMES)
    with WandbStandin() as wb:
        for run in RUNS:
            wb.add_run("team", "proj", run, tags=["mine"])
        bridge = start_bridge(tmp_path, bridge_env(tmp_path, wandb_url=wb.url,
                                                   wandb_key=wb.api_key))
        config = _am_config(bridge.port, tmp_path / "token")
        try:
            with alertmanager(config, tmp_path / "am1") as am1, \
                    alertmanager(config, tmp_path / "am2") as am2:
                start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
                for am in (am1, am2):
                    resp = requests.post(am.url + "/api/v2/alerts", json=_alerts(start),
                                         timeout=10)
                    assert resp.status_code == 200, resp.text
                # Both copies, then at least one repeat_interval re-send from each.
                wait_for(lambda: bridge.metrics().get("wandb_infra_bridge_alerts_received_total",
                                                      0) >= 4 * total, 40,
                         what="HA duplicates and repeats received")
                m = bridge.metrics()
                assert m["wandb_infra_bridge_alerts_stored_total"] == total
                assert m["wandb_infra_bridge_alerts_duplicate_total"] >= 3 * total

                ended = datetime.now(UTC) - timedelta(seconds=1)
                for am in (am1, am2):
                    resp = requests.post(am.url + "/api/v2/alerts",
                                         json=_alerts(start, ends=ended), timeout=10)
                    assert resp.status_code == 200, resp.text
                wait_for(lambda: all(r["open_issues"] == 0 for r in bridge.runs().values()),
                         40, what="every issue closed")
                wait_for(lambda: bridge.metrics()["wandb_infra_bridge_queue_runs"] == 0
                         and all("open," not in wb.run("team", "proj", r).notes for r in RUNS),
                         30, what="resolutions delivered")
                m = bridge.metrics()
                assert m["wandb_infra_bridge_alerts_stored_total"] == total
                assert m["wandb_infra_bridge_alerts_resolved_total"] == total
            runs = bridge.runs()
        finally:
            assert bridge.stop() == 0
        # The three alerts of a run overlap: one incident, the XID its root cause.
        assert {r: (row["alerts"], row["issues"]) for r, row in runs.items()} == {
            r: (len(NAMES), 1) for r in RUNS}
        for run in RUNS:
            rec = wb.run("team", "proj", run)
            assert rec.tags == ["mine", *(f"infra:{n}" for n in NAMES)]
            assert rec.notes.count(BEGIN) == 1
            assert section_blocks(rec.notes) == [f"GpuXidError on {run}n0"]
            assert rec.notes.count("(resolved,") == 1
            for name in NAMES[1:]:
                assert rec.notes.count(f"**{name}** ×1 on") == 1, rec.notes
        assert TOKEN not in bridge.log.read_text()
