"""Two real Alertmanagers (an HA pair without clustering, so neither suppresses the other's
notifications) both send the same alerts to the bridge process, plus ``repeat_interval``
re-sends and both pairs' resolved notifications: one issue per alert in W&B, closed once. A
resolve forged through one Alertmanager's open API closes only the alert it names, and the other
Alertmanager's next re-send opens it again.

One alert reaches the two Alertmanagers with two ``startsAt`` values (an HA Prometheus pair
whose replicas each Alertmanager heard first in a different order); the resolve the replicas
send names the earlier one, and Alertmanager merges overlapping intervals to the earliest start
(github.com/prometheus/alertmanager, types/types.go ``Alert.Merge``), so both notify the
resolve with it: it closes both (before, the later one stayed open for good). A firing of the
same alert that starts after the resolve is a new firing.
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


def _alerts(start: datetime, ends: datetime | None = None, *, late: bool = False,
            runs: list[str] = RUNS) -> list[dict]:
    """What Prometheus sends to every Alertmanager: same labels, same startsAt (``late``: the
    other replica's startsAt of ha0's first alert, 15 s after the first replica's)."""
    out = []
    for run in runs:
        for k, name in enumerate(NAMES):
            item = {"labels": {"alertname": name, "severity": "critical",
                               "category": CATEGORY[name], "hostname": f"{run}n{k}",
                               "wandb_entity": "team", "wandb_project": "proj",
                               "wandb_run_id": run},
                    "annotations": {"summary": f"{name}.", "impact": "The run stops.",
                                    "remediation": "Drain the node."},
                    "startsAt": (start + timedelta(minutes=15 * k, seconds=15 * (
                        late and run == "ha0" and k == 0))).isoformat()}
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
                for am, late in ((am1, False), (am2, True)):
                    resp = requests.post(am.url + "/api/v2/alerts",
                                         json=_alerts(start, late=late), timeout=10)
                    assert resp.status_code == 200, resp.text
                # Both copies, then at least one repeat_interval re-send from each.
                wait_for(lambda: bridge.metrics().get("wandb_infra_bridge_alerts_received_total",
                                                      0) >= 4 * total, 40,
                         what="HA duplicates and repeats received")
                m = bridge.metrics()
                assert m["wandb_infra_bridge_alerts_stored_total"] == total + 1  # two startsAt
                assert m["wandb_infra_bridge_alerts_duplicate_total"] >= 3 * total - 2

                # A forged resolve of one alert through one Alertmanager's open API closes
                # that alert only; the other Alertmanager's next re-send reopens it.
                (forged,) = [a for a in _alerts(start, ends=datetime.now(UTC), runs=["ha1"])
                             if a["labels"]["alertname"] == "NodeDown"]
                assert requests.post(am1.url + "/api/v2/alerts", json=[forged], timeout=10).ok
                wait_for(lambda: bridge.metrics()["wandb_infra_bridge_alerts_resolved_total"]
                         >= 1, 30, what="the forged resolve stored")
                assert bridge.metrics()["wandb_infra_bridge_alerts_resolved_total"] == 1
                wait_for(lambda: bridge.runs()["ha1"]["firing"] == len(NAMES), 30,
                         what="the forged resolve undone by the other Alertmanager")

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
                assert m["wandb_infra_bridge_alerts_stored_total"] == total + 1
                assert m["wandb_infra_bridge_alerts_resolved_total"] == total + 2
                runs = bridge.runs()
                notes = {r: wb.run("team", "proj", r).notes for r in RUNS}
                # the same alert firing again after its resolve: a new firing, open
                again = _alerts(ended + timedelta(seconds=30), runs=["ha0"])[:1]
                assert requests.post(am1.url + "/api/v2/alerts", json=again, timeout=10).ok
                wait_for(lambda: bridge.runs()["ha0"]["open_issues"] == 1, 30,
                         what="a later startsAt after the resolve open")
        finally:
            assert bridge.stop() == 0
        # The three alerts of a run overlap: one incident, the XID its root cause.
        assert {r: (row["alerts"], row["issues"]) for r, row in runs.items()} == {
            r: (len(NAMES) + (r == "ha0"), 1) for r in RUNS}
        for run in RUNS:
            rec = wb.run("team", "proj", run)
            assert rec.tags == ["mine", *(f"infra:{n}" for n in NAMES)]
            assert notes[run].count(BEGIN) == 1
            assert section_blocks(notes[run]) == [f"GpuXidError on {run}n0"]
            assert notes[run].count("(resolved,") == 1
            for name in NAMES[1:]:
                assert notes[run].count(f"**{name}** ×1 on") == 1, notes[run]
        assert TOKEN not in bridge.log.read_text()
