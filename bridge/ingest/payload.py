"""Parse and validate an Alertmanager webhook (version 4) body into plain alert records.

Validation is strict on what the bridge relies on (types of ``alerts``, ``labels``, ``status``,
``startsAt``, ``fingerprint``) and lenient on the rest: unknown fields are ignored, so newer
Alertmanager versions keep working. A ``PayloadError`` carries the reason a 400 reports.

Bounds are checked here, at the door, so nothing downstream (date arithmetic, ``int()`` on panel
ids, SQLite text ordering) can raise on stored data: timestamps lie in years 2000-2100, ``endsAt``
is Go's zero value or not before ``startsAt``, panel ids are ASCII digits, and every pattern must
match the whole value (``fullmatch``: ``$`` would accept a trailing newline).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from itertools import chain
from typing import Any

import orjson

from wandb_infra.catalog.vocabulary import ANNOTATION_PANEL_ID

MAX_ALERTS = 100_000
MAX_LABEL_BYTES = 64 * 1024
MIN_YEAR, MAX_YEAR = 2000, 2100
_FINGERPRINT = re.compile(r"[0-9a-fA-F]{1,64}")
_PANEL_ID = re.compile(r"[0-9]{1,9}")
_TIMESTAMP = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|z|[+-]\d{2}:\d{2})"
)
_ZERO_TIME = re.compile(r"0001-01-01[Tt ]00:00:00(\.0+)?(Z|z|\+00:00)")


class PayloadError(ValueError):
    """The body is not a usable Alertmanager notification; the message says why."""


@dataclass(slots=True)
class Alert:
    """One alert as Alertmanager sent it; ``ends_at`` is None while firing. Read-only by
    convention: not frozen, as a frozen dataclass costs five times as much to build, once per
    alert of a storm."""

    fingerprint: str
    status: str
    starts_at: datetime
    ends_at: datetime | None
    labels: dict[str, str]
    annotations: dict[str, str]

    @property
    def alertname(self) -> str:
        """The alert's name ("" if the rule set none)."""
        return self.labels.get("alertname", "")


@dataclass(frozen=True)
class Notification:
    """A parsed webhook body: its alerts plus the fields worth logging."""

    receiver: str
    status: str
    alerts: list[Alert]
    group_key: str
    truncated_alerts: int


def parse_time(value: object, where: str) -> datetime:
    """RFC 3339 with any fractional precision (Go emits nanoseconds) -> aware UTC datetime
    in years 2000-2100 (anything else is a clock or a client gone wrong)."""
    if not isinstance(value, str):
        raise PayloadError(f"{where} must be an RFC 3339 string")
    try:
        return _instant(value)
    except ValueError as exc:
        raise PayloadError(f"{where} {exc}") from None


@lru_cache(maxsize=1024)
def _instant(value: str) -> datetime:
    """``parse_time`` of a string, cached: the alerts of one storm share a few timestamps."""
    m = _TIMESTAMP.fullmatch(value)
    if not m:
        raise ValueError(f"is not an RFC 3339 timestamp: {value[:40]!r}")
    year, month, day, hour, minute, second, frac, zone = m.groups()
    micro = int((frac or ".0")[1:7].ljust(6, "0"))
    iso = f"{year}-{month}-{day}T{hour}:{minute}:{second}.{micro:06d}"
    iso += "+00:00" if zone in ("Z", "z") else zone
    try:
        parsed = datetime.fromisoformat(iso).astimezone(UTC)
    except (ValueError, OverflowError):
        raise ValueError(f"is out of range: {value[:40]!r}") from None
    if not MIN_YEAR <= parsed.year <= MAX_YEAR:
        raise ValueError(f"is outside years {MIN_YEAR}-{MAX_YEAR}: {value[:40]!r}")
    return parsed


class _Invalid(ValueError):
    """One alert's field is unusable; the message starts at the field (``.status ...``) and
    ``parse_notification`` prefixes the alert's index, built only when something failed."""


def _ends_at(value: object, starts_at: datetime, resolved: bool) -> datetime | None:
    """``endsAt``: None for Go's zero value (absent or firing), else a time >= ``startsAt``."""
    if value is None and not resolved:
        return None
    if isinstance(value, str) and _ZERO_TIME.fullmatch(value):
        if resolved:
            raise _Invalid(".endsAt of a resolved alert must be a real time")
        return None
    ends_at = _time(value, ".endsAt")
    if ends_at < starts_at:
        raise _Invalid(".endsAt is before startsAt")
    return ends_at


def _time(value: object, field: str) -> datetime:
    try:
        return parse_time(value, field)
    except PayloadError as exc:
        raise _Invalid(str(exc)) from None


def _string_map(value: object, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Invalid(f"{field} must be an object of strings")
    # Checked in bulk (C loops): a storm's notification has tens of thousands of labels. Keys
    # are strings by JSON; the decoder refused unpaired surrogates already.
    values = value.values()
    if not all(map(str.__instancecheck__, values)):
        key = next(k for k, v in value.items() if not isinstance(v, str))
        raise _Invalid(f"{field}.{key[:40]!r} must be a string")
    if sum(map(len, value)) + sum(map(len, values)) > MAX_LABEL_BYTES:
        raise _Invalid(f"{field} is larger than {MAX_LABEL_BYTES} bytes")
    return value  # shared with the decoded body, not copied: nothing mutates either


def _alert(item: object) -> Alert:
    if not isinstance(item, dict):
        raise _Invalid(" must be an object")
    status = item.get("status")
    if status not in ("firing", "resolved"):
        raise _Invalid(".status must be 'firing' or 'resolved'")
    fingerprint = item.get("fingerprint")
    if not isinstance(fingerprint, str) or not _FINGERPRINT.fullmatch(fingerprint):
        raise _Invalid(".fingerprint must be a hex string")
    labels = _string_map(item.get("labels"), ".labels")
    if not labels:
        raise _Invalid(".labels must not be empty")
    annotations = _string_map(item.get("annotations"), ".annotations")
    panel_id = annotations.get(ANNOTATION_PANEL_ID, "")
    if panel_id and not _PANEL_ID.fullmatch(panel_id):
        raise _Invalid(f".annotations.{ANNOTATION_PANEL_ID} must be ASCII digits")
    starts_at = _time(item.get("startsAt"), ".startsAt")
    ends_at = _ends_at(item.get("endsAt"), starts_at, status == "resolved")
    if status == "firing":
        ends_at = None
    return Alert(fingerprint.lower(), status, starts_at, ends_at, labels, annotations)


# The fields of an alert the bulk path reads, in the order ``_bulk`` unpacks them.
_FIELDS = operator.itemgetter("status", "fingerprint", "labels", "annotations", "startsAt",
                              "endsAt")


def _all_strings(values: Iterable[object]) -> bool:
    """Whether every value is a string (one C loop)."""
    return all(map(str.__instancecheck__, values))


def _string_maps(maps: tuple[Any, ...]) -> bool:
    """Whether every map is a dict of strings within ``MAX_LABEL_BYTES``. Joining all values
    raises on one that is not a string; the size is bounded by entries x (longest key +
    longest value) over all maps, which holds for every real notification, so each map's own
    size is measured only when that bound is exceeded."""
    if not all(map(dict.__instancecheck__, maps)):
        return False
    values = list(chain.from_iterable(map(dict.values, maps)))
    try:
        "".join(values)
    except TypeError:
        return False
    longest = max(map(len, set().union(*maps)), default=0) + max(map(len, values), default=0)
    if max(map(len, maps), default=0) * longest <= MAX_LABEL_BYTES:
        return True
    sizes = map(operator.add, map(len, map("".join, maps)),
                map(len, map("".join, map(dict.values, maps))))
    return max(sizes, default=0) <= MAX_LABEL_BYTES


def _bulk(items: list[Any]) -> list[Alert] | None:
    """Every alert, validated field by field across the whole notification (C loops over
    lists rather than a Python call per alert: a storm brings tens of thousands), or None when
    any check fails; ``_alert`` then names the culprit. Accepts exactly what ``_alert`` accepts,
    except that absent fields and missing annotations also take the per-alert path."""
    if not items or not all(map(dict.__instancecheck__, items)):
        return None
    try:  # every field of every alert in one C pass, then transposed into columns
        statuses, fingerprints, labels, annotations, starts_text, ends_text = zip(
            *map(_FIELDS, items), strict=True)
    except KeyError:
        return None
    if not (_all_strings(statuses) and set(statuses) <= {"firing", "resolved"}
            and _all_strings(fingerprints) and all(map(_FINGERPRINT.fullmatch, fingerprints))):
        return None
    if not (_string_maps(labels) and all(labels) and _string_maps(annotations)):
        return None
    panels = [p for p in map(operator.methodcaller("get", ANNOTATION_PANEL_ID), annotations) if p]
    if not all(map(_PANEL_ID.fullmatch, panels)):
        return None
    if not (_all_strings(starts_text) and set(map(type, ends_text)) <= {str, type(None)}):
        return None
    try:
        instants = {text: _instant(text) for text in set(starts_text)}
        ends_at = {text: None if text is None or _ZERO_TIME.fullmatch(text) else _instant(text)
                   for text in set(ends_text)}
    except ValueError:
        return None
    starts = list(map(instants.__getitem__, starts_text))
    ends = list(map(ends_at.__getitem__, ends_text))
    if "resolved" in statuses or any(ends):
        for start, end, status in zip(starts, ends, statuses, strict=True):
            if (end is None and status == "resolved") or (end is not None and end < start):
                return None
        ends = [end if status == "resolved" else None for end, status in zip(ends, statuses,
                                                                              strict=True)]
    return list(map(Alert, map(str.lower, fingerprints), statuses, starts, ends, labels,
                    annotations))


def _alerts(items: list[object]) -> list[Alert]:
    """Every alert, or a ``PayloadError`` naming the first unusable one."""
    fast = _bulk(items)
    if fast is not None:
        return fast
    try:
        return [_alert(item) for item in items]
    except _Invalid:
        for index, item in enumerate(items):
            try:
                _alert(item)
            except _Invalid as exc:
                raise PayloadError(f"alerts[{index}]{exc}") from None
        raise


def parse_notification(body: bytes | bytearray) -> Notification:
    """Decode and validate a webhook body; raises ``PayloadError`` with the reason."""
    # orjson: a third of the stdlib's decode time on a 1,536-alert body, and strict where the
    # bridge wants it (invalid UTF-8, lone surrogates, NaN, nesting past 1,024 levels raise).
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise PayloadError(f"body is not valid JSON: {exc.msg} at position {exc.pos}") from exc
    if not isinstance(data, dict):
        raise PayloadError("body must be a JSON object")
    version = data.get("version")
    if version is not None and version != "4":
        raise PayloadError(f"unsupported webhook version {str(version)[:10]!r} (expected '4')")
    alerts = data.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("alerts must be a list")
    if len(alerts) > MAX_ALERTS:
        raise PayloadError(f"more than {MAX_ALERTS} alerts in one notification")
    receiver = data.get("receiver", "")
    status = data.get("status", "")
    group_key = data.get("groupKey", "")
    truncated = data.get("truncatedAlerts", 0)
    if not isinstance(receiver, str) or not isinstance(status, str) or not isinstance(
            group_key, str):
        raise PayloadError("receiver, status and groupKey must be strings")
    if not isinstance(truncated, int) or isinstance(truncated, bool) or truncated < 0:
        raise PayloadError("truncatedAlerts must be a non-negative integer")
    parsed = _alerts(alerts)
    return Notification(receiver, status, parsed, group_key, truncated)
