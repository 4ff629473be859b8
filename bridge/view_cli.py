"""``wandb-infra-bridge view``: a saved W&B workspace view where a project's own metrics and the
bridge's ``infra/issue`` markers are drawn together.

The marker writer is a shared-mode writer: the backend assigns its history steps, so its rows
cannot sit on the trainer's ``_step``; they carry the wall time of each issue and, where the run
logs one, its own step metric (``wandb.step_metrics``, projection/markers.py). This view plots
each of the user's metrics with ``infra/issue`` against wall time (``_timestamp``, the default)
or against that step metric (``--x``), and pins the issue columns in the runs table (the
verdict, root cause, restart verdict, GPU-hours lost, tags). Saving again updates the view of
the same name instead of adding another. It reads only the W&B key from the configuration.
Built with W&B's own ``wandb-workspaces`` library (the ``views`` extra).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from wandb_infra.bridge.config import load_with_key, project_arg
from wandb_infra.bridge.projection.wandb_client import WandbClient, WandbError
from wandb_infra.catalog.vocabulary import MARKER_ISSUE
from wandb_infra.common.configfile import ConfigError

MISSING = ("the view needs W&B's wandb-workspaces library: pip install "
           "'wandb-infra-issues[views]'")
ISSUE_SERIES = MARKER_ISSUE
PINNED = ("summary:infra/verdict", "summary:infra/root_cause", "summary:infra/restart_verdict",
          "summary:infra/gpu_hours_lost", "run:tags")


VIEWS = """
query BridgeSavedViews($project: String!, $entity: String!) {
  project(name: $project, entityName: $entity) {
    allViews(viewType: "project-view") { edges { node { id name displayName } } }
  }
}"""


def build_workspace(entity: str, project: str, metrics: Sequence[str], name: str,
                    x: str = "_timestamp") -> Any:
    """The workspace: one section, a line plot per metric with ``infra/issue`` drawn on it
    against ``x`` (wall time, or the runs' step metric), and the runs table's issue columns
    pinned."""
    import wandb_workspaces.reports.v2 as wr  # noqa: PLC0415 - optional extra
    import wandb_workspaces.workspaces as ws  # noqa: PLC0415 - optional extra

    title_x = "wall time" if x == "_timestamp" else x
    panels: list[Any] = [wr.LinePlot(title=f"{m} and infrastructure issues", x=x,
                                     y=[m, ISSUE_SERIES], title_x=title_x)
                         for m in metrics]
    panels.append(wr.LinePlot(title="Infrastructure issues", x=x, y=[ISSUE_SERIES],
                              title_x=title_x))
    return ws.Workspace(
        entity=entity, project=project, name=name,
        sections=[ws.Section(name="Training metrics and infrastructure issues", panels=panels)],
        runset_settings=ws.RunsetSettings(pinned_columns=list(PINNED)))


def saved_view(client: WandbClient, entity: str, project: str, name: str
               ) -> tuple[str, str] | None:
    """(id, internal name) of the project's saved view called ``name``, if there is one."""
    data = client._post(VIEWS, {"entity": entity, "project": project}, "BridgeSavedViews")
    edges = (((data.get("project") or {}).get("allViews") or {}).get("edges")) or []
    for edge in edges:
        node = (edge or {}).get("node") or {}
        if node.get("displayName") == name and node.get("id") and node.get("name"):
            return str(node["id"]), str(node["name"])
    return None



def _run(args: argparse.Namespace) -> int:
    entity, project = project_arg(args.target)
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    if not metrics:
        raise ConfigError("--metrics names at least one of the runs' own metrics")
    cfg, key = load_with_key(args.config)
    try:
        workspace = build_workspace(entity, project, metrics, args.name, args.x)
    except ImportError:
        print(f"wandb-infra-bridge view: {MISSING}", file=sys.stderr)
        return 2
    base_url = str(cfg.raw["wandb"]["base_url"])
    try:
        existing = saved_view(WandbClient(base_url, key, float(cfg.raw["wandb"][
            "timeout_seconds"])), entity, project, args.name)
    except WandbError as exc:
        print(f"wandb-infra-bridge view: cannot list the project's views: {exc}",
              file=sys.stderr)
        return 1
    if existing:  # save() updates the view it was loaded as
        workspace._internal_id, workspace._internal_name = existing
    # wandb-workspaces talks through wandb.Api(), which reads these
    os.environ["WANDB_API_KEY"] = key
    os.environ["WANDB_BASE_URL"] = base_url
    try:
        saved = workspace.save()
    except Exception as exc:  # wandb-workspaces raises its own errors and requests'
        why = f"{type(exc).__name__}: {exc}".replace(key, "<W&B key>").splitlines()[0][:300]
        print(f"wandb-infra-bridge view: cannot save the view: {why}", file=sys.stderr)
        return 1
    print(f"{'updated' if existing else 'saved'} view {args.name!r}: {saved.url}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``view`` on the bridge's command line."""
    p = sub.add_parser(
        "view", help="save a W&B view drawing the runs' metrics with the infra/issue markers",
        description="Save a workspace view in a W&B project: each metric named in --metrics "
                    "plotted with infra/issue against wall time or --x (where the markers line "
                    "up; the marker writer's own _step is not the trainer's), and the runs "
                    "table's infra columns pinned. Run again to update it. Needs the 'views' "
                    "extra (wandb-workspaces).")
    p.add_argument("target", metavar="ENTITY/PROJECT", help="the W&B project")
    p.add_argument("--metrics", required=True,
                   help="comma-separated metrics the runs log (e.g. loss,mfu,tokens_per_s)")
    p.add_argument("--name", default="Infrastructure issues",
                   help="the view's name (a view of that name is updated, not duplicated)")
    p.add_argument("--x", default="_timestamp", metavar="KEY",
                   help="the x axis: _timestamp (wall time, default) or the runs' own step "
                        "metric, which the markers carry (wandb.step_metrics)")
    p.add_argument("--config", metavar="FILE",
                   help="the bridge's YAML configuration (for wandb.base_url and the key)")
    p.set_defaults(func=_run)
