"""What a long-running command becomes on its first SIGINT or SIGTERM: ``os.execve`` into this
module ends every thread of the command at once, then every process it started is stopped, and
its pid exits with the signal's status (128 + the signal's number).

Stopping from inside the command leaves a race no sweep can close: another thread may be inside
a library that is starting a process (the wandb SDK starts its service from ``wandb.init``), so
a process could start after the last sweep and outlive the command. After the exec no thread of
the command is left to start anything. Run as
``python -m harness.sweep VARIABLE VALUE STATUS``: ``VARIABLE=VALUE`` is the mark the command
set in its environment before starting anything (``processes.stop_descendants``)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from harness import processes

ROOT = Path(__file__).resolve().parent.parent


def become(mark: tuple[str, str], status: int) -> None:
    """Replace this process by the sweep (never returns). If the exec itself fails, sweep from
    here and exit: the race above stays open, but nothing is left that was seen running."""
    env = {k: v for k, v in os.environ.items() if k != mark[0]}
    env["PYTHONPATH"] = str(ROOT)
    try:
        os.execve(sys.executable,  # noqa: S606 (this interpreter, a fixed argv)
                  [sys.executable, "-m", "harness.sweep", *mark, str(status)], env)
    except OSError:
        processes.stop_descendants(mark=mark)
        os._exit(status)


def main(argv: Sequence[str]) -> int:
    variable, value, status = argv
    # already stopping: a second Ctrl-C must not cut the sweep short and leave services running
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    processes.stop_descendants(mark=(variable, value))
    print("stopped", file=sys.stderr, flush=True)
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
