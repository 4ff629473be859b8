"""``wandb-infra-bridge explain --log FILE --json`` on every real excerpt of ``tests/data/joblog/``:
no Prometheus, no W&B, one JSON object per call. The command line's own parser runs in-process
for each excerpt; the installed console script runs once, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.inprocess import Result, run_main
from wandb_infra.bridge.cli import main

DATA = Path(__file__).resolve().parent / "data" / "joblog"
EXCERPTS = json.loads((DATA / "excerpts.json").read_text())
BRIDGE = str(Path(sys.executable).parent / "wandb-infra-bridge")


def explain(*args: str) -> Result:
    """``wandb-infra-bridge explain ARGS`` through the command line's own entry point."""
    return run_main(main, ["explain", *args])


def test_explain_log_json_gives_each_excerpts_verdict_and_first_line():
    for excerpt in EXCERPTS:
        out = explain("--log", str(DATA / "excerpts" / excerpt["file"]), "--json")
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        expect = excerpt["expect"]
        assert result["verdict"] == expect["verdict"], excerpt["file"]
        first = result["first_error"]
        if expect["line"] is None:
            assert first is None, excerpt["file"]
            continue
        lines = (DATA / "excerpts" / excerpt["file"]).read_text().splitlines()
        assert first["line"] == expect["line"] and len(first["text"]) <= 300
        assert lines[first["line"] - 1].strip().startswith(first["text"].rstrip("…"))
        assert {k: first[k] for k in ("rank", "host", "gpu") if k in expect} == \
            {k: expect[k] for k in ("rank", "host", "gpu") if k in expect}


@pytest.mark.integration
def test_several_logs_and_a_readable_report():
    """The installed console script, as a user runs it."""
    logs = [str(DATA / "excerpts" / name)
            for name in ("ace-348-timeouts-only.log", "jade-194-ecc.log")]
    out = subprocess.run([BRIDGE, "explain", "--log", logs[0], "--log", logs[1]],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Verdict: infrastructure (from the job log)")
    assert "First error: line 1 of " in out.stdout and "jade-194-ecc.log" in out.stdout


def test_an_unreadable_log_is_a_clear_error_and_a_run_needs_prometheus(tmp_path):
    out = explain("--log", str(tmp_path / "missing.log"), "--json")
    assert out.returncode == 2 and "no console log: cannot read" in out.stderr
    assert json.loads(out.stdout)["verdict"] == "unknown"
    out = explain("team/proj/run1")
    assert out.returncode == 2 and "--prometheus" in out.stderr
