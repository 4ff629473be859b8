"""Registrations pushed by training jobs (HTTP) or dropped as files: validation and the TTL store.

Payload (JSON object)::

    {"entity": "e", "project": "p", "run_id": "abc123", "hostname": "gpu01",
     "gpus": [0, "1", {"index": 2, "uuid": "GPU-..."}],          # optional
     "run_name": "...", "run_group": "...", "slurm_job_id": "42",   # optional
     "namespace": "...", "pod": "...", "ttl_seconds": 600}          # optional

A registration lives for ``ttl_seconds`` (default from config, capped); re-posting the same
run+host is the heartbeat that extends it. Unknown fields and wrong types are rejected with the
reason, so a typo never silently registers something else.

Registrations survive a restart: the store is written to ``registrations.state_file`` (JSON
lines, atomically, at most once a second while something changed, and at shutdown) and read
back at start, each entry with the rest of its TTL, through the same validation and bounds as a
POST. A kill -9 loses at most the last second's changes; a Slurm prolog's 7-day registration
made once is not lost with the process.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path

from wandb_infra.common import labels
from wandb_infra.common.labels import NAME_CHARS, RUN_ID_CHARS
from wandb_infra.common.logsetup import log_fields
from wandb_infra.common.runkey import RunKey
from wandb_infra.exporter.model import Gpu, RunPlacement

log = logging.getLogger(__name__)
STATE_FORMAT = 1  # the state file's first line: {"format": 1}

# Always applied with ``fullmatch``: ``$`` also matches before a trailing newline, so "run\n" would
# pass ``match`` and be published as a label value of its own.
HOST_CHARS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
UUID_CHARS = re.compile(r"[A-Za-z0-9][A-Za-z0-9/_.-]{0,127}")
LABEL_TEXT = re.compile(r"[^\x00-\x1f\x7f]{0,256}")
MAX_GPUS = 64
FIELDS = {"entity", "project", "run_id", "hostname", "gpus", "run_name", "run_group",
          "slurm_job_id", "namespace", "pod", "ttl_seconds"}
EXTRA = {"run_group": labels.RUN_GROUP, "slurm_job_id": labels.SLURM_JOB_ID,
         "namespace": labels.NAMESPACE, "pod": labels.POD}


class RegistrationError(ValueError):
    """A bad registration; the message names the field and the problem."""


def _text(data: Mapping[str, object], name: str, pattern: re.Pattern[str],
          required: bool) -> str:
    value = data.get(name)
    if value is None or value == "":
        if required:
            raise RegistrationError(f"'{name}' is required")
        return ""
    if isinstance(value, int) and not isinstance(value, bool) and name == "slurm_job_id":
        value = str(value)
    if not isinstance(value, str):
        raise RegistrationError(f"'{name}' must be a string, got {type(value).__name__}")
    if not pattern.fullmatch(value):
        raise RegistrationError(f"'{name}' has invalid characters or length: {value[:80]!r}")
    return value


def _index(value: object) -> str:
    if isinstance(value, bool):
        raise RegistrationError("GPU index must be an integer, got a boolean")
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or not 0 <= value < 1024:
        raise RegistrationError(f"GPU index must be an integer 0..1023, got {value!r}"[:120])
    return str(value)


def _gpus(raw: object) -> tuple[Gpu, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RegistrationError("'gpus' must be a list of indices or {index, uuid} objects")
    if len(raw) > MAX_GPUS:
        raise RegistrationError(f"'gpus' has more than {MAX_GPUS} entries")
    out = []
    for item in raw:
        if isinstance(item, Mapping):
            unknown = set(item) - {"index", "uuid"}
            if unknown:
                names = ", ".join(sorted(map(str, unknown)))
                raise RegistrationError(f"unknown GPU fields: {names}")
            index = _index(item["index"]) if item.get("index") is not None else ""
            uuid = item.get("uuid") or ""
            if uuid and (not isinstance(uuid, str) or not UUID_CHARS.fullmatch(uuid)):
                raise RegistrationError(f"GPU uuid is invalid: {str(uuid)[:80]!r}")
            if not index and not uuid:
                raise RegistrationError("a GPU object needs 'index' or 'uuid'")
            out.append(Gpu(index, uuid))
        elif isinstance(item, str) and item.startswith(("GPU-", "MIG-")):
            if not UUID_CHARS.fullmatch(item):
                raise RegistrationError(f"GPU uuid is invalid: {item[:80]!r}")
            out.append(Gpu(uuid=item))
        else:
            out.append(Gpu(index=_index(item)))
    return tuple(dict.fromkeys(out))


def run_key(entity: str, project: str, run_id: str) -> RunKey | None:
    """The run a URL names, when every part is what a registration could have used."""
    if NAME_CHARS.fullmatch(entity) and NAME_CHARS.fullmatch(project) and RUN_ID_CHARS.fullmatch(
            run_id):
        return RunKey(entity, project, run_id)
    return None


def parse_registration(data: object, source: str, default_ttl: float,
                       max_ttl: float) -> tuple[RunPlacement, float]:
    """Validate one registration; returns the placement and its TTL in seconds."""
    if not isinstance(data, Mapping):
        raise RegistrationError("registration must be a JSON object")
    unknown = set(map(str, data)) - FIELDS
    if unknown:
        raise RegistrationError(f"unknown fields: {', '.join(sorted(unknown))}")
    run = RunKey(_text(data, "entity", NAME_CHARS, True), _text(data, "project", NAME_CHARS, True),
                 _text(data, "run_id", RUN_ID_CHARS, True))
    host = _text(data, "hostname", HOST_CHARS, True)
    extra = tuple((label, _text(data, field, LABEL_TEXT, False)) for field, label in EXTRA.items())
    ttl = data.get("ttl_seconds", default_ttl)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= max_ttl:
        raise RegistrationError(f"'ttl_seconds' must be a number in (0, {max_ttl:g}]")
    placement = RunPlacement(run=run, host=host, source=source, gpus=_gpus(data.get("gpus")),
                             run_name=_text(data, "run_name", LABEL_TEXT, False),
                             extra=tuple(e for e in extra if e[1]))
    return placement, float(ttl)


@dataclass
class _Entry:
    placement: RunPlacement
    expires: float
    owner: Hashable | None  # the host-bound token that wrote it (None: not under a quota)


def series(placement: RunPlacement) -> int:
    """Join-metric series a placement publishes: one node series plus one per GPU."""
    return 1 + len(placement.gpus)


class RegistrationStore:
    """Live registrations keyed by (run, host), each expiring unless refreshed.

    Bounded in entries and in the series they publish, since the exporter's memory and scrape
    size grow with series (about 1.4 kB of RSS each), not with entries; and per owner (one
    node's token) to ``max_series_per_owner`` series, so one node cannot fill the store and
    leave every other node's prolog with 503s until its entries expire."""

    def __init__(self, max_entries: int = 100_000, clock: Callable[[], float] = time.time,
                 max_series: int = 180_000, max_series_per_owner: int = 1_000,
                 state_file: Path | None = None) -> None:
        self.max_entries = max_entries
        self.max_series = max_series
        self.max_series_per_owner = max_series_per_owner
        self.clock = clock
        self._lock = threading.Lock()
        self._entries: dict[tuple[RunKey, str], _Entry] = {}
        self._series = 0
        self._owned: Counter[Hashable] = Counter()
        self._version = 0
        self._next_expiry = float("inf")
        self.state_file = state_file
        self._changes = 0  # every put and delete, heartbeats included (their expiry moved)
        self._saved = 0
        self._save_lock = threading.Lock()
        self.save_failing = False

    def put(self, placement: RunPlacement, ttl: float, owner: Hashable | None = None) -> bool:
        """Add or refresh, charged to ``owner`` (None: no per-owner quota); returns True when
        it was new. Raises OverflowError when the store or the owner's quota is full."""
        key = (placement.run, placement.host)
        with self._lock:
            self._expire()  # what has run out no longer holds room or quota
            old = self._entries.get(key)
            if old is None and len(self._entries) >= self.max_entries:
                raise OverflowError(f"registration store is full ({self.max_entries})")
            before = 0 if old is None else series(old.placement)
            grown = self._series + series(placement) - before
            if grown > self.max_series and grown > self._series:  # heartbeats always fit
                raise OverflowError(f"registrations would publish more than {self.max_series} "
                                    "series")
            if owner is not None:
                mine = self._owned[owner] + series(placement) - (
                    before if old is not None and old.owner == owner else 0)
                if mine > self.max_series_per_owner and mine > self._owned[owner]:
                    raise OverflowError("this token's registrations would publish more than "
                                        f"{self.max_series_per_owner} series "
                                        "(registrations.max_series_per_token)")
            if old is not None:
                self._release(old)
            self._series = grown
            if owner is not None:
                self._owned[owner] += series(placement)
            expires = self.clock() + ttl
            self._entries[key] = _Entry(placement, expires, owner)
            self._next_expiry = min(self._next_expiry, expires)
            if old is None or old.placement != placement:
                self._version += 1
            self._changes += 1
            return old is None

    def _release(self, entry: _Entry) -> None:
        """Give an entry's series back to its owner's quota (the caller holds the lock)."""
        if entry.owner is not None:
            self._owned[entry.owner] -= series(entry.placement)
            if not self._owned[entry.owner]:
                del self._owned[entry.owner]

    def delete(self, run: RunKey, host: str | None = None) -> int:
        """Remove a run's registrations (one host or all); returns how many."""
        with self._lock:
            keys = [k for k in self._entries if k[0] == run and (host is None or k[1] == host)]
            for key in keys:
                self._drop(key)
            if keys:
                self._version += 1
                self._changes += 1
            return len(keys)

    def _drop(self, key: tuple[RunKey, str]) -> None:
        entry = self._entries.pop(key)
        self._series -= series(entry.placement)
        self._release(entry)

    def _expire(self) -> None:
        now = self.clock()
        if now < self._next_expiry:
            return
        dead = [k for k, e in self._entries.items() if e.expires <= now]
        for key in dead:
            self._drop(key)
        if dead:
            self._version += 1
        self._next_expiry = min((e.expires for e in self._entries.values()), default=float("inf"))

    def version(self) -> int:
        """Changes whenever the live set changes (including expiry)."""
        with self._lock:
            self._expire()
            return self._version

    def active(self) -> list[RunPlacement]:
        """Placements whose TTL has not run out."""
        with self._lock:
            self._expire()
            return [e.placement for e in self._entries.values()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    # persistence ---------------------------------------------------------------------------
    def save(self) -> bool:
        """Write the live registrations to the state file if anything changed since the last
        write (atomically: a temporary file, fsync, rename); False when it could not be written
        (logged; the registrations stay in memory and the next call tries again)."""
        if self.state_file is None:
            return True
        with self._save_lock:
            with self._lock:
                self._expire()
                changes = self._changes
                if changes == self._saved and self.state_file.exists():
                    return True
                entries = list(self._entries.values())  # references: cheap under the lock
            tmp = self.state_file.with_name(self.state_file.name + ".tmp")
            try:
                self.state_file.parent.mkdir(parents=True, exist_ok=True)
                with tmp.open("w", encoding="utf-8") as handle:
                    handle.write(json.dumps({"format": STATE_FORMAT}) + "\n")
                    for entry in entries:
                        handle.write(json.dumps(_state_line(entry)) + "\n")
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, self.state_file)
            except OSError as exc:
                if not self.save_failing:  # once per failing streak, not once a second
                    log.error("registrations not saved; they live in memory until the state "
                              "file can be written", extra=log_fields(
                                  state_file=str(self.state_file), error=str(exc)))
                self.save_failing = True
                return False
            if self.save_failing:
                log.info("registrations saved again", extra=log_fields(
                    state_file=str(self.state_file)))
            self._saved, self.save_failing = changes, False
            return True

    def restore(self) -> None:
        """Read the registrations a previous process saved, each with the rest of its TTL,
        validated as a POST is and within the store's bounds; a bad line is skipped and
        counted, never fatal."""
        path = self.state_file
        if path is None:
            return
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return
        except (OSError, UnicodeDecodeError) as exc:
            log.error("registrations state file unreadable; starting without it",
                      extra=log_fields(state_file=str(path), error=str(exc)))
            return
        now, loaded, bad, expired, full = self.clock(), 0, 0, 0, 0
        for line in lines[1:]:
            try:
                data = json.loads(line)
                remaining = float(data.pop("expires")) - now
                source = str(data.pop("source"))
                if remaining <= 0:
                    expired += 1
                    continue
                placement, ttl = parse_registration({**data, "ttl_seconds": remaining}, source,
                                                    remaining, float("inf"))
            except (ValueError, TypeError, KeyError, AttributeError):
                bad += 1
                continue
            try:
                self.put(placement, ttl)
                loaded += 1
            except OverflowError:
                full += 1
        log.info("registrations restored", extra=log_fields(
            state_file=str(path), restored=loaded, expired=expired, invalid=bad,
            over_bounds=full))


def _state_line(entry: _Entry) -> dict[str, object]:
    """One registration as the state file holds it: the POST body's fields, its source and
    when it expires."""
    p = entry.placement
    extra = dict(p.extra)
    return {"entity": p.run.entity, "project": p.run.project, "run_id": p.run.run_id,
            "hostname": p.host, "run_name": p.run_name,
            "gpus": [{k: v for k, v in (("index", int(g.index) if g.index else None),
                                        ("uuid", g.uuid)) if v not in (None, "")}
                     for g in p.gpus],
            **{field: extra[label] for field, label in EXTRA.items() if label in extra},
            "source": p.source, "expires": entry.expires}
