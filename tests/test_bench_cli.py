"""``python -m bench.run``'s command line: a mistyped option or ``--help`` never runs a benchmark
nor rewrites ``bench/results.json``."""

from __future__ import annotations

import json

import pytest

from bench import run


@pytest.fixture
def results(tmp_path, monkeypatch):
    """A copy of the tree's layout with one results.json whose bytes the test compares."""
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "bench_fake.py").write_text("")
    path = tmp_path / "bench" / "results.json"
    path.write_text(json.dumps([{"name": "x", "value": 1.0, "unit": "s", "baseline": None,
                                 "ratio": None, "target": None, "met": None,
                                 "bench": "bench_fake"}]) + "\n")
    monkeypatch.setattr(run, "ROOT", tmp_path)
    return path


@pytest.mark.parametrize("argv", [["--bogus"], ["bridge", "--fast"], ["--markdown", "x"],
                                  ["no_such_benchmark"]])
def test_a_wrong_argument_is_one_line_and_exit_2(results, capsys, argv):
    before = results.read_bytes()
    assert run.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "nothing run" in err
    assert results.read_bytes() == before


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_usage_and_runs_nothing(results, capsys, flag):
    before = results.read_bytes()
    assert run.main([flag]) == 0
    assert capsys.readouterr().out.startswith("usage: python -m bench.run")
    assert results.read_bytes() == before


def test_markdown_prints_the_table_of_the_last_run(results, capsys):
    assert run.main(["--markdown"]) == 0
    assert "| x | 1 | s | - | - | - | - |" in capsys.readouterr().out
