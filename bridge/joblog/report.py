"""The reading as ``explain --log`` shows it: one JSON object, or a short readable report.

Only matched lines leave the bridge (at most five, each cut to 300 characters and redacted when
they look like secrets), never the whole log.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from wandb_infra.bridge.joblog.join import Joined, join
from wandb_infra.bridge.joblog.reading import Budget, Reading
from wandb_infra.bridge.joblog.sources import DEFAULT_BUDGET, FileSource, read


def as_json(reading: Reading, joined: Joined) -> dict[str, Any]:
    """The reading's JSON with the joined verdict and statement on top."""
    return {**reading.as_dict(), **joined.as_dict()}


def render(reading: Reading, joined: Joined) -> str:
    """A readable report: verdict, statement, the first error's place, quotes, sources."""
    out = [f"Verdict: {joined.verdict}" + (f" (from the {joined.basis})" if joined.basis else ""),
           joined.statement]
    first = reading.first_error
    if first is not None:
        out.append(f"First error: line {first.line} of {first.source} "
                   f"({first.signature}, {first.cls})")
    if (lr := reading.launcher) is not None:
        out.append(f"torchrun's first observed failure: rank {lr.rank} on {lr.host}, exit "
                   f"code {lr.exitcode}, at {lr.time}")
    if reading.cascade_lines:
        out.append(f"Consequences: {reading.cascade_lines} line(s); {reading.cascade_ranks} "
                   f"rank(s) and {reading.cascade_hosts} host(s) showed only consequences")
    if reading.span:
        out.append(f"Time span: {reading.span[0]} .. {reading.span[1]}")
    out += [f"  > {q}" for q in reading.quotes]
    for src in reading.sources:
        state = src.error or f"{src.lines} line(s), {src.bytes} byte(s)" + (
            " (the read budget cut it: only its end was read)" if src.cut else "")
        out.append(f"Log {src.name}: {state}")
    return "\n".join(out)


def explain_logs(paths: Sequence[str], as_json_out: bool, budget: Budget = DEFAULT_BUDGET) -> int:
    """``explain --log FILE...`` without a run: print the reading; exit 2 when no file could be
    read."""
    reading = read([FileSource(p) for p in paths], budget)
    joined = join(reading, None)
    print(json.dumps(as_json(reading, joined), indent=2) if as_json_out
          else render(reading, joined))
    if all(s.error for s in reading.sources):
        for src in reading.sources:
            print(f"wandb-infra-bridge explain: {src.error}", file=sys.stderr)
        return 2
    return 0
