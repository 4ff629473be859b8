"""A console script's ``main`` run in-process as its process would run: only the environment it
is given, its output captured, its exit code returned. Starting an interpreter per call costs
seconds (the product's imports), so checks of what a command prints and returns run here; each
console script is still started as a process by at least one test."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple


class Result(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def run_main(main: Callable[[Sequence[str]], int], argv: Sequence[str],
             env: Mapping[str, str] | None = None) -> Result:
    """``main(argv)`` with ``os.environ`` replaced by ``env`` (default: unchanged) for the call."""
    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exc:  # argparse's usage errors and --help
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return Result(code, out.getvalue(), err.getvalue())
