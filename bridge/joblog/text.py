"""One console line made safe and understood: decoded, stripped of terminal codes, redacted when
it looks like a secret, cut to a quotable length, and its launcher prefixes read (rank, host,
GPU, time).

Log text is untrusted: invalid UTF-8 becomes U+FFFD, ANSI colour and cursor codes and other
control characters are dropped, a progress bar's carriage returns split one physical line into the
segments a terminal would have shown, and nothing longer than ``QUOTE_CHARS`` is ever quoted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

QUOTE_CHARS = 300
QUOTE_LINES = 5
LINE_BYTES = 64 * 1024  # a longer physical line is read up to here (no console line is longer)
REDACTED = "[line redacted: it looks like it holds a secret]"

_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")
# Terminal control codes the console capture kept as text (``^[[2;2R``).
_CARET_ESC = re.compile(r"\^\[\[[0-9;>?]*[A-Za-z]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_SECRET = re.compile(
    r"(?i)(wandb_api_key|api[_-]?key\s*[=:]|authorization\s*:|\bbearer\s+[\w.~+/-]{8,}|"
    r"\btoken\s*=|[_-]token\s*[=:]|password\s*[=:]|secret\s*[=:]|\bAKIA[0-9A-Z]{16}\b)")

# Launcher prefixes, each naming what it can.
_NCCL = re.compile(r"(?P<host>[A-Za-z0-9][\w.-]*):(?P<pid>[0-9]+):(?P<tid>[0-9]+) "
                   r"\[(?P<dev>[0-9]+)\]")
_GLOBAL_RANK = re.compile(r"\[rank(?P<rank>[0-9]+)\]:")
_PG_RANK = re.compile(r"\[(?:PG [^\]]*?)?Rank (?P<rank>[0-9]+)\]")
_MPI_TAG = re.compile(r"\[[0-9]+,(?P<rank>[0-9]+)\]<std(?:out|err)>:")
_HOST_RANK = re.compile(r"^\[(?P<host>[A-Za-z][\w.-]*):(?P<rank>[0-9]+)\]:")
_SRUN_LABEL = re.compile(r"^\s{0,4}(?P<task>[0-9]{1,6}): ")
_ISO = re.compile(r"(?P<date>(?:19|20)[0-9]{2}-[01][0-9]-[0-3][0-9])[T ]"
                  r"(?P<clock>[0-2][0-9]:[0-5][0-9]:[0-5][0-9])(?P<frac>[.,][0-9]+)?"
                  r"(?P<tz>Z|[+-][0-2][0-9]:?[0-5][0-9])?")
_GLOG = re.compile(r"(?:^|\]:?\[?)[EWIF][0-9]{3,4} (?P<clock>[0-2][0-9]:[0-5][0-9]:"
                   r"[0-5][0-9])")
_CLOCK = re.compile(r"(?:^|\[)(?P<clock>[0-2][0-9]:[0-5][0-9]:[0-5][0-9])(?:[.,][0-9]+)?\]?\s")
# NCCL's communicator line: which global rank a (host, pid, device) is, and its PCI bus.
COMM_INIT = re.compile(r"comm 0x[0-9a-f]+ rank (?P<rank>[0-9]+) nranks [0-9]+ cudaDev "
                       r"(?P<dev>[0-9]+)(?: nvmlDev [0-9]+)? busId (?P<bus>[0-9a-f]+)")


def segments(raw: bytes) -> list[str]:
    """The clean text segments of one physical line (a ``\\r`` starts a new segment, as on a
    terminal); empty ones dropped; only its first ``LINE_BYTES`` are read, so a binary blob
    without newlines costs no more than a long line."""
    text = raw[:LINE_BYTES].decode("utf-8", "replace")
    out = []
    for part in text.split("\r"):
        clean = _CONTROL.sub("", _CARET_ESC.sub("", _ANSI.sub("", part))).strip()
        if clean:
            out.append(clean)
    return out


def redact(text: str) -> str:
    """``text``, or a marker when it looks like it carries a credential."""
    return REDACTED if _SECRET.search(text) else text


def quote(text: str) -> str:
    """The line as it may be stored or shown: redacted and at most ``QUOTE_CHARS``."""
    text = redact(text)
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS - 1] + "…"


@dataclass(frozen=True)
class Prefix:
    """What a line's prefixes say; None where they say nothing."""

    rank: int | None = None
    host: str | None = None
    gpu: int | None = None
    pid: int | None = None
    task: int | None = None
    clock: str | None = None
    epoch: float | None = None


def _when(text: str) -> tuple[str | None, float | None]:
    """(HH:MM:SS, epoch seconds) of the line's timestamp; the epoch only with a full date
    (assumed UTC without an offset)."""
    m = _ISO.search(text, 0, 80)
    if m:
        tz = m.group("tz") or "+00:00"
        tz = "+00:00" if tz == "Z" else tz if ":" in tz else f"{tz[:3]}:{tz[3:]}"
        try:
            at = datetime.fromisoformat(f"{m.group('date')}T{m.group('clock')}{tz}")
        except ValueError:
            return m.group("clock"), None
        return m.group("clock"), at.astimezone(UTC).timestamp()
    m = _GLOG.search(text, 0, 80) or _CLOCK.search(text, 0, 40)
    return (m.group("clock"), None) if m else (None, None)


def prefix(text: str) -> Prefix:
    """Rank, host, GPU, pid, task and time from the launcher prefixes the line carries."""
    rank = host = gpu = pid = task = None
    if m := _HOST_RANK.match(text):
        host, rank = m.group("host"), int(m.group("rank"))
    if m := _SRUN_LABEL.match(text):
        task = int(m.group("task"))
    if rank is None and (m := (_GLOBAL_RANK.search(text) or _MPI_TAG.search(text)
                               or _PG_RANK.search(text))):
        rank = int(m.group("rank"))
    if m := _NCCL.search(text, 0, 160):
        host, pid, gpu = host or m.group("host"), int(m.group("pid")), int(m.group("dev"))
    clock, epoch = _when(text)
    return Prefix(rank=rank, host=host, gpu=gpu, pid=pid, task=task, clock=clock, epoch=epoch)


def iso(epoch: float) -> str:
    """UTC ISO-8601 with seconds."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
