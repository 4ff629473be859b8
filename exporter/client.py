"""Helper a training script calls on every rank right after ``wandb.init``::

    import wandb
    from wandb_infra.exporter.client import register, keep_registered
    run = wandb.init(...)
    register(run)                      # once; or:
    beat = keep_registered(run)        # re-registers every ``interval`` s (heartbeat), and
    ...                                # beat.stop() deregisters this host at the end

It registers this host, the GPUs this process may use and the Slurm job with the exporter's
``POST /v1/runs``. It never raises and never blocks training for longer than ``timeout``: an
unreachable exporter only costs a warning. Standard library only.

Settings (arguments win over environment):
  WANDB_INFRA_EXPORTER_URL          exporter base URL (default http://127.0.0.1:9842)
  WANDB_INFRA_EXPORTER_TOKEN(_FILE) bearer token for the registration API
  WANDB_INFRA_HOSTNAME              host name to register (default SLURMD_NODENAME or the hostname)
GPUs: SLURM_STEP_GPUS / SLURM_JOB_GPUS (physical indices) when set, else CUDA_VISIBLE_DEVICES
(indices or GPU-/MIG- UUIDs).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)
DEFAULT_URL = "http://127.0.0.1:9842"


def visible_gpus(environ: Mapping[str, str]) -> list[int | str]:
    """GPUs this process may use: Slurm's physical indices first, else CUDA_VISIBLE_DEVICES."""
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        raw = environ.get(name, "").strip()
        if not raw or raw in ("NoDevFiles", "-1"):
            continue
        out: list[int | str] = []
        for item in (part.strip() for part in raw.split(",")):
            if item.isascii() and item.isdigit():  # "²".isdigit() is true, int("²") raises
                out.append(int(item))
            elif item.startswith(("GPU-", "MIG-")):
                out.append(item)
        return out
    return []


def _identity(run: Any, environ: Mapping[str, str]) -> dict[str, str]:
    def pick(attr: str, env: str) -> str:
        value = getattr(run, attr, None) if run is not None else None
        return str(value or environ.get(env, "") or "")
    return {"entity": pick("entity", "WANDB_ENTITY"), "project": pick("project", "WANDB_PROJECT"),
            "run_id": pick("id", "WANDB_RUN_ID"), "run_name": pick("name", "WANDB_NAME"),
            "run_group": pick("group", "WANDB_RUN_GROUP")}


def _token(token: str | None, environ: Mapping[str, str]) -> str:
    if token:
        return token
    path = environ.get("WANDB_INFRA_EXPORTER_TOKEN_FILE")
    if path:
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.read().strip()
        except OSError:
            return ""
    return environ.get("WANDB_INFRA_EXPORTER_TOKEN", "")


def build_payload(run: Any = None, environ: Mapping[str, str] | None = None,
                  ttl: float | None = None) -> dict[str, Any]:
    """The registration body for this process (plain data; no I/O besides the host name)."""
    environ = os.environ if environ is None else environ
    body: dict[str, Any] = {k: v for k, v in _identity(run, environ).items() if v}
    body["hostname"] = (environ.get("WANDB_INFRA_HOSTNAME") or environ.get("SLURMD_NODENAME")
                        or socket.gethostname())
    gpus = visible_gpus(environ)
    if gpus:
        body["gpus"] = gpus
    if environ.get("SLURM_JOB_ID"):
        body["slurm_job_id"] = environ["SLURM_JOB_ID"]
    if ttl:
        body["ttl_seconds"] = ttl
    return body


def _request(method: str, url: str, token: str, body: dict[str, Any] | None,
             timeout: float) -> bool:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)  # noqa: S310 (URL is config)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
            return 200 <= resp.status < 300
    except urllib.error.HTTPError as exc:
        detail = exc.read(300).decode(errors="replace")
        log.warning("wandb-infra-exporter rejected %s: HTTP %s %s", method, exc.code, detail)
    except (OSError, ValueError) as exc:
        log.warning("wandb-infra-exporter unreachable at %s: %s", url, exc)
    return False


def register(run: Any = None, *, url: str | None = None, token: str | None = None,
             ttl: float | None = None, timeout: float = 2.0,
             environ: Mapping[str, str] | None = None) -> bool:
    """Register this host/GPUs for ``run`` (a wandb Run, or None to use WANDB_* env vars).

    Returns True on success; never raises.
    """
    try:
        environ = os.environ if environ is None else environ
        body = build_payload(run, environ, ttl)
        if not all(body.get(k) for k in ("entity", "project", "run_id")):
            log.warning("wandb-infra-exporter: run entity/project/id unknown, not registering")
            return False
        base = (url or environ.get("WANDB_INFRA_EXPORTER_URL") or DEFAULT_URL).rstrip("/")
        return _request("POST", base + "/v1/runs", _token(token, environ), body, timeout)
    except Exception:  # the one place where anything goes: training must never break
        log.warning("wandb-infra-exporter registration failed", exc_info=True)
        return False


def deregister(run: Any = None, *, url: str | None = None, token: str | None = None,
               timeout: float = 2.0, environ: Mapping[str, str] | None = None) -> bool:
    """Remove this host's registration for ``run``; never raises."""
    try:
        environ = os.environ if environ is None else environ
        body = build_payload(run, environ)
        base = (url or environ.get("WANDB_INFRA_EXPORTER_URL") or DEFAULT_URL).rstrip("/")
        path = "/".join(urllib.parse.quote(body.get(k, ""), safe="")
                        for k in ("entity", "project", "run_id"))
        query = urllib.parse.urlencode({"hostname": body["hostname"]})
        return _request("DELETE", f"{base}/v1/runs/{path}?{query}", _token(token, environ), None,
                        timeout)
    except Exception:
        log.warning("wandb-infra-exporter deregistration failed", exc_info=True)
        return False


class Heartbeat:
    """A daemon thread re-registering every ``interval`` seconds with a TTL of 3 intervals."""

    def __init__(self, run: Any, interval: float, **kwargs: Any) -> None:
        self.run, self.interval, self.kwargs = run, interval, kwargs
        self.ok = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="wandb-infra-heartbeat",
                                        daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.ok = register(self.run, ttl=self.interval * 3, **self.kwargs)
            self._stop.wait(self.interval)

    def start(self) -> Heartbeat:
        """Start beating (the first registration happens immediately)."""
        self._thread.start()
        return self

    def stop(self, deregister_host: bool = True) -> None:
        """Stop beating; by default also remove the registration now instead of at TTL."""
        self._stop.set()
        self._thread.join(timeout=5)
        if deregister_host:
            deregister(self.run, **{k: v for k, v in self.kwargs.items() if k != "ttl"})


def keep_registered(run: Any = None, interval: float = 60.0, **kwargs: Any) -> Heartbeat:
    """Register now and every ``interval`` seconds until ``stop()`` or process exit."""
    return Heartbeat(run, interval, **kwargs).start()
