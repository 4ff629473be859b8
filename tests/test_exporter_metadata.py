"""Untrusted metadata is bounded in the real exporter process, fed by the W&B stand-in: one
run's config naming four 100,000-host Slurm node lists, a 10 kB display name, and more runs
than the source may report. Before: the exporter published every one of the 400,000 hosts and
grew to 710-765 MiB, past its 512 MiB limit; nothing said what a source sent too much of."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.exporter_process import metric_samples, metric_value, running_exporter
from harness.processes import wait_for
from harness.wandb_standin import WandbStandin
from tests.test_exporter_registrations import _exporter_pid
from tests.test_exporter_wandb import env, wire_config
from wandb_infra.common import labels

pytestmark = pytest.mark.integration


def test_hosts_per_run_runs_per_source_and_label_bytes_are_bounded(tmp_path):
    with WandbStandin() as wb:
        writers = [env(f"w{i}", job_nodelist=f"{c}[0-99999]")
                   for i, c in enumerate("abcd")]
        for i in range(4):
            wb.add_run("team", "llm", f"small{i}", config=wire_config(env(f"gpu{i:02d}")))
        wb.add_run("team", "llm", "huge", config=wire_config(*writers),
                   display_name="\U0001f600" * 2500)
        key = tmp_path / "key"
        key.write_text(wb.api_key + "\n")
        config = {"metadata": {"max_runs_per_source": 3},
                  "sources": {"wandb": {"enabled": True, "base_url": wb.url,
                                        "api_key_file": str(key), "projects": ["team/llm"],
                                        "interval_seconds": 2, "timeout_seconds": 20}}}
        with running_exporter(config, tmp_path / "exporter") as url:
            wait_for(lambda: metric_value(url, "wandb_infra_exporter_source_cut_total",
                                          source="wandb", what="hosts_per_run"), 120,
                     "the cut counted")
            nodes = metric_samples(url, labels.NODE_INFO)
            rss = _peak_rss_mib(_exporter_pid(tmp_path / "exporter"))
    per_run: dict[str, int] = {}
    for node in nodes:
        per_run[node["wandb_run_id"]] = per_run.get(node["wandb_run_id"], 0) + 1
    assert len(per_run) == 3 and per_run.get("huge") == 4096, per_run
    (name,) = {n["wandb_run_name"] for n in nodes if n["wandb_run_id"] == "huge"}
    assert len(name.encode()) <= 256 and name == "\U0001f600" * 64
    log = [json.loads(line) for line in (tmp_path / "exporter" / "exporter.log").read_text()
           .splitlines() if "cut to the exporter's bounds" in line]
    assert log and (log[0]["cut_runs_per_source"], log[0]["cut_label"]) == ("2", "4096")
    assert rss < 512, rss
    print(f"exporter peak RSS {rss:.0f} MiB, {len(nodes)} node series")


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")
