"""A local stand-in of the W&B API: GraphQL (validated against an SDL subset) and ``file_stream``.

Real W&B answers request-shape errors with HTTP 200 and ``{"errors": [...]}``, checks
``Authorization: Basic api:<key>``, and serves shared-mode writers through
``/files/<entity>/<project>/<run>/file_stream``. This stand-in does the same on 127.0.0.1 so the
bridge's client and the real ``wandb`` SDK can be tested against it, including failures (5xx, 429
with ``Retry-After``, slow answers, permanent 4xx) injected by the test.

Usage::

    with WandbStandin() as wb:
        wb.add_run("team", "proj", "abc123", tags=["mine"])
        ...  # point WANDB_BASE_URL at wb.url, use wb.api_key
        wb.run("team", "proj", "abc123").tags
"""

from __future__ import annotations

import base64
import copy
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from graphql import GraphQLError, build_schema, graphql_sync

SDL = """
scalar JSONString
scalar JSON
scalar DateTime
scalar Duration

enum AlertSeverity { INFO WARN ERROR }

type Query {
  viewer: User
  serverInfo: ServerInfo
  project(name: String, entityName: String): Project
  model(name: String, entityName: String): Project
  entity(name: String!): Entity
}

type Mutation {
  upsertBucket(input: UpsertBucketInput!): UpsertBucketPayload
  notifyScriptableRunAlert(input: NotifyScriptableRunAlertInput!): NotifyScriptableRunAlertPayload
  upsertView(input: UpsertViewInput!): UpsertViewPayload
  deleteRun(input: DeleteRunInput!): DeleteRunPayload
}
input DeleteRunInput { id: ID! deleteArtifacts: Boolean clientMutationId: String }
type DeleteRunPayload { clientMutationId: String }

enum ViewSource { WANDB_UI WANDB_SDK }
input UpsertViewInput {
  id: ID
  entityName: String
  projectName: String
  name: String
  displayName: String
  description: String
  type: String
  spec: String
  createdUsing: ViewSource
}
type View { id: ID! name: String! displayName: String }
type ViewConnection { edges: [ViewEdge!]! }
type ViewEdge { node: View }
type UpsertViewPayload { view: View inserted: Boolean }

type ServerInfo { features: [ServerFeature!]! }
type ServerFeature { name: String! isEnabled: Boolean! }

type User {
  id: ID!
  entity: String
  username: String
  name: String
  email: String
  admin: Boolean
  flags: JSONString
  teams: EntityConnection
}
type EntityConnection { edges: [EntityEdge!]! }
type EntityEdge { node: Entity }
type Entity { id: ID! name: String! organization: Organization }
type Organization { name: String! }

type Project {
  id: ID!
  internalId: ID
  readOnly: Boolean
  name: String!
  entityName: String!
  entity: Entity!
  run(name: String!): Run
  bucket(name: String!): Run
  runs(filters: JSONString, first: Int, after: String, order: String): RunConnection!
  runCount(filters: JSONString): Int!
  allViews(viewType: String, viewName: String, userName: String): ViewConnection
}

type RunConnection { edges: [RunEdge!]! pageInfo: PageInfo! totalCount: Int! }
type RunEdge { node: Run! cursor: String! }
type PageInfo {
  endCursor: String hasNextPage: Boolean! startCursor: String hasPreviousPage: Boolean!
}

type Run {
  id: ID!
  name: String!
  displayName: String
  state: String
  tags: [String!]!
  notes: String
  description: String
  config: JSONString
  summaryMetrics: JSONString
  systemMetrics: JSONString
  group: String
  jobType: String
  sweepName: String
  commit: String
  readOnly: Boolean
  host: String
  historyLineCount: Int
  eventsLineCount: Int
  createdAt: DateTime
  updatedAt: DateTime
  heartbeatAt: DateTime
  projectId: Int!
  project: Project
  user: User
  historyKeys(format: String): JSON
  sampledHistory(specs: [JSONString!]!): [JSON]
  logLineCount: Int
  logLines(first: Int, last: Int, after: String, before: String,
           useImprovedPagination: Boolean): LogLineConnection
}

type LogLineConnection { edges: [LogLineEdge!]! pageInfo: PageInfo! }
type LogLineEdge { node: LogLine! cursor: String! }
type LogLine { id: ID! number: Int timestamp: String level: String label: String line: String }

input UpsertBucketInput {
  id: String
  name: String
  groupName: String
  modelName: String
  entityName: String
  description: String
  displayName: String
  notes: String
  commit: String
  config: JSONString
  host: String
  debug: Boolean
  jobProgram: String
  jobRepo: String
  jobType: String
  state: String
  sweep: String
  tags: [String!]
  summaryMetrics: JSONString
  clientMutationId: String
}
type UpsertBucketPayload { bucket: Run inserted: Boolean clientMutationId: String }

input NotifyScriptableRunAlertInput {
  entityName: String!
  projectName: String!
  runName: String!
  title: String!
  text: String!
  severity: AlertSeverity = INFO
  waitDuration: Duration
  clientMutationId: String
}
type NotifyScriptableRunAlertPayload { success: Boolean! clientMutationId: String }
"""

SCHEMA = build_schema(SDL)

_JWT = re.compile(r"^[^.\s]+\.[^.\s]+\.[^.\s]+$")
_KEY = re.compile(r"^(?:[A-Za-z0-9_]+-)?[\w-]{40,}$")
_FILE_STREAM = re.compile(r"^/files/([^/]+)/([^/]+)/([^/]+)/file_stream$")


def key_format_ok(key: str) -> bool:
    """The SDK's offline key check: JWT-shaped, or optional ``prefix-`` then 40+ ``[\\w-]``."""
    return bool(_JWT.match(key) or _KEY.match(key))


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())


@dataclass
class RunRecord:
    """Server-side state of one run, as a test inspects it."""

    entity: str
    project: str
    run_id: str
    storage_id: str
    state: str = "running"
    tags: list[str] = field(default_factory=list)
    notes: str = ""
    description: str = ""
    display_name: str = ""
    group: str | None = None
    job_type: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    console: list[dict[str, Any]] = field(default_factory=list)
    created_at: str = field(default_factory=_now_iso)
    heartbeat_at: str = field(default_factory=_now_iso)
    created_seq: int = 0


@dataclass
class Recorded:
    """One request the stand-in received (after auth, before fault injection)."""

    method: str
    path: str
    status: int
    operation_name: str | None
    variables: dict[str, Any] | None
    headers: dict[str, str]
    at: float
    body: Any = None
    answered: float = 0.0  # monotonic time the answer was written (0: not yet)


@dataclass
class Fault:
    """An injected failure: ``times`` requests (None = until cleared) matching ``path_prefix``."""

    status: int | None
    times: int | None
    retry_after: str | None = None
    delay: float = 0.0
    path_prefix: str = ""
    operation: str | None = None
    body: str | None = None
    content_type: str = "application/json"


class _Resolver:
    """Root value for graphql-core: attribute/method lookups resolve the schema's fields."""

    def __init__(self, server: WandbStandin) -> None:
        self.server = server

    # Query
    def viewer(self, _info: Any) -> dict[str, Any]:
        s = self.server
        return {
            "id": "VXNlcjox", "entity": s.viewer_entity, "username": s.viewer_entity,
            "name": s.viewer_entity, "email": f"{s.viewer_entity}@example.invalid", "admin": False,
            "flags": "{}",
            "teams": {"edges": [{"node": {"id": _b64(f"Entity:{t}"), "name": t}}
                                for t in sorted(s.teams)]},
        }

    def serverInfo(self, _info: Any) -> dict[str, Any]:
        return {"features": []}

    def project(self, _info: Any, name: str | None = None,
                entityName: str | None = None) -> _ProjectView | None:
        entity = entityName or self.server.viewer_entity
        if name is None:
            return None
        if not self.server._has_project(entity, name):
            return None
        return _ProjectView(self.server, entity, name)

    model = project

    def entity(self, _info: Any, name: str) -> dict[str, Any]:
        return {"id": _b64(f"Entity:{name}"), "name": name, "organization": None}

    # Mutation
    def upsertBucket(self, _info: Any, input: dict[str, Any]) -> dict[str, Any]:
        return self.server._upsert_bucket(input)

    def upsertView(self, _info: Any, input: dict[str, Any]) -> dict[str, Any]:
        """A saved workspace view (wandb-workspaces' UpsertView2); the spec must be JSON."""
        s = self.server
        if not s._has_project(input.get("entityName") or "", input.get("projectName") or ""):
            raise GraphQLError("project not found")
        try:
            spec = json.loads(input.get("spec") or "")
        except ValueError as exc:
            raise GraphQLError("spec is not JSON") from exc
        with s._lock:
            view = {**input, "spec": spec, "id": input.get("id") or f"view-{len(s.views) + 1}"}
            same = [i for i, v in enumerate(s.views) if v["id"] == view["id"]]
            if input.get("id") and not same:
                raise GraphQLError(f"view {input['id']} not found")
            if same:
                s.views[same[0]] = view
            else:
                s.views.append(view)
        return {"view": {"id": view["id"], "name": view.get("name") or ""},
                "inserted": not same}

    def deleteRun(self, _info: Any, input: dict[str, Any]) -> dict[str, Any]:
        s = self.server
        with s._lock:
            key = next((k for k, r in s._runs.items() if r.storage_id == input["id"]), None)
            if key is None:
                raise GraphQLError(f"run with id {input['id']} not found")
            del s._runs[key]
        return {"clientMutationId": input.get("clientMutationId")}

    def notifyScriptableRunAlert(self, _info: Any, input: dict[str, Any]) -> dict[str, Any]:
        s = self.server
        key = (input["entityName"], input["projectName"], input["runName"])
        with s._lock:
            if key not in s._runs:
                raise GraphQLError(f"run {'/'.join(key)} not found")
            s.alerts.append(dict(input))
        return {"success": True}


class _ProjectView:
    def __init__(self, server: WandbStandin, entity: str, name: str) -> None:
        self.server = server
        self.entityName = entity
        self.name = name
        self.id = _b64(f"Project:v1:{name}:{entity}")
        self.internalId = str(server._projects[(entity, name)])
        self.readOnly = False
        self.entity = {"id": _b64(f"Entity:{entity}"), "name": entity, "organization": None}

    def allViews(self, _info: Any, viewType: str | None = None, viewName: str | None = None,
                 userName: str | None = None) -> dict[str, Any]:
        """The project's saved views (upsertView), of that type and name when given."""
        with self.server._lock:
            views = [v for v in self.server.views
                     if (v.get("entityName"), v.get("projectName")) == (self.entityName, self.name)
                     and viewType in (None, v.get("type")) and viewName in (None, v.get("name"))]
        return {"edges": [{"node": {"id": v["id"], "name": v.get("name") or "",
                                    "displayName": v.get("displayName")}} for v in views]}

    def run(self, _info: Any, name: str) -> dict[str, Any] | None:
        with self.server._lock:
            rec = self.server._runs.get((self.entityName, self.name, name))
            return None if rec is None else _run_view(rec, int(self.internalId))

    bucket = run

    def _matching(self, filters: str | None) -> list[RunRecord]:
        try:
            spec = json.loads(filters) if filters else {}
        except json.JSONDecodeError as exc:
            raise GraphQLError(f"invalid filters: {exc}") from exc
        if not isinstance(spec, dict):
            raise GraphQLError("invalid filters: expected an object")
        with self.server._lock:
            runs = [r for (e, p, _), r in self.server._runs.items()
                    if e == self.entityName and p == self.name]
            return [r for r in runs if _match(r, spec)]

    def runs(self, _info: Any, filters: str | None = None, first: int | None = None,
             after: str | None = None, order: str | None = None) -> dict[str, Any]:
        matching = self._matching(filters)
        order = order or "-created_at"
        key = order.lstrip("+-")
        reverse = order.startswith("-")
        matching.sort(key=lambda r: (_field(r, key) or "", r.created_seq), reverse=reverse)
        start = 0
        if after:
            try:
                start = int(base64.b64decode(after).decode().split(":", 1)[1]) + 1
            except (ValueError, IndexError, UnicodeDecodeError) as exc:
                raise GraphQLError(f"invalid cursor {after!r}") from exc
        size = 50 if first is None else max(0, first)
        page = matching[start:start + size]
        number = int(self.internalId)
        edges = [{"node": _run_view(r, number), "cursor": _b64(f"cursor:{start + i}")}
                 for i, r in enumerate(page)]
        return {
            "edges": edges,
            "totalCount": len(matching),
            "pageInfo": {
                "endCursor": edges[-1]["cursor"] if edges else after,
                "hasNextPage": start + len(page) < len(matching),
                "startCursor": edges[0]["cursor"] if edges else None,
                "hasPreviousPage": start > 0,
            },
        }

    def runCount(self, _info: Any, filters: str | None = None) -> int:
        return len(self._matching(filters))


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _sampled_history(rows: list[dict[str, Any]], specs: list[str]) -> list[list[dict[str, Any]]]:
    """``sampledHistory`` as the wandb SDK reads it (wandb/wandb, wandb/apis/public/history.py,
    ``SampledHistoryScan``): one list per JSON spec ``{"keys", "minStep", "maxStep",
    "samples"}``, of the rows in steps ``[minStep, maxStep)`` that hold every key, each with
    those keys only; more rows than ``samples`` are thinned to that many, evenly spaced, first
    and last kept (W&B does not document its own choice, so a client must not rely on which)."""
    out = []
    for text in specs:
        try:
            spec = json.loads(text)
        except ValueError as exc:
            raise GraphQLError(f"invalid sampledHistory spec: {exc}") from exc
        keys = spec.get("keys") if isinstance(spec, dict) else None
        if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
            raise GraphQLError("sampledHistory spec needs keys, a list of strings")
        lo, hi = spec.get("minStep", 0), spec.get("maxStep")
        samples = spec.get("samples", 500)
        picked = [{k: row[k] for k in keys} for row in rows
                  if all(k in row for k in keys) and row["_step"] >= lo
                  and (hi is None or row["_step"] < hi)]
        if len(picked) > samples:
            last = len(picked) - 1
            picked = [picked[round(i * last / max(1, samples - 1))]
                      for i in range(max(0, samples))]
        out.append(picked)
    return out


def _log_lines(lines: list[dict[str, Any]], *, first: int | None = None, last: int | None = None,
               after: str | None = None, before: str | None = None,
               useImprovedPagination: bool | None = None) -> dict[str, Any]:
    """``logLines`` as the wandb SDK reads a run's console log (wandb/wandb,
    ``core/api/graphql/query_run_console_logs.graphql``): ``last: N`` is the tail in ascending
    line order; ``first``/``after`` page forward from the start (the SDK sends those with
    ``useImprovedPagination: true``). ``number`` is the 0-based line number, ``level`` "error"
    for stderr, ``label`` the shared-mode writer's ``x_label``."""
    del useImprovedPagination  # accepted as the real server does; both modes give the tail
    start, stop = 0, len(lines)
    if after is not None:
        start = _cursor(after) + 1
    if before is not None:
        stop = _cursor(before)
    window = lines[start:stop]
    if first is not None:
        window = window[:max(0, first)]
    if last is not None:
        window = window[-last:] if last > 0 else []
    edges = [{"node": {**node, "id": _b64(f"LogLine:{node['number']}")},
              "cursor": _b64(f"cursor:{node['number']}")} for node in window]
    return {"edges": edges, "pageInfo": {
        "startCursor": edges[0]["cursor"] if edges else None,
        "endCursor": edges[-1]["cursor"] if edges else None,
        "hasPreviousPage": bool(edges) and window[0]["number"] > 0,
        "hasNextPage": bool(edges) and window[-1]["number"] < len(lines) - 1}}


def _cursor(text: str) -> int:
    try:
        return int(base64.b64decode(text).decode().split(":", 1)[1])
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        raise GraphQLError(f"invalid cursor {text!r}") from exc


def _run_view(rec: RunRecord, project_id: int) -> dict[str, Any]:
    keys = sorted({k for row in rec.history for k in row if not k.startswith("_")})
    return {
        "id": rec.storage_id, "name": rec.run_id, "displayName": rec.display_name or rec.run_id,
        "state": rec.state, "tags": list(rec.tags), "notes": rec.notes,
        "description": rec.description, "config": json.dumps(rec.config),
        "summaryMetrics": json.dumps(rec.summary), "systemMetrics": "{}",
        "group": rec.group, "jobType": rec.job_type, "sweepName": None, "commit": None,
        "readOnly": False, "host": None, "historyLineCount": len(rec.history),
        "eventsLineCount": len(rec.events), "createdAt": rec.created_at,
        "updatedAt": rec.heartbeat_at, "heartbeatAt": rec.heartbeat_at, "projectId": project_id,
        "project": None,
        "user": {"id": "VXNlcjox", "name": rec.entity, "username": rec.entity,
                 "entity": rec.entity},
        "historyKeys": {"lastStep": len(rec.history) - 1,
                        "keys": {k: {"typeCounts": [{"type": "number", "count": 1}]}
                                 for k in keys}},
        # read when asked (graphql-core calls it with the field's arguments); list() copies the
        # rows appended so far in one step, so a concurrent file_stream append cannot tear it
        "sampledHistory": lambda _info, specs: _sampled_history(list(rec.history), specs),
        "logLineCount": len(rec.console),
        "logLines": lambda _info, **kw: _log_lines(list(rec.console), **kw),
    }


_FIELD_ALIASES = {
    "created_at": "created_at", "createdAt": "created_at", "heartbeat_at": "heartbeat_at",
    "heartbeatAt": "heartbeat_at", "display_name": "display_name", "displayName": "display_name",
    "name": "run_id", "state": "state", "tags": "tags", "group": "group", "jobType": "job_type",
    "job_type": "job_type", "notes": "notes",
}


def _field(rec: RunRecord, name: str) -> Any:
    for prefix, source in (("config.", rec.config), ("summary_metrics.", rec.summary)):
        if name.startswith(prefix):
            value: Any = source
            for part in name[len(prefix):].split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if isinstance(value, dict) and "value" in value and prefix == "config.":
                return value["value"]
            return value
    attr = _FIELD_ALIASES.get(name)
    if attr is None:
        raise GraphQLError(f"unsupported filter field {name!r}")
    return getattr(rec, attr)


def _compare(value: Any, op: str, operand: Any) -> bool:
    as_list = value if isinstance(value, list) else [value]
    if op == "$eq":
        return operand in as_list if isinstance(value, list) else value == operand
    if op == "$ne":
        return not _compare(value, "$eq", operand)
    if op == "$in":
        return any(v in operand for v in as_list)
    if op == "$nin":
        return not any(v in operand for v in as_list)
    if op in ("$gt", "$gte", "$lt", "$lte"):
        if value is None:
            return False
        try:
            return {"$gt": value > operand, "$gte": value >= operand,
                    "$lt": value < operand, "$lte": value <= operand}[op]
        except TypeError:
            return False
    if op == "$regex":
        return any(isinstance(v, str) and re.search(operand, v) for v in as_list)
    if op == "$exists":
        return (value is not None) == bool(operand)
    raise GraphQLError(f"unsupported filter operator {op!r}")


def _match(rec: RunRecord, spec: dict[str, Any]) -> bool:
    for key, cond in spec.items():
        if key == "$and":
            if not all(_match(rec, c) for c in cond):
                return False
        elif key == "$or":
            if not any(_match(rec, c) for c in cond):
                return False
        elif key.startswith("$"):
            raise GraphQLError(f"unsupported filter operator {key!r}")
        elif isinstance(cond, dict):
            value = _field(rec, key)
            if not all(_compare(value, op, operand) for op, operand in cond.items()):
                return False
        elif not _compare(_field(rec, key), "$eq", cond):
            return False
    return True


class WandbStandin:
    """The stand-in server, run in a background thread on 127.0.0.1 (context manager)."""

    def __init__(self, api_key: str | None = None, viewer_entity: str = "standin-user",
                 extra_keys: tuple[str, ...] = ()) -> None:
        self.api_key = api_key or "local-" + "k" * 40
        self.valid_keys = {self.api_key, *extra_keys}
        self.viewer_entity = viewer_entity
        self.teams: set[str] = set()
        self.requests: list[Recorded] = []
        self.rejected: list[Recorded] = []
        self.alerts: list[dict[str, Any]] = []
        self.views: list[dict[str, Any]] = []  # saved workspace views (upsertView)
        self._runs: dict[tuple[str, str, str], RunRecord] = {}
        self._projects: dict[tuple[str, str], int] = {}
        self._faults: list[Fault] = []
        # Misbehaviours a test switches on: updates of an existing run silently lost ("tags",
        # "notes", "summaryMetrics" of an upsertBucket by id; "history" rows), and a server
        # that shows a run as running again when a writer joins it by name (the SDK's run
        # start), whatever state it was in.
        self.lose: set[str] = set()
        self.revive_on_join = False
        self._seq = 0
        self._lock = threading.RLock()
        self._resolver = _Resolver(self)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # lifecycle
    def start(self) -> WandbStandin:
        """Bind a free loopback port and serve in a daemon thread."""
        handler = _make_handler(self)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> WandbStandin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # data
    def add_run(self, entity: str, project: str, run_id: str, *, state: str = "running",
                tags: tuple[str, ...] | list[str] = (), notes: str = "",
                config: dict[str, Any] | None = None, summary: dict[str, Any] | None = None,
                display_name: str | None = None, group: str | None = None) -> RunRecord:
        """Create a run as if a trainer had started it."""
        with self._lock:
            self._seq += 1
            rec = RunRecord(
                entity=entity, project=project, run_id=run_id,
                storage_id=_b64(f"Run:v1:{run_id}:{project}:{entity}"), state=state,
                tags=list(tags), notes=notes, config=dict(config or {}),
                summary=dict(summary or {}), display_name=display_name or run_id, group=group,
                created_seq=self._seq,
            )
            self._runs[(entity, project, run_id)] = rec
            self._projects.setdefault((entity, project), len(self._projects) + 1)
            self.teams.add(entity)
            return rec

    def run(self, entity: str, project: str, run_id: str) -> RunRecord:
        """A snapshot copy of a run's server-side state (KeyError if unknown)."""
        with self._lock:
            return copy.deepcopy(self._runs[(entity, project, run_id)])

    def user_edit(self, entity: str, project: str, run_id: str, *,
                  notes: Callable[[str], str] | None = None,
                  tags: Callable[[list[str]], list[str]] | None = None) -> None:
        """Change a run's notes and tags as its owner would in the W&B UI (a function of what
        the server holds at that moment)."""
        with self._lock:
            rec = self._runs[(entity, project, run_id)]
            if notes is not None:
                rec.notes = notes(rec.notes)
            if tags is not None:
                rec.tags = list(tags(list(rec.tags)))

    def add_console(self, entity: str, project: str, run_id: str, lines: list[str], *,
                    label: str = "", level: str = "info", start: float | None = None) -> None:
        """Append console lines as the run's writer ``label`` (shared mode's ``x_label``; empty
        for the primary) would have streamed them, one second apart from ``start``."""
        at = time.time() if start is None else start
        with self._lock:
            rec = self._runs[(entity, project, run_id)]
            for i, line in enumerate(lines):
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at + i)) + "Z"
                rec.console.append({"number": len(rec.console), "timestamp": stamp,
                                    "level": level, "label": label or None, "line": line})

    def set_state(self, entity: str, project: str, run_id: str, state: str) -> None:
        """Change a run's state, as the trainer finishing or crashing would."""
        with self._lock:
            self._runs[(entity, project, run_id)].state = state

    def revoke(self, key: str | None = None) -> None:
        """Stop accepting ``key`` (default: the main key), as revoking it in W&B would."""
        with self._lock:
            self.valid_keys.discard(key or self.api_key)

    def _has_project(self, entity: str, project: str) -> bool:
        with self._lock:
            return (entity, project) in self._projects

    # failure injection
    def fail(self, status: int, times: int | None = 1, *, retry_after: str | float | None = None,
             path_prefix: str = "", operation: str | None = None, body: str | None = None,
             content_type: str = "application/json") -> None:
        """Answer the next ``times`` matching requests (None = until ``clear_faults``) with
        ``status`` (and ``body``/``content_type``, e.g. an ingress's HTML page);
        ``retry_after`` adds a ``Retry-After`` header."""
        with self._lock:
            self._faults.append(Fault(status, times, None if retry_after is None
                                      else str(retry_after), 0.0, path_prefix, operation, body,
                                      content_type))

    def restore(self, key: str | None = None) -> None:
        """Accept ``key`` again (default: the main key), as re-enabling it in W&B would."""
        with self._lock:
            self.valid_keys.add(key or self.api_key)

    def slow(self, delay: float, times: int | None = 1, path_prefix: str = "",
             operation: str | None = None) -> None:
        """Delay the next ``times`` matching requests by ``delay`` seconds, then answer normally."""
        with self._lock:
            self._faults.append(Fault(None, times, None, delay, path_prefix, operation))

    def clear_faults(self) -> None:
        """Remove every injected failure."""
        with self._lock:
            self._faults.clear()

    def _take_fault(self, path: str, operation: str | None) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if not path.startswith(fault.path_prefix):
                    continue
                if fault.operation is not None and fault.operation != operation:
                    continue
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                return fault
            return None

    # observation
    def calls(self, operation: str | None = None, path_prefix: str = "",
              since: float = 0.0) -> list[Recorded]:
        """Recorded requests filtered by GraphQL operation name and/or path prefix."""
        with self._lock:
            return [r for r in self.requests if r.at >= since and r.path.startswith(path_prefix)
                    and (operation is None or r.operation_name == operation)]

    def rate(self, window: float, path_prefix: str = "") -> float:
        """Requests per second over the last ``window`` seconds (rejected ones included)."""
        cutoff = time.monotonic() - window
        with self._lock:
            n = sum(1 for r in [*self.requests, *self.rejected]
                    if r.at >= cutoff and r.path.startswith(path_prefix))
        return n / window

    def iter_runs(self) -> Iterator[RunRecord]:
        """Snapshots of every run."""
        with self._lock:
            recs = [copy.deepcopy(r) for r in self._runs.values()]
        yield from recs

    # GraphQL mutations
    def _upsert_bucket(self, data: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            inserted = False
            rec: RunRecord | None = None
            if data.get("id"):
                rec = next((r for r in self._runs.values() if r.storage_id == data["id"]), None)
                if rec is None:
                    raise GraphQLError(f"run with id {data['id']} not found")
            else:
                name = data.get("name")
                project = data.get("modelName")
                if not name or not project:
                    raise GraphQLError("upsertBucket needs id, or name and modelName")
                entity = data.get("entityName") or self.viewer_entity
                rec = self._runs.get((entity, project, name))
                if rec is None:
                    rec = self.add_run(entity, project, name)
                    inserted = True
                elif self.revive_on_join:
                    rec.state = "running"
            if data.get("id"):
                data = {k: v for k, v in data.items() if k not in self.lose}
            for src, attr in (("notes", "notes"), ("description", "description"),
                              ("displayName", "display_name"), ("groupName", "group"),
                              ("jobType", "job_type"), ("state", "state")):
                if data.get(src) is not None:
                    setattr(rec, attr, data[src])
            if data.get("tags") is not None:
                rec.tags = list(data["tags"])
            for src, attr, merge in (("config", "config", True),
                                     ("summaryMetrics", "summary", False)):
                if data.get(src) is None:
                    continue
                try:
                    value = json.loads(data[src])
                except (TypeError, json.JSONDecodeError) as exc:
                    raise GraphQLError(f"{src} is not valid JSON: {exc}") from exc
                if not isinstance(value, dict):
                    raise GraphQLError(f"{src} must be a JSON object")
                if merge:
                    getattr(rec, attr).update(value)
                else:
                    setattr(rec, attr, value)
            view = _run_view(rec, self._projects[(rec.entity, rec.project)])
            view["project"] = {"id": _b64(f"Project:v1:{rec.project}:{rec.entity}"),
                               "name": rec.project,
                               "entityName": rec.entity,
                               "entity": {"id": _b64(f"Entity:{rec.entity}"), "name": rec.entity}}
            return {"bucket": view, "inserted": inserted}

    def _file_stream(self, entity: str, project: str, run_id: str, body: dict[str, Any]
                     ) -> tuple[int, dict[str, Any]]:
        with self._lock:
            rec = self._runs.get((entity, project, run_id))
            if rec is None:
                return 404, {"error": f"run {entity}/{project}/{run_id} not found"}
            rec.heartbeat_at = _now_iso()
            files = body.get("files") or {}
            if not isinstance(files, dict):
                return 400, {"error": "files must be an object"}
            for name, chunk in files.items():
                lines = chunk.get("content") if isinstance(chunk, dict) else None
                if not isinstance(lines, list):
                    return 400, {"error": f"files.{name}.content must be a list"}
                for line in lines:
                    try:
                        item = json.loads(line)
                    except (TypeError, json.JSONDecodeError):
                        if name.endswith((".jsonl", ".json")):
                            return 400, {"error": f"invalid JSON line in {name}"}
                        continue
                    if name == "wandb-history.jsonl":
                        if "history" in self.lose:
                            continue
                        item["_step"] = len(rec.history)
                        rec.history.append(item)
                    elif name == "wandb-summary.json" and isinstance(item, dict):
                        rec.summary.update(item)
                    elif name == "wandb-events.jsonl":
                        rec.events.append(item)
            if body.get("complete"):
                rec.state = "finished" if body.get("exitcode") in (0, None) else "crashed"
            return 200, {"exitcode": None, "limits": {}}


def _make_handler(server: WandbStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in separate writes; with Nagle on, keep-alive clients wait
        # for the delayed ACK (~40 ms) on every request.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None,
                  content_type: str = "application/json") -> None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _authorised(self) -> bool:
            header = self.headers.get("Authorization", "")
            if not header.startswith("Basic "):
                return False
            try:
                user, _, key = base64.b64decode(header[6:], validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return False
            return user == "api" and key_format_ok(key) and key in server.valid_keys

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def _handle(self, method: str) -> None:
            rec: Recorded | None = None
            try:
                rec = self._answer(method)
            finally:
                if rec is not None:
                    rec.answered = time.monotonic()

        def _answer(self, method: str) -> Recorded:
            """Record, authorise, inject faults, route; the record of the request."""
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            path = self.path.split("?", 1)[0]
            try:
                body = json.loads(raw) if raw else None
            except (json.JSONDecodeError, UnicodeDecodeError):
                body = None
                parse_error = True
            else:
                parse_error = False
            op = body.get("operationName") if isinstance(body, dict) else None
            variables = body.get("variables") if isinstance(body, dict) else None
            rec = Recorded(method, path, 0, op if isinstance(op, str) else None,
                           variables if isinstance(variables, dict) else None,
                           {k: v for k, v in self.headers.items()}, time.monotonic(), body)
            if not self._authorised():
                rec.status = 401
                with server._lock:
                    server.rejected.append(rec)
                self._send(401, {"errors": [{"message": "user is not logged in"}]})
                return rec
            with server._lock:
                server.requests.append(rec)
            fault = server._take_fault(path, rec.operation_name)
            if fault is not None:
                if fault.delay:
                    time.sleep(fault.delay)
                if fault.status is not None:
                    rec.status = fault.status
                    headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                    payload = (fault.body.encode() if fault.body is not None
                               else {"errors": [{"message": f"injected HTTP {fault.status}"}]})
                    self._send(fault.status, payload, headers, fault.content_type)
                    return rec
            status, payload = self._route(method, path, body, parse_error)
            rec.status = status
            self._send(status, payload)
            return rec

        def _route(self, method: str, path: str, body: Any, parse_error: bool
                   ) -> tuple[int, Any]:
            if method == "POST" and path == "/graphql":
                if parse_error or not isinstance(body, dict) or not isinstance(
                        body.get("query"), str):
                    return 400, {"errors": [{"message": "request body must be JSON with a query"}]}
                variables = body.get("variables")
                if variables is not None and not isinstance(variables, dict):
                    return 400, {"errors": [{"message": "variables must be an object"}]}
                result = graphql_sync(SCHEMA, body["query"], root_value=server._resolver,
                                      variable_values=variables,
                                      operation_name=body.get("operationName") or None)
                out: dict[str, Any] = {"data": result.data}
                if result.errors:
                    out["errors"] = [e.formatted for e in result.errors]
                return 200, out
            match = _FILE_STREAM.match(path)
            if method == "POST" and match:
                if parse_error:
                    return 400, {"error": "invalid JSON"}
                entity, project, run_id = match.group(1, 2, 3)
                return server._file_stream(entity, project, run_id,
                                           body if isinstance(body, dict) else {})
            return 404, {"error": "not found"}

    return Handler
