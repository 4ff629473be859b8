"""Plot markers: ``infra/issue`` history rows written into the user's run with the ``wandb`` SDK.

The writer joins the run in shared mode as a non-primary writer that never marks the run finished
(``x_update_finish_state=False``), sending history rows and nothing else it can switch off (see
``marker_settings``); rows carry their own ``_timestamp`` so markers line up with the user's
metrics on wall time. Start rows wait until the issue's root cause has settled
(``MARKER_SETTLE``, ``projection.plan_markers``) because history cannot be taken back. This
relies on the server merging shared-mode writers (see reference/wandb-api.md); it can be
switched off in the configuration, and then the bridge writes tags, notes and summary only.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from pathlib import Path
from typing import Any, Protocol

from wandb_infra.bridge.projection.wandb_client import PermanentError, TransientError, WandbClient
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
    SDK still sends its ``_wandb`` telemetry config key (wandb 0.31 has no switch for it)."""
    return {
        "mode": "shared", "x_primary": False, "x_label": label, "x_update_finish_state": False,
        "x_disable_stats": True, "x_disable_meta": True, "x_disable_machine_info": True,
        "console": "off", "save_code": False, "disable_code": True, "disable_git": True,
        "disable_job_creation": True, "x_save_requirements": False, "program": "",
        "x_server_side_derived_summary": True, "silent": True,
    }


class SdkMarkerWriter:
    """Writes markers with the real ``wandb`` SDK, one short shared-mode session per batch."""

    def __init__(self, base_url: str, api_key: str, state_dir: str | Path,
                 label: str = "wandb-infra-bridge", init_timeout: float = 60.0) -> None:
        self.base_url = base_url
        self.api_key = api_key
        self.state_dir = Path(state_dir)
        self.label = label
        self.init_timeout = init_timeout
        self._lock = threading.Lock()

    def write(self, run: RunKey, rows: list[dict[str, Any]]) -> None:
        """Join ``run`` in shared mode, log ``rows`` in time order, leave without finishing it."""
        if not rows:
            return
        import wandb  # noqa: PLC0415 - optional "markers" extra, imported only when enabled

        self.state_dir.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(**marker_settings(self.label), base_url=self.base_url,
                                  api_key=self.api_key, init_timeout=self.init_timeout)
        with self._lock:
            session = wandb.init(id=run.run_id, entity=run.entity, project=run.project,
                                 dir=str(self.state_dir), settings=settings,
                                 reinit="create_new")
            try:
                for row in sorted(rows, key=lambda r: r["_timestamp"]):
                    session.log(dict(row))
            finally:
                session.finish()
