"""``python -m bench.run``'s command line: a mistyped option or ``--help`` never runs a benchmark
nor rewrites ``bench/results.json`` (run as the command, since tests/ may not import bench/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.json"


def _bench(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench.run", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("argv", [["--bogus"], ["bridge", "--fast"], ["--markdown", "a", "b"],
                                  ["no_such_benchmark"]])
def test_a_wrong_argument_is_one_line_and_exit_2(argv):
    before = RESULTS.read_bytes()
    done = _bench(*argv)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "nothing run" in done.stderr
    assert RESULTS.read_bytes() == before


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_usage_and_runs_nothing(flag):
    before = RESULTS.read_bytes()
    done = _bench(flag)
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m bench.run")
    assert RESULTS.read_bytes() == before


def test_markdown_prints_a_results_file_as_the_table(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"name": "x", "value": 1.0, "unit": "s", "baseline": None,
                                    "ratio": None, "target": 2.0, "met": True}]))
    done = _bench("--markdown", str(results))
    assert done.returncode == 0 and "| x | 1 | s | - | - | 2 | yes |" in done.stdout
