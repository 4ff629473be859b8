"""A minimal W&B GraphQL client over ``requests``: find a run, write only the fields we own.

Never ``run.update()`` (a read-modify-write of config, tags, notes and summary that can overwrite
what the live trainer wrote): each write is one ``upsertBucket`` naming only the fields the bridge
changes. Errors are classified so the delivery worker can retry what may succeed later
(``TransientError``, with ``Retry-After`` when the server sent one) and park what never will
(``PermanentError``). It also reads a run's history (``_step``, ``_timestamp``) to say at
which of the run's steps an issue began, and the throughput or MFU the run logs itself around
each issue's onset, so the impact line can name the run's own slowdown.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import requests

from wandb_infra.bridge.diagnosis.impact import RunMetric
from wandb_infra.catalog.vocabulary import MARKER_ISSUE
from wandb_infra.common.logsetup import log_fields

log = logging.getLogger(__name__)

USER_AGENT = "wandb-infra-bridge/0.1"
PERMANENT_STATUSES = frozenset({400, 401, 403, 404, 405, 409, 410, 413, 422, 501})
# A GraphQL error that asks to be retried (W&B answers some overloads with HTTP 200 and one).
RETRY_WORDS = re.compile(r"(?i)\b(retry|try again|temporar\w*|timed? ?out|unavailable|"
                         r"overloaded|rate.?limit\w*)\b")
# What a parked run shows in /runs when W&B refused the credentials.
AUTH_HINTS = {401: "W&B rejected the API key (wrong, revoked or for another server): "
                   "check wandb.api_key and wandb.base_url",
              403: "the W&B API key may not write to this project"}
# The SDK's offline key check (wandb 0.31, wandb/sdk/lib/wbauth/validation.py,
# ``check_api_key``): a JWT, or an optional ``prefix-`` then
# at least 40 of ``[\w-]``; W&B answers every other key with 401.
_JWT = re.compile(r"[^.\s]+\.[^.\s]+\.[^.\s]+")
_KEY = re.compile(r"(?:[A-Za-z0-9_]+-)?[\w-]{40,}")

VIEWER = "query BridgeViewer { viewer { id entity } }"

RUN_QUERY = """
query BridgeRun($project: String!, $entity: String!, $name: String!) {
  project(name: $project, entityName: $entity) {
    run(name: $name) { id name state tags notes summaryMetrics historyKeys }
  }
}"""

UPSERT = """
mutation BridgeUpsertBucket($id: String!, $tags: [String!], $notes: String,
                            $summaryMetrics: JSONString) {
  upsertBucket(input: {id: $id, tags: $tags, notes: $notes, summaryMetrics: $summaryMetrics}) {
    bucket { id }
  }
}"""

# The run's history, read the way the wandb SDK's public API reads it: the last step from
# ``historyKeys`` (in RUN_QUERY; wandb/apis/public/runs.py, ``Run.lastHistoryStep``) and
# ``sampledHistory`` with one JSON spec per series, ``{"keys", "minStep", "maxStep", "samples"}``,
# answered with one list of rows per spec, each row holding the requested keys (wandb/wandb,
# wandb/apis/public/history.py, ``SampledHistoryScan``, commit
# 05d7f97c32279058f0fdafd02e9723a5bd13b3be).
SAMPLED_HISTORY = """
query BridgeSampledHistory($project: String!, $entity: String!, $name: String!,
                           $specs: [JSONString!]!) {
  project(name: $project, entityName: $entity) {
    run(name: $name) { sampledHistory(specs: $specs) }
  }
}"""

# Every row the bridge's own marker writer appends carries this key (projection/plan.py); those
# rows are stamped with the issue's onset, so they are left out when finding the run's step.
MARKER_KEY = MARKER_ISSUE
STEP_SAMPLES = 1000  # rows per sampled read; a step range with fewer rows comes back whole
STEP_READS = 4  # sampled reads per onset, each narrowing the step range around it
# The run's last step before the onset says where the issue began only if it was logged shortly
# before it; a run that logged nothing for longer gets no step.
STEP_NEAR = 600.0
STEP_RETRY = 60.0  # an onset whose step is not settled yet is looked up again after this
STEP_CACHE = 4096  # onsets remembered (oldest dropped first)
# What the impact line names when the run logs it (bridge config ``wandb.run_metrics``): the
# first of these keys the run's history holds, each a rate where higher is better.
RUN_METRICS = ("mfu", "throughput", "tokens_per_s", "samples_per_s")
# The run's own step counter (bridge config ``wandb.step_metrics``), as PyTorch Lightning
# (``trainer/global_step``), Hugging Face's Trainer (``train/global_step``) and hand-written
# loops log it: marker rows carry its value (projection/markers.py, ``RunAxis``).
STEP_METRICS = ("trainer/global_step", "train/global_step", "global_step", "step")

NOTIFY = """
mutation NotifyScriptableRunAlert($entityName: String!, $projectName: String!, $runName: String!,
    $title: String!, $text: String!, $severity: AlertSeverity = INFO, $waitDuration: Duration) {
  notifyScriptableRunAlert(input: {entityName: $entityName, projectName: $projectName,
      runName: $runName, title: $title, text: $text, severity: $severity,
      waitDuration: $waitDuration}) { success }
}"""


class WandbError(RuntimeError):
    """A failed W&B call."""


class TransientError(WandbError):
    """Worth retrying later (5xx, 429, timeout, connection refused)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentError(WandbError):
    """Will not succeed by retrying (bad key, no permission, unknown run, rejected request)."""


@dataclass(frozen=True)
class RunInfo:
    """What the bridge needs to know about a run before writing to it."""

    storage_id: str
    state: str
    tags: tuple[str, ...]
    notes: str
    summary: dict[str, Any]
    last_step: int = -1  # the last step of the run's history (-1: it logged none)


@dataclass(frozen=True)
class RunStep:
    """The run's step at an issue's onset: the last step the run itself logged at or before it."""

    step: int
    at: float  # that step's ``_timestamp`` (epoch seconds)
    settled: bool  # the run logged a later step too, so no earlier row can still arrive


MAX_RETRY_AFTER = 300.0  # the longest Retry-After honoured (the default backoff maximum)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date), at most
    ``MAX_RETRY_AFTER``: ``1e400`` parses to infinity, which stopped every write to the run for
    good; NaN, negative infinity and garbage are ignored (the bridge's own backoff applies)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return None if math.isnan(seconds) else min(MAX_RETRY_AFTER, max(0.0, seconds))


class WandbClient:
    """Raw GraphQL against ``base_url``; one ``requests.Session`` (keep-alive)."""

    def __init__(self, base_url: str, api_key: str, timeout: float = 30.0,
                 session: requests.Session | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = session or requests.Session()
        self.session.trust_env = False
        self._key = api_key
        token = base64.b64encode(f"api:{api_key}".encode()).decode()
        self._headers = {"Authorization": f"Basic {token}", "User-Agent": USER_AGENT,
                         "Content-Type": "application/json"}
        self.calls = 0
        # (entity, project, run id, onset) -> the step found, or None, and until when it holds
        self._steps: dict[tuple[str, str, str, float], tuple[RunStep | None, float]] = {}
        # (entity, project, run id, keys, window) -> the run's own metric there, or None, and
        # until when it holds
        self._metrics: dict[tuple[str, str, str, tuple[str, ...], float, float],
                            tuple[RunMetric | None, float]] = {}

    @property
    def api_key(self) -> str:
        """The key, for the one other reader of this W&B (the job log's console source)."""
        return self._key

    def _post(self, query: str, variables: dict[str, Any], operation: str) -> dict[str, Any]:
        self.calls += 1
        body = {"query": query, "variables": variables, "operationName": operation}
        try:
            resp = self.session.post(f"{self.base_url}/graphql", json=body,
                                     headers=self._headers, timeout=self.timeout)
        except requests.Timeout as exc:
            raise TransientError(f"{operation}: timeout") from exc
        except requests.RequestException as exc:
            raise TransientError(f"{operation}: {type(exc).__name__}") from exc
        if resp.status_code == 429 or resp.status_code >= 500:
            kind = "rate limited" if resp.status_code == 429 else "server error"
            if resp.status_code in PERMANENT_STATUSES:
                raise PermanentError(f"{operation}: HTTP {resp.status_code}")
            raise TransientError(f"{operation}: HTTP {resp.status_code} ({kind})",
                                 parse_retry_after(resp.headers.get("Retry-After")))
        if resp.status_code != 200 and "html" in resp.headers.get("Content-Type", "").lower():
            # an ingress or proxy page, not W&B's API answering: a routing glitch, not a verdict
            raise TransientError(f"{operation}: HTTP {resp.status_code} with an HTML page (a "
                                 "proxy or ingress, not W&B's API)")
        if resp.status_code != 200:
            hint = AUTH_HINTS.get(resp.status_code)
            raise PermanentError(f"{operation}: HTTP {resp.status_code}"
                                 + (f" ({hint})" if hint else ""))
        try:
            data = resp.json()
        except ValueError as exc:
            raise TransientError(f"{operation}: response is not JSON") from exc
        if not isinstance(data, dict):
            raise TransientError(f"{operation}: response is not a JSON object")
        errors = data.get("errors")
        if errors:
            first = errors[0].get("message", "") if isinstance(errors[0], dict) else errors[0]
            if RETRY_WORDS.search(str(first)):
                raise TransientError(f"{operation}: {str(first)[:300]}")
            raise PermanentError(f"{operation}: {str(first)[:300]}")
        payload = data.get("data")
        if not isinstance(payload, dict):
            raise TransientError(f"{operation}: response without data")
        return payload

    def check_key(self) -> str:
        """The key's entity, from a ``Viewer`` query; ``PermanentError`` with a one-line reason
        when the key is malformed or refused (so the bridge says so at start, instead of
        parking every run later with a bare 401)."""
        if not (_JWT.fullmatch(self._key) or _KEY.fullmatch(self._key)):
            raise PermanentError("the W&B API key is malformed (expected 40+ letters, digits, "
                                 "'_' or '-', optionally after a 'prefix-'; or a JWT)")
        viewer = self._post(VIEWER, {}, "BridgeViewer").get("viewer")
        if not viewer:
            raise PermanentError(f"{AUTH_HINTS[401]} (no viewer for this key)")
        return str(viewer.get("entity") or "")

    def find_run(self, entity: str, project: str, run_id: str) -> RunInfo:
        """The run's storage id, state, tags, notes and summary; ``PermanentError`` if absent."""
        data = self._post(RUN_QUERY, {"entity": entity, "project": project, "name": run_id},
                          "BridgeRun")
        run = (data.get("project") or {}).get("run")
        if not run:
            raise PermanentError(f"run {entity}/{project}/{run_id} not found")
        try:
            summary = json.loads(run.get("summaryMetrics") or "{}")
        except (TypeError, ValueError):
            summary = {}
        keys = run.get("historyKeys")
        last = keys.get("lastStep") if isinstance(keys, dict) else None
        return RunInfo(run["id"], run.get("state") or "", tuple(run.get("tags") or ()),
                       run.get("notes") or "", summary if isinstance(summary, dict) else {},
                       last if isinstance(last, int) else -1)

    def upsert(self, storage_id: str, *, tags: list[str] | None = None, notes: str | None = None,
               summary: dict[str, Any] | None = None) -> None:
        """One minimal ``upsertBucket``: only the given fields (null fields stay unchanged)."""
        variables: dict[str, Any] = {"id": storage_id, "tags": tags, "notes": notes,
                                     "summaryMetrics": None if summary is None
                                     else json.dumps(summary, sort_keys=True)}
        data = self._post(UPSERT, variables, "BridgeUpsertBucket")
        if not (data.get("upsertBucket") or {}).get("bucket"):
            raise PermanentError("upsertBucket returned no bucket")

    def notify(self, entity: str, project: str, run_id: str, *, title: str, text: str,
               severity: str = "ERROR") -> None:
        """``NotifyScriptableRunAlert``: fires the user's W&B alert channels (Slack, email)."""
        self._post(NOTIFY, {"entityName": entity, "projectName": project, "runName": run_id,
                            "title": title[:200], "text": text[:2000], "severity": severity},
                   "NotifyScriptableRunAlert")

    def _history(self, entity: str, project: str, run_id: str,
                 specs: Sequence[tuple[Sequence[str], int, int]]) -> list[list[Any]]:
        """One ``sampledHistory`` read: per (keys, first step, end step) spec, the rows in steps
        ``[first, end)`` holding those keys, at most ``STEP_SAMPLES`` of them."""
        texts = [json.dumps({"keys": list(keys), "minStep": lo, "maxStep": hi,
                             "samples": STEP_SAMPLES}) for keys, lo, hi in specs]
        data = self._post(SAMPLED_HISTORY, {"entity": entity, "project": project,
                                            "name": run_id, "specs": texts},
                          "BridgeSampledHistory")
        sampled = ((data.get("project") or {}).get("run") or {}).get("sampledHistory") or []
        if len(sampled) != len(specs) or not all(isinstance(part, list) for part in sampled):
            raise PermanentError("sampledHistory: expected one list of rows per spec")
        return sampled

    def _sampled(self, entity: str, project: str, run_id: str, lo: int, hi: int
                 ) -> tuple[list[tuple[int, float]], int]:
        """The run's own rows (step, timestamp) in steps ``[lo, hi)``, as sampled by W&B, and how
        many rows the sample held (fewer than ``STEP_SAMPLES``: the whole range)."""
        sampled = self._history(entity, project, run_id, [(["_step", "_timestamp"], lo, hi),
                                                          (["_step", MARKER_KEY], lo, hi)])
        markers = {r.get("_step") for r in sampled[1] if isinstance(r, dict)}
        rows = [(r["_step"], float(r["_timestamp"])) for r in sampled[0] if isinstance(r, dict)
                and isinstance(r.get("_step"), int) and isinstance(r.get("_timestamp"), int | float)
                and r["_step"] not in markers]
        return sorted(rows), len(sampled[0])

    def step_at(self, entity: str, project: str, run_id: str, onset: float,
                last_step: int) -> RunStep | None:
        """The last step the run logged at or before ``onset`` (epoch seconds), read from its
        history up to ``last_step`` (``RunInfo.last_step``): None when the run logged nothing
        in the ``STEP_NEAR`` seconds before the onset. Each sampled read narrows the step range
        to the rows around the onset, so a long run costs a few reads, not its whole history."""
        if last_step < 0:
            return None
        lo, hi = 0, last_step + 1
        best: tuple[int, float] | None = None
        later = False
        for _ in range(STEP_READS):
            rows, held = self._sampled(entity, project, run_id, lo, hi)
            before = [r for r in rows if r[1] <= onset]
            after = [r for r in rows if r[1] > onset]
            later = later or bool(after)
            if before and (best is None or before[-1][0] > best[0]):
                best = before[-1]
            lo_next = before[-1][0] + 1 if before else lo
            hi_next = after[0][0] if after else hi
            if held < STEP_SAMPLES or lo_next >= hi_next:
                break
            lo, hi = lo_next, hi_next
        if best is None or onset - best[1] > STEP_NEAR:
            return None
        return RunStep(best[0], best[1], later)

    def steps_at(self, info: RunInfo, entity: str, project: str, run_id: str,
                 onsets: Mapping[str, float]) -> dict[str, RunStep]:
        """Issue key -> the run's step at that issue's onset, where its history shows one (no
        call at all for a run that logged no step). A step is an addition to the notes, never
        a reason to hold them back: a failed read is logged and the notes go out without it. A
        step the run has logged past is kept; an unsettled or missing one is read again after
        ``STEP_RETRY`` seconds."""
        now = time.monotonic()
        found: dict[str, RunStep] = {}
        if info.last_step < 0:
            return found
        for key, onset in onsets.items():
            where = (entity, project, run_id, round(onset, 3))
            cached = self._steps.get(where)
            if cached is None or cached[1] <= now:
                try:
                    step = self.step_at(entity, project, run_id, onset, info.last_step)
                except WandbError as exc:
                    log.info("run history not read; notes go out without the step",
                             extra=log_fields(run=f"{entity}/{project}/{run_id}", error=str(exc)))
                    step = None
                until = float("inf") if step is not None and step.settled else now + STEP_RETRY
                cached = _remember(self._steps, where, step, until)
            if cached[0] is not None:
                found[key] = cached[0]
        return found

    def metric_around(self, entity: str, project: str, run_id: str, keys: Sequence[str], *,
                      lo: float, hi: float, last_step: int) -> tuple[RunMetric | None, bool]:
        """The first of ``keys`` the run logged, as (timestamp, value) from ``lo`` to ``hi``
        (epoch seconds), and whether the run logged it past ``hi`` (nothing earlier can still
        arrive). One read samples every key over the whole history; while the sample was
        thinned, each further read narrows the step range to the rows around the window, so a
        long run costs a few reads, not its whole history."""
        if last_step < 0 or not keys:
            return None, False
        first, end = 0, last_step + 1
        parts = self._history(entity, project, run_id,
                              [(["_step", "_timestamp", k], first, end) for k in keys])
        for key, rows in zip(keys, parts, strict=True):
            points = _metric_rows(rows, key)
            if points:
                break
        else:
            return None, False
        for _ in range(STEP_READS):
            if len(rows) < STEP_SAMPLES:
                break
            before = [step for step, at, _ in points if at < lo]
            after = [step for step, at, _ in points if at > hi]
            narrowed = (before[-1] if before else first, after[0] + 1 if after else end)
            if narrowed == (first, end):
                break
            first, end = narrowed
            rows = self._history(entity, project, run_id,
                                 [(["_step", "_timestamp", key], first, end)])[0]
            points = _metric_rows(rows, key)
        return (RunMetric(key, [(at, v) for _, at, v in points if lo <= at <= hi]),
                any(at > hi for _, at, _ in points))

    def run_metrics(self, entity: str, project: str, run_id: str, keys: Sequence[str],
                    windows: Mapping[str, tuple[float, float]]) -> dict[str, RunMetric]:
        """Issue key -> the run's own metric over that issue's (start, end) window, where it
        logs one of ``keys``. Like ``steps_at`` an addition, never a reason to hold anything
        back: a failed read is logged and the GPU signals stand. A window the run has logged
        past is kept; a missing or unfinished one is read again after ``STEP_RETRY`` seconds,
        so a page view or projection in between costs no W&B call."""
        now = time.monotonic()
        found: dict[str, RunMetric] = {}
        if not keys:
            return found
        last_step: int | None = None
        for issue, (lo, hi) in windows.items():
            where = (entity, project, run_id, tuple(keys), round(lo, 3), round(hi, 3))
            cached = self._metrics.get(where)
            if cached is None or cached[1] <= now:
                try:
                    if last_step is None:
                        last_step = self.find_run(entity, project, run_id).last_step
                    metric, settled = self.metric_around(entity, project, run_id, keys, lo=lo,
                                                         hi=hi, last_step=last_step)
                except WandbError as exc:
                    log.info("run metric not read; the impact stays on the GPU signals",
                             extra=log_fields(run=f"{entity}/{project}/{run_id}", error=str(exc)))
                    metric, settled = None, False
                cached = _remember(self._metrics, where, metric,
                                   float("inf") if settled else now + STEP_RETRY)
            if cached[0] is not None:
                found[issue] = cached[0]
        return found


def _remember(cache: dict[Any, tuple[Any, float]], key: Any, value: Any, until: float
              ) -> tuple[Any, float]:
    """Keep ``value`` under ``key`` until ``until`` (monotonic seconds), as the newest entry;
    the oldest entries go once the cache holds more than ``STEP_CACHE``."""
    cache.pop(key, None)
    cache[key] = entry = (value, until)
    while len(cache) > STEP_CACHE:
        del cache[next(iter(cache))]
    return entry


def _metric_rows(rows: list[Any], key: str) -> list[tuple[int, float, float]]:
    """(step, timestamp, value) of the rows holding a number under ``key``, by step."""
    out = []
    for row in rows:
        if not isinstance(row, dict):
            continue
        step, at, value = row.get("_step"), row.get("_timestamp"), row.get(key)
        if isinstance(step, int) and isinstance(at, (int, float)) \
                and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value):
            out.append((step, float(at), float(value)))
    return sorted(out)
