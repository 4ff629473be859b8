"""``wandb-infra-bridge explain``: the command-line edge of ``bridge.explain``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

from wandb_infra.bridge.config import load
from wandb_infra.bridge.diagnosis.impact import Impact
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.outcome import Outcome
from wandb_infra.bridge.diagnosis.outcome import judge as judge_outcome
from wandb_infra.bridge.ingest.store import StoreError, StoreLocked
from wandb_infra.bridge.joblog.report import explain_logs
from wandb_infra.bridge.joblog.sources import FileSource
from wandb_infra.bridge.joblog.sources import read as read_logs
from wandb_infra.bridge.prometheus.client import PrometheusClient, PrometheusError
from wandb_infra.bridge.prometheus.confirm import Confirmation
from wandb_infra.bridge.prometheus.endings import EndingsPolicy, RunEndings
from wandb_infra.bridge.prometheus.history import (
    Explanation,
    as_facts,
    as_notification,
    explain,
    parse_run,
    parse_when,
)
from wandb_infra.bridge.prometheus.impact_reader import ImpactHistory
from wandb_infra.bridge.prometheus.remediation import NodeStateHistory
from wandb_infra.bridge.runs.service import RunService
from wandb_infra.bridge.runs.text import render_text
from wandb_infra.bridge.runs.view import RunView
from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.logsetup import setup_logging


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``explain`` subcommand."""
    p = sub.add_parser(
        "explain", help="post-mortem: rebuild a run's issues from Prometheus history",
        description="Read the run's hosts and GPUs from the join metrics and the ALERTS series "
                    "over its lifetime (range queries), run the bridge's diagnosis and print the "
                    "timeline with the root cause. --post writes the result to the run in W&B "
                    "through the bridge's own store and delivery path.")
    p.add_argument("run", metavar="ENTITY/PROJECT/RUN_ID", nargs="?",
                   help="the W&B run to explain (optional with --log)")
    p.add_argument("--prometheus", metavar="URL",
                   help="Prometheus base URL holding the rules' ALERTS and the join metrics "
                        "(needed with a run)")
    p.add_argument("--log", action="append", metavar="FILE",
                   help="the job's console log (repeatable): its first meaningful error, rank, "
                        "host and GPU; without a run it needs no Prometheus and no W&B")
    p.add_argument("--start", help="window start: RFC 3339, unix seconds or e.g. 2d (ago); "
                                   "default: 10 minutes before the run was first seen")
    p.add_argument("--end", help="window end (same forms); default: 10 minutes after the run "
                                 "was last seen, or now")
    p.add_argument("--lookback", default="7d",
                   help="how far back to look for the run when --start is not given (default 7d)")
    p.add_argument("--step", type=float, default=15.0,
                   help="finest range-query step in seconds; use your rule evaluation interval "
                        "(default 15)")
    p.add_argument("--grafana-url", default="", help="Grafana base URL for deep links")
    p.add_argument("--json", action="store_true", help="print the run view as JSON")
    p.add_argument("--post", action="store_true",
                   help="also write the issues to the run in W&B (needs --config with a W&B key)")
    p.add_argument("--config", metavar="FILE",
                   help="bridge YAML configuration (W&B key, store, Grafana) for --post")
    p.add_argument("--grace", type=float, default=EndingsPolicy().grace,
                   help="seconds without join series before a run counts as ended and gets a "
                        "verdict (default: the bridge's endings.grace, "
                        f"{EndingsPolicy().grace:.0f})")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds --post waits for the W&B write (default 120)")
    p.set_defaults(func=run)


def _post(found: Explanation, args: argparse.Namespace, outcome: Outcome | None) -> str:
    """Deliver through the bridge's store and worker; returns the delivery state. A run still
    running (``outcome`` None) gets its issues and no verdict."""
    from wandb_infra.bridge.service import build  # noqa: PLC0415 - only --post needs the whole bridge

    cfg = load(args.config, insecure_no_auth=True)
    if not cfg.secrets.wandb_api_key:
        raise ConfigError("--post needs a W&B API key (wandb.api_key_file in --config, or "
                          "WANDB_INFRA_BRIDGE__WANDB__API_KEY)")
    setup_logging(str(cfg.raw["log_level"]), cfg.secrets.all())
    bridge = build(cfg)
    ctx = bridge.ctx
    ctx.store.ingest(as_notification(found.alerts))
    if outcome is not None:  # the same verdict the live bridge gives an ended run
        ctx.store.add_endings([(found.run, outcome.ended_at, outcome.how)], time.time())
        ctx.store.record_outcome(found.run, outcome.verdict, outcome.dumps(), time.time(),
                                 deliver=True)
    deadline = time.monotonic() + args.timeout
    while True:
        bridge.worker.run_once()
        row = ctx.store.outbox(found.run)
        if row is None or row.parked or row.delivered_seq >= row.dirty_seq:
            break
        if time.monotonic() > deadline:
            return "pending (the bridge will keep retrying from its store)"
        time.sleep(1.0)
    ctx.store.close()
    return f"parked: {row.parked}" if row is not None and row.parked else "delivered"


def explained(view: RunView, *, impacts: Mapping[str, Impact] | None, outcome: Outcome | None,
              now: float) -> RunView:
    """The run view (the one the bridge's pages and W&B notes render) with the impacts explain
    measured and the verdict it judged."""
    if impacts is not None:
        view = RunService.with_impacts(view, impacts, now)
    return replace(view, outcome=outcome)


def view_json(view: RunView, links: GrafanaLinks) -> dict[str, Any]:
    """What ``explain --json`` prints: the view's JSON, with ``verdict`` null while running."""
    return view.as_dict(links.for_run(view.run)) | {
        "verdict": None if view.outcome is None else view.outcome.as_dict()}


def run(args: argparse.Namespace) -> int:
    """Explain one run; exit 2 on bad input, 1 when Prometheus or W&B fails."""
    if args.run is None or not args.prometheus:
        if args.run is None and args.log:
            return explain_logs(args.log, args.json)
        print("wandb-infra-bridge explain: give ENTITY/PROJECT/RUN_ID with --prometheus, or "
              "--log FILE", file=sys.stderr)
        return 2
    prom = PrometheusClient(args.prometheus, timeout=30.0)  # one session for every read below
    outcome: Outcome | None = None
    try:
        target = parse_run(args.run)
        now = time.time()
        start, end = parse_when(args.start, now), parse_when(args.end, now)
        lookback = parse_when(args.lookback, now)
        found = explain(prom, target, start, end,
                        lookback=timedelta(seconds=now - (lookback or now)), min_step=args.step)
        # The same run service as the bridge's, on facts Prometheus' ALERTS history gave (so
        # every one of them is an alert Prometheus raised) and with nothing stored.
        service = RunService(None, history=NodeStateHistory(prom), wandb_enabled=False)
        run_view = service.assemble(target, Confirmation(tuple(as_facts(found.alerts)), (), ()))
        impacts = ImpactHistory(prom, min_step=args.step).for_diagnosis(
            target, run_view.diagnosis)
        # the verdict of an ended run, from the same coverage reading as the bridge's; still
        # publishing its join series within the grace: the live bridge would not judge it
        endings = RunEndings(prom, EndingsPolicy(step=args.step, grace=max(1.0, args.grace)))
        running = bool(endings.present([target], now))
        if not running:
            coverage = endings.coverage(found.placement)
            outcome = judge_outcome(run_view.diagnosis, coverage, found.placement.last_seen,
                                    "explain")
    except ValueError as exc:  # bad input: exit 2
        raise ConfigError(str(exc)) from exc
    except PrometheusError as exc:
        print(f"wandb-infra-bridge explain: {exc}", file=sys.stderr)
        return 1
    if args.log:  # the job's own log, rendered by the view like the bridge's stored reading
        run_view = replace(run_view, job_log=read_logs([FileSource(p) for p in args.log]))
    links = GrafanaLinks(args.grafana_url)
    shown = explained(run_view, impacts=impacts, outcome=outcome, now=now)
    view = view_json(shown, links)
    view["placement"] = {"hosts": sorted(found.placement.hosts),
                         "gpus": {h: sorted(g) for h, g in sorted(found.placement.gpus.items())}}
    if running:
        view["running"] = (f"its join series were published within the last {args.grace:.0f} s"
                           ": it is still running (or only just ended), so no ended-run "
                           "verdict yet")
    if args.post:
        try:
            view["wandb"] = {"state": _post(found, args, outcome)}
        except (StoreLocked, StoreError, OSError) as exc:  # e.g. a running bridge holds it
            print(f"wandb-infra-bridge explain: cannot post through the bridge's store: {exc}",
                  file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(view, indent=2))
    else:
        hosts = len(found.placement.hosts)
        print(f"{target.path()} ran on {hosts} host(s); {len(found.alerts)} alert period(s) "
              f"between {found.alerts[0].starts_at.isoformat() if found.alerts else '-'} and "
              f"the end of the window")
        if outcome is None:
            print(f"Verdict: none yet: {view['running']}")
        else:
            print(f"Verdict: {outcome.verdict}: {outcome.text}")
            print(f"  {outcome.coverage_line}")
        print(render_text(shown, links.for_run(target)))
        if shown.job_log_joined is not None:
            print(f"Job log: {shown.job_log_joined.statement}")
        if args.post:
            print(f"W&B: {view['wandb']['state']}")
    return 0
