"""The ended-run verdict on the pages: a run without alerts has a verdict page (not the empty
state), ``/runs?verdict=`` lists judged runs with or without alerts, and a bad filter is 400."""

from __future__ import annotations

from datetime import UTC, datetime

import requests

from harness.bridge_payloads import make_context, serve
from tests.pages_helpers import AUTH, HTML
from wandb_infra.bridge.diagnosis.coverage import DCGM, NODE, judge
from wandb_infra.bridge.diagnosis.outcome import judge as verdict
from wandb_infra.bridge.diagnosis.root_cause import diagnose
from wandb_infra.common.runkey import RunKey

START = datetime(2026, 11, 29, 10, 2, tzinfo=UTC).timestamp()
END = START + 600
HOSTS = ["gpu-node-011", "gpu-node-012"]


def _record(store, run: RunKey, blind_host: str | None) -> None:
    grid = [START + 60 * k for k in range(11)]
    targets = {(h, e): grid for h in HOSTS for e in (DCGM, NODE) if (h, e) != (blind_host, DCGM)}
    cov = judge(HOSTS, {h: ["0"] for h in HOSTS}, start=START, end=END, step=60,
                targets=targets, present={(h, "0"): grid for h in HOSTS})
    out = verdict(diagnose([]), cov, END, "join series gone")
    store.add_endings([(run, END, "join series gone")], END)
    store.record_outcome(run, out.verdict, out.dumps(), END, deliver=False)


def test_verdict_pages_and_filter(tmp_path):
    ctx = make_context(tmp_path)
    clean, blind = RunKey("team", "proj", "clean1"), RunKey("team", "proj", "blind1")
    _record(ctx.store, clean, None)
    _record(ctx.store, blind, "gpu-node-012")
    with serve(ctx) as running:
        page = requests.get(f"{running.url}/runs/team/proj/clean1", headers=HTML, timeout=10)
        data = requests.get(f"{running.url}/runs/team/proj/blind1?format=json", headers=AUTH,
                            timeout=10).json()
        listed = requests.get(f"{running.url}/runs?verdict=incomplete&format=json",
                              headers=AUTH, timeout=10).json()
        html_list = requests.get(f"{running.url}/runs?verdict=clear", headers=HTML, timeout=10)
        bad = requests.get(f"{running.url}/runs?verdict=fine", headers=AUTH, timeout=10)
    assert page.status_code == 200 and "Verdict:" in page.text and ">clear<" in page.text
    assert "likely an application problem" in page.text and "No verdict yet" not in page.text
    assert data["verdict"]["verdict"] == "incomplete" and data["issues"] == []
    assert "no GPU telemetry from gpu-node-012" in data["verdict"]["text"]
    assert [r["run_id"] for r in listed["runs"]] == ["blind1"]
    assert "clean1" in html_list.text and "blind1" not in html_list.text
    assert bad.status_code == 400
