"""``wandb-infra-bridge selftest --config bridge.yaml ENTITY/PROJECT``: the bridge's W&B writes,
tried on the W&B the configuration names (cloud or W&B Server) before it touches a real project.

It creates a scratch run as a trainer leaves one (tags, notes, config with the SDK's ``_wandb``
metric definitions, a summary, history rows with a step metric, state running), then lets the
bridge's own delivery worker (``projection/delivery.py``, the same code ``serve`` runs, with
this configuration's W&B and marker settings) project one GPU fault onto it: tags, notes and a
plot marker while the run is running, the summary once it has finished, and an end marker into
the finished run. It reads everything back and checks that the bridge's writes arrived, that
the user's tags, notes, config and summary are unchanged, that the run's state was never
changed by the writer, and that no history key is also a summary key. It prints one line per
check and deletes the scratch run unless ``--keep``. Exit status 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from wandb_infra.bridge.config import BridgeConfig, load_with_key, project_arg
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryWorker
from wandb_infra.bridge.projection.markers import RunAxis, SdkMarkerWriter
from wandb_infra.bridge.projection.notes import BEGIN, END
from wandb_infra.bridge.projection.wandb_client import WandbClient, WandbError
from wandb_infra.catalog.vocabulary import MARKER_ALERT, MARKER_ISSUE, MARKER_KEYS
from wandb_infra.common.runkey import RunKey

# What the scratch run holds before the bridge writes: the user's part, checked unchanged.
USER_TAGS = ["selftest", "baseline"]
USER_NOTES = "Scratch run of wandb-infra-bridge selftest.\n\nThe user's own notes: kept as is."
USER_SUMMARY = {"loss": 0.25, "best/accuracy": 0.9}
STEP_KEY = "trainer/global_step"
USER_CONFIG = {"lr": {"value": 0.0003, "desc": None},
               # what a trainer's SDK keeps there: its define_metric axes and telemetry
               "_wandb": {"value": {"m": [{"1": STEP_KEY, "6": [3]}], "cli_version": "0.19.9"}}}
ALERT = "GpuXidError"
STEP_EVERY = 10.0  # seconds between the scratch run's history rows
ROWS = 6

CREATE = """
mutation SelftestCreateRun($name: String!, $project: String!, $entity: String!,
                           $tags: [String!], $notes: String, $config: JSONString,
                           $summary: JSONString) {
  upsertBucket(input: {name: $name, modelName: $project, entityName: $entity, tags: $tags,
                       notes: $notes, config: $config, summaryMetrics: $summary,
                       state: "running"}) {
    bucket { id }
  }
}"""
READ = """
query SelftestRun($project: String!, $entity: String!, $name: String!, $specs: [JSONString!]!) {
  project(name: $project, entityName: $entity) {
    run(name: $name) { id state tags notes config summaryMetrics sampledHistory(specs: $specs) }
  }
}"""
DELETE = """
mutation SelftestDeleteRun($id: ID!) {
  deleteRun(input: {id: $id, deleteArtifacts: true}) { clientMutationId }
}"""


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    ok: bool
    detail: str


@dataclass
class Scratch:
    """The scratch run and what the checks compare against."""

    run: RunKey
    storage_id: str
    steps: list[tuple[float, int]]  # (timestamp, step metric) of the user's history rows
    onset: float


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


class Selftest:
    """The steps, each a method, against one W&B; ``checks`` collects the report."""

    def __init__(self, cfg: BridgeConfig, api_key: str, entity: str, project: str, *,
                 workdir: Path, clock: Callable[[], float] = time.time) -> None:
        wb = cfg.raw["wandb"]
        self.cfg = cfg
        self.base_url = str(wb["base_url"]).rstrip("/")
        self.api_key = api_key
        self.timeout = float(wb["timeout_seconds"])
        self.client = WandbClient(self.base_url, api_key, self.timeout)
        self.markers = bool(wb["markers"])
        self.entity, self.project = entity, project
        self.workdir = workdir
        self.clock = clock
        self.checks: list[Check] = []

    def check(self, name: str, ok: bool, detail: str, failed: str | None = None) -> bool:
        """Record one result (``failed``: the detail shown when it failed, if another)."""
        self.checks.append(Check(name, ok, detail if ok or failed is None else failed))
        return ok

    # --- the scratch run, as a trainer leaves it ---------------------------------------------

    def create(self) -> Scratch:
        """A new run with the user's tags, notes, config, summary and history."""
        name = "selftest-" + secrets.token_hex(4)
        data = self.client._post(CREATE, {
            "name": name, "project": self.project, "entity": self.entity, "tags": USER_TAGS,
            "notes": USER_NOTES, "config": json.dumps(USER_CONFIG),
            "summary": json.dumps(USER_SUMMARY)}, "SelftestCreateRun")
        storage_id = ((data.get("upsertBucket") or {}).get("bucket") or {}).get("id")
        if not storage_id:
            raise WandbError("upsertBucket returned no run")
        run = RunKey(self.entity, self.project, name)
        start = self.clock() - ROWS * STEP_EVERY
        steps = [(start + i * STEP_EVERY, 100 + 10 * i) for i in range(ROWS)]
        self._stream(run, {"wandb-history.jsonl": {"offset": 0, "content": [
            json.dumps({"loss": 1.0 / (i + 1), STEP_KEY: s, "_timestamp": at})
            for i, (at, s) in enumerate(steps)]}})
        self.check("create scratch run", True, run.path())
        return Scratch(run, storage_id, steps, onset=steps[2][0] + 5.0)

    def _stream(self, run: RunKey, body: dict[str, Any], complete: bool = False) -> None:
        """The SDK's ``file_stream`` call: history rows, or the run's end (exit code 0)."""
        payload: dict[str, Any] = {"files": body}
        if complete:
            payload.update(complete=True, exitcode=0)
        url = f"{self.base_url}/files/{run.entity}/{run.project}/{run.run_id}/file_stream"
        resp = requests.post(url, json=payload, auth=("api", self.api_key),
                             timeout=self.timeout)
        if resp.status_code != 200:
            raise WandbError(f"file_stream: HTTP {resp.status_code}: {resp.text[:200]}")

    def read(self, scratch: Scratch) -> dict[str, Any]:
        """The run as W&B holds it: state, tags, notes, config, summary and its history."""
        keys = ("_timestamp", STEP_KEY, *MARKER_KEYS)
        # one series per key: a sampled read returns only the rows holding all of its keys
        specs = [json.dumps({"keys": ["_step", k], "minStep": 0, "maxStep": 1 << 31,
                             "samples": 1000}) for k in keys]
        data = self.client._post(READ, {"project": scratch.run.project,
                                        "entity": scratch.run.entity,
                                        "name": scratch.run.run_id, "specs": specs},
                                 "SelftestRun")
        run = (data.get("project") or {}).get("run")
        if not run:
            raise WandbError(f"run {scratch.run.path()} not found")
        rows: dict[int, dict[str, Any]] = {}
        for series in run.get("sampledHistory") or []:
            for row in series if isinstance(series, list) else []:
                if isinstance(row, dict) and isinstance(row.get("_step"), int):
                    rows.setdefault(row["_step"], {}).update(row)
        history = [rows[step] for step in sorted(rows)]
        return {"state": run.get("state"), "tags": list(run.get("tags") or []),
                "notes": run.get("notes") or "", "config": _json(run.get("config")) or {},
                "summary": _json(run.get("summaryMetrics")) or {},
                "history": history}

    # --- the bridge's writes ---------------------------------------------------------------

    def worker(self) -> tuple[Store, DeliveryWorker]:
        """The delivery worker ``serve`` runs, with this configuration's W&B settings; no wait
        before markers or state checks (the scratch run needs no settling)."""
        store = Store(self.workdir / "bridge.sqlite")
        steps = list(dict.fromkeys(self.cfg.raw["wandb"]["step_metrics"]))
        markers = SdkMarkerWriter(self.base_url, self.api_key, self.workdir / "wandb-markers",
                                  axis=RunAxis(self.client, steps) if steps else None) \
            if self.markers else None
        policy = replace(self.cfg.policy, flush_interval=0.0, marker_settle=0.0,
                         state_check_interval=0.0, notify_critical=False, endings=None,
                         quarantine=None, confirm_alerts=False)
        grafana = self.cfg.raw["grafana"]
        worker = DeliveryWorker(store, client=self.client, markers=markers,
                                links=GrafanaLinks(str(grafana["base_url"] or "")),
                                metrics=BridgeMetrics(), policy=policy)
        return store, worker

    def notify(self, store: Store, scratch: Scratch, resolved: bool) -> None:
        """One Alertmanager notification for the scratch run, as the webhook stores it."""
        labels = {"alertname": ALERT, "severity": "critical", "category": "gpu_hardware",
                  "hostname": "selftest-node", "gpu": "0", "xid": "79",
                  "wandb_entity": scratch.run.entity, "wandb_project": scratch.run.project,
                  "wandb_run_id": scratch.run.run_id}
        def stamp(at: float) -> str:
            return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        alert = {"status": "resolved" if resolved else "firing", "labels": labels,
                 "annotations": {"summary": "selftest"}, "startsAt": stamp(scratch.onset),
                 "endsAt": stamp(scratch.onset + 30) if resolved else "0001-01-01T00:00:00Z",
                 "generatorURL": "", "fingerprint": "5e1f7e5700000001"}
        body = {"version": "4", "status": alert["status"], "receiver": "wandb.bridge",
                "groupKey": "selftest", "truncatedAlerts": 0, "groupLabels": {},
                "commonLabels": {}, "commonAnnotations": {}, "externalURL": "", "alerts": [alert]}
        store.ingest(parse_notification(json.dumps(body).encode()))

    # --- the run ------------------------------------------------------------------------------

    def run(self, keep: bool) -> list[Check]:
        """Every step; a W&B error ends the test with a failed check naming it."""
        scratch: Scratch | None = None
        try:
            scratch = self.create()
            store, worker = self.worker()
            self.notify(store, scratch, resolved=False)
            worker.run_once()
            self.while_running(scratch, self.read(scratch))
            self._stream(scratch.run, {}, complete=True)
            self.wait_state(scratch, "finished")
            self.notify(store, scratch, resolved=True)
            worker.run_once()
            self.once_finished(scratch, self.read(scratch))
        except WandbError as exc:
            self.check("W&B call", False, str(exc))
        finally:
            if scratch is not None:
                self.cleanup(scratch, keep)
        return self.checks

    def wait_state(self, scratch: Scratch, state: str, timeout: float = 30.0) -> None:
        """The trainer's end takes effect on the server (asynchronously on some)."""
        deadline = time.monotonic() + timeout
        while self.read(scratch)["state"] != state and time.monotonic() < deadline:
            time.sleep(1.0)

    def while_running(self, scratch: Scratch, got: dict[str, Any]) -> None:
        """Tags, notes and the start marker arrived; the user's part and the state did not
        change."""
        ours, tags = f"infra:{ALERT}", got["tags"]
        self.check("tags written", ours in tags, f"{ours} in {tags}",
                   f"{ours} missing: W&B holds {tags}")
        self.check("user's tags kept", tags[:len(USER_TAGS)] == USER_TAGS, f"{USER_TAGS} first",
                   f"expected {USER_TAGS} first, W&B holds {tags}")
        self.check("notes written", BEGIN in got["notes"] and END in got["notes"],
                   "issue section present", "the issue section is missing from the notes")
        self.check("user's notes kept", got["notes"].startswith(USER_NOTES),
                   "unchanged, before the section", "the user's notes were changed")
        if self.markers:
            self.marker(scratch, got["history"], start=True)
        self.check("config untouched", got["config"] == USER_CONFIG, "equal to the trainer's",
                   f"changed: {json.dumps(got['config'])[:200]}")
        self.check("state untouched (running)", got["state"] == "running",
                   f"W&B shows {got['state']}")

    def marker(self, scratch: Scratch, history: list[dict[str, Any]], start: bool) -> None:
        """The start (or end) row at its time, carrying the run's step metric."""
        value = 1 if start else 0
        rows = [r for r in history if r.get(MARKER_ISSUE) == value]
        name = "marker written" if start else "end marker written into the finished run"
        if not rows:
            self.check(name, False, f"no {MARKER_ISSUE}={value} row in the run's history")
            return
        row = rows[-1]
        self.check(name, row.get(MARKER_ALERT) == ALERT,
                   f"{MARKER_ISSUE}={value} at step {row.get('_step')}",
                   f"row without {MARKER_ALERT}={ALERT}: {row}")
        if start:
            expected = max(s for at, s in scratch.steps if at <= scratch.onset)
            placed = row.get(STEP_KEY) == expected and \
                abs(float(row.get("_timestamp", 0)) - scratch.onset) < 0.01
            self.check("marker on the run's step axis", placed, f"{STEP_KEY}={expected} at the "
                       f"onset", f"expected {STEP_KEY}={expected} and _timestamp="
                       f"{scratch.onset}, W&B holds {row}")

    def once_finished(self, scratch: Scratch, got: dict[str, Any]) -> None:
        """The summary entries arrived beside the user's; the end marker went into the
        finished run without reviving it; no history key is a summary key."""
        summary = got["summary"]
        self.check("summary written", "infra/root_cause" in summary,
                   str(summary.get("infra/root_cause")), "no infra/root_cause in the summary")
        mine = {k: summary.get(k) for k in USER_SUMMARY}
        self.check("user's summary kept", mine == USER_SUMMARY, "unchanged", f"W&B holds {mine}")
        if self.markers:
            self.marker(scratch, got["history"], start=False)
        self.check("state untouched (finished)", got["state"] == "finished", "W&B shows "
                   "finished", f"W&B shows {got['state']}: the writer changed the run's state")
        shared = {k for row in got["history"] for k in row if k in MARKER_KEYS} & set(summary)
        self.check("history and summary keys apart", not shared, "no shared name",
                   f"both: {sorted(shared)}")
        self.check("config untouched after the end", got["config"] == USER_CONFIG,
                   "equal to the trainer's", f"changed: {json.dumps(got['config'])[:200]}")

    def cleanup(self, scratch: Scratch, keep: bool) -> None:
        """Delete the scratch run unless asked to keep it."""
        if keep:
            self.check("scratch run kept", True, f"{self.base_url} {scratch.run.path()}")
            return
        try:
            self.client._post(DELETE, {"id": scratch.storage_id}, "SelftestDeleteRun")
        except WandbError as exc:
            self.check("scratch run deleted", False, f"{scratch.run.path()}: {exc}")
        else:
            self.check("scratch run deleted", True, scratch.run.path())


def table(checks: list[Check]) -> str:
    """The report: one line per check."""
    width = max(len(c.name) for c in checks)
    lines = [f"{'check':<{width}}  result  detail"]
    lines += [f"{c.name:<{width}}  {'pass' if c.ok else 'FAIL':<6}  {c.detail}" for c in checks]
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    entity, project = project_arg(args.project)
    cfg, key = load_with_key(args.config)
    with tempfile.TemporaryDirectory(prefix="wandb-infra-selftest-") as workdir:
        checks = Selftest(cfg, key, entity, project, workdir=Path(workdir)).run(keep=args.keep)
    print(table(checks))
    failed = [c.name for c in checks if not c.ok]
    if failed:
        print(f"selftest FAILED ({len(failed)} of {len(checks)} checks): "
              f"{', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"selftest passed: {len(checks)} checks against {cfg.raw['wandb']['base_url']}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``selftest``."""
    p = sub.add_parser(
        "selftest", help="try the bridge's W&B writes on a scratch run of your W&B",
        description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("project", metavar="ENTITY/PROJECT",
                   help="where the scratch run is created (the bridge's W&B key must be "
                        "allowed to create and delete runs there)")
    p.add_argument("--config", metavar="FILE", help="the bridge's YAML configuration")
    p.add_argument("--keep", action="store_true", help="keep the scratch run to look at it")
    p.set_defaults(func=_run)
