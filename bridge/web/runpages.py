"""What the run pages show, read from the run service: a page of ``/runs`` rows (filtered,
cached per run until anything it was built from changes) and one run's view. Runs on the read
pool's one thread; never writes the store, never calls W&B."""

from __future__ import annotations

import logging
from typing import Any

from wandb_infra.bridge.ingest.store import RunIndexEntry, Store, StoreError
from wandb_infra.bridge.runs.service import RunService
from wandb_infra.bridge.runs.view import RunRow, RunView
from wandb_infra.common.logsetup import log_fields
from wandb_infra.common.runkey import RunKey

log = logging.getLogger(__name__)

MAX_PAGE = 500
MAX_CACHED_SUMMARIES = 20_000


def error_text(exc: Exception) -> str:
    """What /runs and the run page say of a run whose stored alerts cannot be diagnosed."""
    return f"{type(exc).__name__}: {str(exc)[:200]}"


class RunPages:
    """The pages' reads (see module docstring)."""

    def __init__(self, store: Store, service: RunService) -> None:
        self.store, self.service = store, service
        # /runs rows by run, with the version of what they were built from (alerts, delivery,
        # verdict, GPU-hours): a request rebuilds only runs that changed.
        self.summaries: dict[RunKey, tuple[tuple[Any, ...], RunRow]] = {}

    def runs(self, limit: int, offset: int,
             filters: dict[str, str] | None = None) -> tuple[list[RunRow], int, bool]:
        """A page of runs, newest first, matching ``filters`` (entity, project, state: open
        while an alert of the run fires), and whether more follow. The store pages and filters
        (through its key and its index of firing alerts); only the page's runs are
        diagnosed."""
        store, filters = self.store, filters or {}
        if filters.get("verdict"):
            return self._verdict_rows(filters["verdict"], limit, offset)
        entries = store.run_index(limit + 1, offset, entity=filters.get("entity", ""),
                                  project=filters.get("project", ""),
                                  state=filters.get("state", ""))
        rows = [self._cached(entry) for entry in entries[:limit]]
        return rows, store.unattributed_count(), len(entries) > limit

    def _cached(self, entry: RunIndexEntry) -> RunRow:
        """The run's summary, cached until anything it was built from changes."""
        run, store = entry.run, self.store
        version = (entry.version, store.outbox(run), store.ending(run), store.gpu_hours(run))
        cached = self.summaries.get(run)
        if cached is None or cached[0] != version:
            cached = (version, self._summary(entry))
            if len(self.summaries) >= MAX_CACHED_SUMMARIES:
                self.summaries.clear()
            if not cached[1].unconfirmed:  # Prometheus may still confirm those
                self.summaries[run] = cached
        return cached[1]

    def _summary(self, entry: RunIndexEntry) -> RunRow:
        """A run's row from its view; rebuilt only when its alerts changed."""
        run = entry.run
        try:
            view = self.service.view(run, remediate=False)
            if view is not None:
                return view.row()
            error = error_text(ValueError("no alerts stored"))
        except StoreError:
            raise
        except Exception as exc:  # one unreadable run must not hide all the others
            log.exception("cannot show run", extra=log_fields(run=run.path()))
            error = error_text(exc)
        return RunRow(run, entry.alerts, entry.firing, 0, 0, None, None, {"state": "unknown"},
                      error=error)

    def _verdict_rows(self, verdict: str, limit: int,
                      offset: int) -> tuple[list[RunRow], int, bool]:
        """``/runs?verdict=``: judged runs, most recently ended first, with or without alerts
        (their stored verdict, kept current by the delivery worker)."""
        store = self.store
        endings = store.endings_page(verdict, limit + 1, offset)
        views = (self.service.view(ending.run, remediate=False) for ending in endings[:limit])
        rows = [v.row() for v in views if v is not None]
        return rows, store.unattributed_count(), len(endings) > limit

    def run(self, run: RunKey) -> RunView | str | None:
        """The run's view; None when nothing is stored for the run; the error text when its
        alerts cannot be diagnosed (shown as the run's error rather than a 500)."""
        try:
            return self.service.view(run)
        except StoreError:
            raise
        except Exception as exc:
            log.exception("cannot show run", extra=log_fields(run=run.path()))
            return error_text(exc)
