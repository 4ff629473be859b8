"""The simulator over HTTP: one aiohttp server on 127.0.0.1 for every host's targets, service
discovery, Slurm's node list and the control API, on its own event loop in a background thread.

Why a thread: tests, the demo and the benchmarks drive the cluster from synchronous code while
Prometheus scrapes it. Routes: ``/dcgm/<host>/metrics`` and ``/node/<host>/metrics`` (a lost host
drops the connection), ``/sd/dcgm|node`` (http_sd), ``/runs/metrics`` (the join metrics of runs
assigned with ``assign_run``, a stand-in for the exporter in tests that do not start it),
``/slurm/nodes`` (``scontrol show node -o``), ``POST /control/<action>`` (fault, clear, reboot,
workload, run, end_run, slurm_state) and ``/healthz``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from demo.simulator.cluster import Cluster
from demo.simulator.exposition import EXPOSITION_TYPE
from demo.simulator.model import SimulatorError
from demo.simulator.scrape import target_groups


def build_app(cluster: Cluster) -> web.Application:
    """The aiohttp application: metrics per target, service discovery and the control API."""

    async def metrics(request: web.Request) -> web.StreamResponse:
        exporter, name = request.match_info["exporter"], request.match_info["host"]
        if name not in cluster.hosts:
            raise web.HTTPNotFound(text=f"unknown host {name}\n")
        body = cluster.render(exporter, name)
        if body is None:
            # A lost host does not answer: drop the connection, as an unreachable node would.
            if request.transport is not None:
                request.transport.abort()
            raise web.HTTPServiceUnavailable(text="host lost\n")
        return web.Response(body=body, headers={"Content-Type": EXPOSITION_TYPE})

    async def runs(_request: web.Request) -> web.Response:
        return web.Response(body=cluster.render_runs(), headers={"Content-Type": EXPOSITION_TYPE})

    async def service_discovery(request: web.Request) -> web.Response:
        exporter = request.match_info["exporter"]
        address = f"{request.url.host}:{request.url.port}"
        return web.json_response(target_groups(address, cluster.hosts, exporter))

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "hosts": len(cluster.hosts)})

    async def scontrol_nodes(_request: web.Request) -> web.Response:
        return web.Response(text=cluster.render_scontrol_nodes())

    async def control(request: web.Request) -> web.Response:
        action = request.match_info["action"]
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise web.HTTPBadRequest(text="body must be a JSON object\n") from None
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text="body must be a JSON object\n")
        try:
            _control(cluster, action, body)
        except SimulatorError as exc:
            raise web.HTTPBadRequest(text=f"{exc}\n") from None
        return web.json_response({"ok": True})

    app = web.Application(client_max_size=64 * 1024)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/runs/metrics", runs)
    app.router.add_get("/sd/{exporter:dcgm|node}", service_discovery)
    app.router.add_get("/{exporter:dcgm|node}/{host}/metrics", metrics)
    app.router.add_get("/slurm/nodes", scontrol_nodes)
    app.router.add_post("/control/{action}", control)
    return app


def _control(cluster: Cluster, action: str, body: dict[str, Any]) -> None:
    """Apply one control request; validates every host first so a bad one changes nothing."""
    allowed = {"kind", "host", "hosts", "gpu", "code", "device", "busy", "entity", "project",
               "run_id", "run_name", "gpus", "state", "reason"}
    unknown = set(body) - allowed
    if unknown:
        raise SimulatorError(f"unknown fields {sorted(unknown)}")
    hosts = body.get("hosts", [body["host"]] if "host" in body else [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise SimulatorError("hosts must be a list of host names")
    for name in hosts:
        cluster.host(name)
    if action == "slurm_state":
        state, reason = body.get("state", ""), body.get("reason", "")
        if not isinstance(state, str) or not isinstance(reason, str):
            raise SimulatorError("state and reason must be strings")
        for name in hosts:
            cluster.set_slurm_state(name, state, reason)
        return
    if action == "fault":
        if not hosts:
            raise SimulatorError("a fault needs host or hosts")
        kind = body.get("kind")
        if not isinstance(kind, str):
            raise SimulatorError("kind must be a string")
        cluster.inject_hosts(kind, hosts, body.get("gpu"), body.get("code"), body.get("device"))
    elif action == "clear":
        for name in hosts or [None]:
            cluster.clear(name, body.get("gpu"), body.get("kind"), body.get("device"))
    elif action == "reboot":
        for name in hosts:
            cluster.reboot(name)
    elif action == "workload":
        if not isinstance(body.get("busy"), bool) or not hosts:
            raise SimulatorError("workload needs host(s) and busy: true|false")
        for name in hosts:
            cluster.set_busy(name, body["busy"], body.get("gpu"))
    elif action == "run":
        fields = [body.get(k) for k in ("entity", "project", "run_id")]
        if not all(isinstance(f, str) for f in fields):
            raise SimulatorError("run needs entity, project and run_id strings")
        gpus = body.get("gpus")
        if gpus is not None and not (isinstance(gpus, list) and all(
                isinstance(g, int) and not isinstance(g, bool) for g in gpus)):
            raise SimulatorError("gpus must be a list of GPU indices")
        if not isinstance(body.get("run_name", ""), str):
            raise SimulatorError("run_name must be a string")
        entity, project, run_id = (str(f) for f in fields)
        cluster.assign_run(entity, project, run_id, hosts, gpus=gpus,
                           run_name=body.get("run_name"))
    elif action == "end_run":
        fields = [body.get(k) for k in ("entity", "project", "run_id")]
        if not all(isinstance(f, str) for f in fields):
            raise SimulatorError("end_run needs entity, project and run_id strings")
        cluster.end_run(*(str(f) for f in fields))
    else:
        raise SimulatorError(f"unknown control action {action!r}")


class SimulatorServer:
    """Runs the app on its own event loop in a background thread (for tests and the demo)."""

    def __init__(self, cluster: Cluster, host: str = "127.0.0.1", port: int = 0) -> None:
        self.cluster = cluster
        self._host, self._port = host, port
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="simulator")
        self.port = 0

    @property
    def address(self) -> str:
        """host:port for scrape configs."""
        return f"{self._host}:{self.port}"

    @property
    def url(self) -> str:
        """Base URL."""
        return f"http://{self.address}"

    def start(self) -> SimulatorServer:
        """Bind and serve; returns when the port is known."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    async def _start(self) -> None:
        self._runner = web.AppRunner(build_app(self.cluster), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, backlog=1024)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        """Stop serving and end the thread."""
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
            self._runner = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


@contextlib.contextmanager
def serve(cluster: Cluster, port: int = 0) -> Iterator[SimulatorServer]:
    """``with serve(Cluster(hosts=4)) as sim: ...`` serves on 127.0.0.1 until the block ends."""
    server = SimulatorServer(cluster, port=port).start()
    try:
        yield server
    finally:
        server.stop()
