"""Plot markers: ``infra/issue`` history rows written into the user's run with the ``wandb`` SDK.

The writer joins the run in shared mode as a non-primary writer that never marks the run finished
(``x_update_finish_state=False``), with system metrics, console capture, code and git metadata
off; rows carry their own ``_timestamp`` so markers line up with the user's metrics on wall time.
This relies on the server merging shared-mode writers (see reference/wandb-api.md); it can be
switched off in the configuration, and then the bridge writes tags, notes and summary only.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Protocol

from bridge.identity import RunKey

log = logging.getLogger(__name__)


class MarkerWriter(Protocol):
    """Appends history rows to a run; raises on failure (the worker retries)."""

    def write(self, run: RunKey, rows: list[dict[str, Any]]) -> None:
        """Append ``rows`` (each with ``_timestamp``) to the run's history."""


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
        settings = wandb.Settings(
            mode="shared", x_primary=False, x_label=self.label, x_update_finish_state=False,
            x_disable_stats=True, console="off", save_code=False, x_disable_meta=True,
            disable_git=True, silent=True, base_url=self.base_url, api_key=self.api_key,
            init_timeout=self.init_timeout, x_disable_machine_info=True,
        )
        with self._lock:
            session = wandb.init(id=run.run_id, entity=run.entity, project=run.project,
                                 dir=str(self.state_dir), settings=settings,
                                 reinit="create_new")
            try:
                for row in sorted(rows, key=lambda r: r["_timestamp"]):
                    session.log(dict(row))
            finally:
                session.finish()
