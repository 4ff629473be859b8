"""Builders for Alertmanager webhook bodies and a threaded bridge server, for the bridge tests."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web

from harness.processes import free_port
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.web.webhook import BridgeContext, Credentials, create_app

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
TOKEN = "test-bridge-token-0123456789"


def rfc3339(value: datetime) -> str:
    """Go-style timestamp with nanoseconds, as Alertmanager emits."""
    return value.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"


def alert(name: str, *, category: str, host: str = "", gpu: str = "", run: str | None = None,
          entity: str = "team", project: str = "proj", start: datetime = T0,
          end: datetime | None = None, severity: str = "critical",
          annotations: dict[str, str] | None = None, extra: dict[str, str] | None = None
          ) -> dict[str, Any]:
    """One webhook alert object; fingerprint derived from the labels like Alertmanager does."""
    labels = {"alertname": name, "severity": severity, "category": category}
    if host:
        labels["hostname"] = host
    if gpu:
        labels["gpu"] = gpu
    if run:
        labels.update(wandb_entity=entity, wandb_project=project, wandb_run_id=run)
    labels.update(extra or {})
    fp = hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]
    return {
        "status": "resolved" if end else "firing", "labels": labels,
        "annotations": annotations or {"summary": f"{name}.", "description": f"{name} on {host}",
                                       "impact": "The run may stall.",
                                       "remediation": "Drain the node."},
        "startsAt": rfc3339(start),
        "endsAt": rfc3339(end) if end else "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus.invalid/graph", "fingerprint": fp,
    }


def notification(alerts: list[dict[str, Any]], receiver: str = "wandb\\.bridge",
                 truncated: int = 0) -> dict[str, Any]:
    """A version-4 webhook body around ``alerts``."""
    firing = any(a["status"] == "firing" for a in alerts)
    return {"receiver": receiver, "status": "firing" if firing else "resolved", "alerts": alerts,
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://am.invalid", "version": "4", "groupKey": "{}:{}",
            "truncatedAlerts": truncated}


def cascade(hosts: int = 64, gpus: int = 8, run: str = "cascade1",
            bad_host: int = 17, bad_gpu: int = 3) -> list[dict[str, Any]]:
    """The motivating crash: XID 94 on one GPU, then every host of the run stalls."""
    out = [alert("GpuContainedEccError", category="gpu_hardware", host=f"node{bad_host:03d}",
                 gpu=str(bad_gpu), run=run, start=T0)]
    for h in range(hosts):
        out.append(alert("TrainingStalled", category="workload", host=f"node{h:03d}", run=run,
                         start=T0 + timedelta(seconds=40 + h % 30), severity="warning"))
    for h in range(hosts):
        for g in range(gpus):
            if (h, g) != (bad_host, bad_gpu):
                out.append(alert("GpuXidApplicationError", category="workload",
                                 host=f"node{h:03d}", gpu=str(g), run=run,
                                 start=T0 + timedelta(seconds=45), severity="warning",
                                 extra={"xid": "43"}))
    return out


@dataclass
class Running:
    """A bridge app served on 127.0.0.1 from a background thread."""

    url: str
    ctx: BridgeContext


def make_context(tmp_path: Path, **kwargs: Any) -> BridgeContext:
    """A context with a fresh store and bearer auth (``TOKEN``)."""
    defaults: dict[str, Any] = dict(
        store=Store(tmp_path / "bridge.sqlite"),
        metrics=BridgeMetrics(), links=GrafanaLinks("http://grafana.invalid"),
        credentials=Credentials(bearer_token=TOKEN), webhook_path="/alertmanager",
        max_body_bytes=1024 * 1024)
    defaults.update(kwargs)
    return BridgeContext(**defaults)


@contextmanager
def serve_app(app: web.Application, port: int | None = None) -> Iterator[str]:
    """Run an aiohttp ``app`` on 127.0.0.1 in a thread until the block exits; yields its URL."""
    port = port or free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, Any] = {}

    async def _start() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        holder["runner"] = runner

    def _main() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(_start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(holder["runner"].cleanup())
        loop.close()

    thread = threading.Thread(target=_main, daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("app did not start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@contextmanager
def serve(ctx: BridgeContext, port: int | None = None) -> Iterator[Running]:
    """Run ``create_app(ctx)`` in a thread until the block exits."""
    with serve_app(create_app(ctx), port) as url:
        yield Running(url, ctx)
