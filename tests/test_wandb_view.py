"""``wandb-infra-bridge view``: a saved W&B view, built with W&B's own wandb-workspaces library
and sent to the W&B stand-in, that draws the runs' metrics with the ``infra/issue`` markers on
wall time or the runs' step metric (the axes on which they line up) and pins the infra columns
in the runs table; it needs only the W&B key of the configuration, and saving again updates the
view instead of adding one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.wandb_standin import WandbStandin

pytestmark = pytest.mark.integration


def _view(tmp_path: Path, wb: WandbStandin, *args: str) -> subprocess.CompletedProcess:
    # as deploy/bridge.example.yaml: webhook and page token files this user cannot read
    cfg = {"wandb": {"base_url": wb.url, "api_key": wb.api_key},
           "auth": {"bearer_token_file": str(tmp_path / "absent" / "webhook-token"),
                    "pages_token_file": str(tmp_path / "absent" / "pages-token")}}
    (tmp_path / "bridge.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "HOME": str(tmp_path), "WANDB_SILENT": "true",
           "WANDB__GRAPHQL_RETRY_MAX": "1"}
    return subprocess.run([sys.executable, "-m", "wandb_infra.bridge.cli", "view", *args,
                           "--config", str(tmp_path / "bridge.yaml")],
                          env=env, capture_output=True, text=True, timeout=120, check=False)


def test_view_draws_the_runs_metrics_with_the_markers_on_wall_time(tmp_path):
    with WandbStandin() as wb:
        wb.add_run("team", "llm", "r1")
        done = _view(tmp_path, wb, "team/llm", "--metrics", "loss,mfu")
        assert done.returncode == 0, done.stderr
        (view,) = wb.views
    assert (view["entityName"], view["projectName"], view["type"]) == ("team", "llm",
                                                                       "project-view")
    spec = json.dumps(view["spec"])
    panels = [p for section in view["spec"]["section"]["panelBankConfig"]["sections"]
              for p in section["panels"]]
    plotted = {tuple(p["config"]["metrics"]): p["config"]["xAxis"] for p in panels}
    assert plotted == {("loss", "infra/issue"): "_timestamp", ("mfu", "infra/issue"): "_timestamp",
                       ("infra/issue",): "_timestamp"}
    for column in ("summary:infra/verdict", "summary:infra/restart_verdict",
                   "summary:infra/gpu_hours_lost", "run:tags"):
        assert column in spec, column


def test_view_refuses_bad_input_in_one_line(tmp_path):
    with WandbStandin() as wb:
        bad = _view(tmp_path, wb, "team", "--metrics", "loss")
        assert bad.returncode == 2
        assert bad.stderr.strip() == ("wandb-infra-bridge view: expected ENTITY/PROJECT, got "
                                      "'team'")
        none = _view(tmp_path, wb, "team/llm", "--metrics", " , ")
        assert none.returncode == 2 and "--metrics names at least one" in none.stderr
        assert wb.views == []


def test_view_run_again_updates_its_view_and_can_use_the_runs_step_metric(tmp_path):
    with WandbStandin() as wb:
        wb.add_run("team", "llm", "r1")
        first = _view(tmp_path, wb, "team/llm", "--metrics", "loss")
        assert first.returncode == 0, first.stderr
        assert first.stdout.startswith("saved view 'Infrastructure issues': ")
        again = _view(tmp_path, wb, "team/llm", "--metrics", "loss,mfu", "--x",
                      "trainer/global_step")
        assert again.returncode == 0, again.stderr
        assert again.stdout.startswith("updated view 'Infrastructure issues': ")
        other = _view(tmp_path, wb, "team/llm", "--metrics", "loss", "--name", "Mine")
        assert other.returncode == 0, other.stderr
        views = {v["displayName"]: v for v in wb.views}
    assert len(views) == 2 and set(views) == {"Infrastructure issues", "Mine"}
    panels = [p for section in views["Infrastructure issues"]["spec"]["section"][
        "panelBankConfig"]["sections"] for p in section["panels"]]
    assert {tuple(p["config"]["metrics"]): p["config"]["xAxis"] for p in panels} == {
        ("loss", "infra/issue"): "trainer/global_step",
        ("mfu", "infra/issue"): "trainer/global_step",
        ("infra/issue",): "trainer/global_step"}


def test_view_ends_in_one_clear_line_when_w_and_b_refuses_the_save(tmp_path):
    """Before: wandb-workspaces' error on saving ended the command in a traceback."""
    with WandbStandin() as wb:
        wb.add_run("team", "llm", "r1")
        wb.fail(500, times=None, operation="")  # the save (upsertView, no operation name)
        done = _view(tmp_path, wb, "team/llm", "--metrics", "loss")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("wandb-infra-bridge view:")]
    assert line.startswith("wandb-infra-bridge view: cannot save the view: ")
    assert wb.api_key not in done.stderr + done.stdout
