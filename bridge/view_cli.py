"""``wandb-infra-bridge view``: a saved W&B workspace view where a project's own metrics and the
bridge's ``infra/issue`` markers are drawn together.

The marker writer is a shared-mode writer: the backend assigns its history steps, so its rows
cannot sit on the trainer's step axis; they carry the wall time of each issue. This view plots
each of the user's metrics with ``infra/issue`` against wall time (``_timestamp``), where both
line up, and pins the issue columns in the runs table (the verdict, root cause, restart verdict,
GPU-hours lost, tags). Built with W&B's own ``wandb-workspaces`` library (the ``views`` extra).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from wandb_infra.bridge.config import load
from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.labels import NAME_CHARS

MISSING = ("the view needs W&B's wandb-workspaces library: pip install "
           "'wandb-infra-issues[views]'")
ISSUE_SERIES = "infra/issue"
PINNED = ("summary:infra/verdict", "summary:infra/root_cause", "summary:infra/restart_verdict",
          "summary:infra/gpu_hours_lost", "run:tags")


def build_workspace(entity: str, project: str, metrics: Sequence[str], name: str) -> Any:
    """The workspace: one section, a wall-time line plot per metric with ``infra/issue`` drawn
    on it, and the runs table's issue columns pinned."""
    import wandb_workspaces.reports.v2 as wr  # noqa: PLC0415 - optional extra
    import wandb_workspaces.workspaces as ws  # noqa: PLC0415 - optional extra

    panels: list[Any] = [wr.LinePlot(title=f"{m} and infrastructure issues", x="_timestamp",
                                     y=[m, ISSUE_SERIES], title_x="wall time")
                         for m in metrics]
    panels.append(wr.LinePlot(title="Infrastructure issues", x="_timestamp", y=[ISSUE_SERIES],
                              title_x="wall time"))
    return ws.Workspace(
        entity=entity, project=project, name=name,
        sections=[ws.Section(name="Training metrics and infrastructure issues", panels=panels)],
        runset_settings=ws.RunsetSettings(pinned_columns=list(PINNED)))


def _target(text: str) -> tuple[str, str]:
    parts = text.split("/")
    if len(parts) != 2 or not all(NAME_CHARS.fullmatch(p) for p in parts):
        raise ConfigError(f"expected ENTITY/PROJECT, got {text!r}")
    return parts[0], parts[1]


def _run(args: argparse.Namespace) -> int:
    try:
        entity, project = _target(args.target)
        metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
        if not metrics:
            raise ConfigError("--metrics names at least one of the runs' own metrics")
        cfg = load(args.config, insecure_no_auth=True)
        key = cfg.secrets.wandb_api_key
        if not key:
            raise ConfigError("no W&B key configured (wandb.api_key[_file])")
    except ConfigError as exc:
        print(f"wandb-infra-bridge view: {exc}", file=sys.stderr)
        return 2
    try:
        workspace = build_workspace(entity, project, metrics, args.name)
    except ImportError:
        print(f"wandb-infra-bridge view: {MISSING}", file=sys.stderr)
        return 2
    # wandb-workspaces talks through wandb.Api(), which reads these
    os.environ["WANDB_API_KEY"] = key
    os.environ["WANDB_BASE_URL"] = str(cfg.raw["wandb"]["base_url"])
    saved = workspace.save()
    print(saved.url)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``view`` on the bridge's command line."""
    p = sub.add_parser(
        "view", help="save a W&B view drawing the runs' metrics with the infra/issue markers",
        description="Save a workspace view in a W&B project: each metric named in --metrics "
                    "plotted with infra/issue against wall time (where the markers line up; "
                    "the marker writer's own step is not the trainer's), and the runs table's "
                    "infra columns pinned. Needs the 'views' extra (wandb-workspaces).")
    p.add_argument("target", metavar="ENTITY/PROJECT", help="the W&B project")
    p.add_argument("--metrics", required=True,
                   help="comma-separated metrics the runs log (e.g. loss,mfu,tokens_per_s)")
    p.add_argument("--name", default="Infrastructure issues", help="the view's name")
    p.add_argument("--config", metavar="FILE",
                   help="the bridge's YAML configuration (for wandb.base_url and the key)")
    p.set_defaults(func=_run)
