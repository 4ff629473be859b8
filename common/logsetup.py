"""Structured (JSON lines) logging with secret redaction, shared by both daemons."""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Iterable

_REDACTED = "[REDACTED]"


class SecretFilter(logging.Filter):
    """Replaces every known secret (and anything shaped like an auth header) in a record."""

    _AUTH = re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?)(basic|bearer)\s+[^\s\"',}]+")

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def add(self, secret: str | None) -> None:
        """Register one more secret to scrub (e.g. a key read after start-up)."""
        if secret and len(secret) >= 4 and secret not in self._secrets:
            self._secrets = sorted([*self._secrets, secret], key=len, reverse=True)

    def scrub(self, text: str) -> str:
        """Return ``text`` with secrets and auth headers replaced."""
        for secret in self._secrets:
            text = text.replace(secret, _REDACTED)
        return self._AUTH.sub(lambda m: m.group(1) + m.group(2) + " " + _REDACTED, text)

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self.scrub(record.getMessage())
        record.args = None
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            record.fields = {k: self.scrub(str(v)) for k, v in fields.items()}
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, plus the record's ``fields``."""

    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            payload.update(fields)
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


def setup_logging(level: str = "info", secrets: Iterable[str] = ()) -> SecretFilter:
    """Configure the root logger for JSON output on stderr; returns the filter to add secrets."""
    secret_filter = SecretFilter(secrets)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(secret_filter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return secret_filter


def log_fields(**fields: object) -> dict[str, dict[str, object]]:
    """``logger.info("msg", extra=log_fields(run=..., n=...))`` attaches structured fields."""
    return {"fields": fields}
