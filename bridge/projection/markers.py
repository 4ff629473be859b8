"""Plot markers: ``infra/issue`` history rows written into the user's run with the ``wandb`` SDK.

The writer joins the run in shared mode as a non-primary writer that never marks the run finished
(``x_update_finish_state=False``), sending history rows and nothing else it can switch off (see
``marker_settings``). The one thing the SDK cannot be told to leave out, its own ``_wandb``
config key (telemetry, and an empty list of metric definitions), would replace the trainer's
(its ``define_metric`` axes, its writers' environments) wherever the server merges config by
top-level key; so the SDK talks to W&B through ``HistoryOnlyProxy``, a loopback proxy that drops
the ``config`` of every ``upsertBucket`` and forwards everything else unchanged.

Rows carry their own ``_timestamp``, so markers line up with the user's metrics on wall time; the
backend numbers a shared-mode writer's ``_step`` itself. Where the run logs a step metric of its
own (``wandb.step_metrics``, e.g. ``trainer/global_step``), ``RunAxis`` reads that metric's value
at each row's time from the run's history and puts it into the row, so charts drawn against that
metric place the marker where the run was. Start rows wait until the issue's root cause has
settled (``MARKER_SETTLE``, ``projection.plan_markers``) because history cannot be taken back.
This relies on the server merging shared-mode writers (W&B's "shared" mode, wandb >= 0.19.9,
``wandb.Settings(mode="shared", x_primary=False)``); it can be switched off in the
configuration, and then the bridge writes tags, notes and summary only.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import requests

from wandb_infra.bridge.projection.wandb_client import (
    STEP_NEAR,
    PermanentError,
    TransientError,
    WandbClient,
    WandbError,
)
from wandb_infra.common.logsetup import log_fields
from wandb_infra.common.runkey import RunKey

log = logging.getLogger(__name__)

# History rows are append-only: an issue's start row waits until its root cause has not changed
# for this long. A cause that fires after the group's first notification reaches the bridge one
# Alertmanager group_interval later (1 m in deploy/alertmanager), plus a flush and a margin.
MARKER_SETTLE = 60.0 + 15.0
MISSING_SDK = ("wandb.markers is on but the wandb package is not installed: "
               "pip install '.[markers]' or set wandb.markers: false")


def startup_checks(client: WandbClient | None, markers: bool) -> None:
    """Refuse to start, with one line and no traceback, when W&B delivery could never work:
    markers on without the SDK (every marker write would fail), or a W&B key that is malformed
    or refused (every run would be parked with a bare 401). W&B unreachable is not a reason:
    delivery retries."""
    if client is None:
        return
    if markers and importlib.util.find_spec("wandb") is None:
        raise SystemExit(f"wandb-infra-bridge: {MISSING_SDK}")
    try:
        entity = client.check_key()
    except PermanentError as exc:
        raise SystemExit(f"wandb-infra-bridge: W&B key check failed: {exc}") from None
    except TransientError as exc:
        log.warning("W&B not reachable at start; the key is checked by the first delivery",
                    extra=log_fields(error=str(exc)))
        return
    log.info("W&B key accepted", extra=log_fields(entity=entity))


class MarkerWriter(Protocol):
    """Appends history rows to a run; raises on failure (the worker retries)."""

    def write(self, run: RunKey, rows: list[dict[str, Any]]) -> None:
        """Append ``rows`` (each with ``_timestamp``) to the run's history."""


def marker_settings(label: str) -> dict[str, Any]:
    """``wandb.Settings`` of the marker writer: a non-primary shared-mode writer that never
    finishes the run and sends history rows only. No code, git, program, requirements, system
    metadata or metrics, no console, no job, and no ``wandb-summary.json``
    (``x_server_side_derived_summary``): the trainer's metadata and summary stay its own. The
    SDK still sends its ``_wandb`` telemetry config key (wandb 0.31 has no switch for it):
    ``HistoryOnlyProxy`` removes it on the way."""
    return {
        "mode": "shared", "x_primary": False, "x_label": label, "x_update_finish_state": False,
        "x_disable_stats": True, "x_disable_meta": True, "x_disable_machine_info": True,
        "console": "off", "save_code": False, "disable_code": True, "disable_git": True,
        "disable_job_creation": True, "x_save_requirements": False, "program": "",
        "x_server_side_derived_summary": True, "silent": True,
    }


# Hop-by-hop headers (RFC 9110 7.6.1) and those the proxy recomputes for the body it forwards.
_NOT_FORWARDED = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer",
                            "transfer-encoding", "upgrade", "host", "content-length",
                            "content-encoding", "accept-encoding"})


def without_config(body: bytes) -> tuple[bytes, bool]:
    """A GraphQL request body with the ``config`` variable of an ``upsertBucket`` removed (and
    whether one was): the only way the SDK's run start could change the run's config."""
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body, False
    if not isinstance(request, dict) or "upsertbucket" not in str(request.get("query")).lower():
        return body, False
    variables = request.get("variables")
    if not isinstance(variables, dict) or "config" not in variables:
        return body, False
    del variables["config"]
    return json.dumps(request).encode(), True


class HistoryOnlyProxy:
    """A loopback HTTP proxy between the marker writer's SDK and W&B: every request is forwarded
    unchanged except that ``upsertBucket`` loses its ``config`` (``without_config``). Bound to
    127.0.0.1 on a free port for one writer; ``stripped`` counts the configs it removed."""

    def __init__(self, upstream: str, timeout: float = 60.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.timeout = timeout
        self.stripped = 0
        self._session = requests.Session()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Where the SDK is pointed (its ``base_url``)."""
        return f"http://127.0.0.1:{self._server.server_port}"

    def start(self) -> HistoryOnlyProxy:
        """Serve in a daemon thread until ``stop``."""
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="wandb-marker-proxy")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the upstream connections."""
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)
        self._session.close()

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes
                ) -> tuple[int, list[tuple[str, str]], bytes]:
        """Send one request upstream (``config`` removed from ``upsertBucket``); its answer. A
        gzipped request body is read, and forwarded as plain JSON."""
        encoding = next((v for k, v in headers.items() if k.lower() == "content-encoding"), "")
        if encoding.lower() == "gzip":
            body, encoding = gzip.decompress(body), ""
        if method == "POST" and path.split("?", maxsplit=1)[0].endswith("/graphql"):
            body, stripped = without_config(body)
            self.stripped += stripped
        sent = {k: v for k, v in headers.items() if k.lower() not in _NOT_FORWARDED}
        if encoding:  # an encoding this proxy does not read goes on as it came
            sent["Content-Encoding"] = encoding
        try:
            resp = self._session.request(method, self.upstream + path, headers=sent,
                                         data=body or None, timeout=self.timeout,
                                         allow_redirects=False)
        except requests.RequestException as exc:
            return 502, [("Content-Type", "text/plain")], f"W&B not reached: {exc}".encode()
        kept = [(k, v) for k, v in resp.headers.items() if k.lower() not in _NOT_FORWARDED]
        return resp.status_code, kept, resp.content

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _relay(self) -> None:
                body = self._body()
                status, headers, content = proxy.forward(self.command, self.path,
                                                         dict(self.headers.items()), body)
                self.send_response(status)
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    chunks = []
                    while size := int(self.rfile.readline().split(b";")[0], 16):
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    self.rfile.readline()
                    return b"".join(chunks)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _relay

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: failures reach the SDK as its own errors."""

        return Handler


class RunAxis:
    """The run's own step metric at a moment: the first of ``keys`` its history holds, its last
    value logged at or before that moment (within ``STEP_NEAR`` seconds), read with the public
    API's ``sampledHistory`` (``WandbClient.metric_around``). A marker row carrying it lands
    where the run was on charts drawn against that metric; a run that logs none gets none."""

    def __init__(self, client: WandbClient, keys: Sequence[str]) -> None:
        self.client = client
        self.keys = tuple(keys)

    def __call__(self, run: RunKey, at: float) -> dict[str, float]:
        """``{key: value}``, or ``{}`` when the run logs no such metric near ``at`` or its history
        cannot be read (a marker is never held back for it)."""
        if not self.keys:
            return {}
        try:
            last = self.client.find_run(run.entity, run.project, run.run_id).last_step
            metric, _ = self.client.metric_around(run.entity, run.project, run.run_id,
                                                  self.keys, lo=at - STEP_NEAR, hi=at,
                                                  last_step=last)
        except WandbError as exc:
            log.info("run step metric not read; the marker is placed on wall time only",
                     extra=log_fields(run=str(run), error=str(exc)))
            return {}
        if metric is None or not metric.points:
            return {}
        value = metric.points[-1][1]
        return {metric.name: int(value) if value.is_integer() else value}


class SdkMarkerWriter:
    """Writes markers with the real ``wandb`` SDK, one short shared-mode session per batch,
    through a ``HistoryOnlyProxy``; ``axis`` adds the run's own step metric to each row."""

    def __init__(self, base_url: str, api_key: str, state_dir: str | Path, *,
                 label: str = "wandb-infra-bridge", init_timeout: float = 60.0,
                 axis: Callable[[RunKey, float], dict[str, float]] | None = None) -> None:
        self.base_url = base_url
        self.api_key = api_key
        self.state_dir = Path(state_dir)
        self.label, self.init_timeout, self.axis = label, init_timeout, axis
        self._lock = threading.Lock()

    def write(self, run: RunKey, rows: list[dict[str, Any]]) -> None:
        """Join ``run`` in shared mode, log ``rows`` in time order, leave without finishing it."""
        if not rows:
            return
        import wandb  # noqa: PLC0415 - optional "markers" extra, imported only when enabled

        placed = [{**(self.axis(run, row["_timestamp"]) if self.axis else {}), **row}
                  for row in sorted(rows, key=lambda r: r["_timestamp"])]
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            proxy = HistoryOnlyProxy(self.base_url, self.init_timeout).start()
            try:
                settings = wandb.Settings(**marker_settings(self.label), base_url=proxy.url,
                                          api_key=self.api_key,
                                          init_timeout=self.init_timeout)
                session = wandb.init(id=run.run_id, entity=run.entity, project=run.project,
                                     dir=str(self.state_dir), settings=settings,
                                     reinit="create_new")
                try:
                    for row in placed:
                        session.log(row)
                finally:
                    session.finish()
            finally:
                proxy.stop()
