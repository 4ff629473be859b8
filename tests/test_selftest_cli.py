"""``wandb-infra-bridge selftest`` against the W&B stand-in (harness/wandb_standin.py), with the
bridge's own delivery worker and the real ``wandb`` SDK writing the markers: it passes on a
server that keeps every write, and fails, naming the check, on one that drops a write or shows
a finished run as running again once the marker writer joins it."""

from __future__ import annotations

import pytest
import wandb
import yaml

from harness.wandb_standin import WandbStandin
from wandb_infra.bridge.cli import main

pytestmark = pytest.mark.integration


@pytest.fixture
def wb():
    with WandbStandin() as server:
        server.add_run("team", "proj", "theirs", tags=["keep"])
        yield server
    wandb.teardown()


@pytest.fixture
def config(wb, tmp_path):
    path = tmp_path / "bridge.yaml"
    path.write_text(yaml.safe_dump({"wandb": {"base_url": wb.url, "api_key": wb.api_key}}))
    return path


def _selftest(config, *extra: str) -> int:
    return main(["selftest", "--config", str(config), "team/proj", *extra])


def _rows(out: str) -> dict[str, str]:
    """check name -> pass/FAIL, from the printed table."""
    rows = {}
    for line in out.splitlines()[1:]:
        parts = line.split("  ")
        cells = [p.strip() for p in parts if p.strip()]
        if len(cells) >= 2 and cells[1] in {"pass", "FAIL"}:
            rows[cells[0]] = cells[1]
    return rows


def test_passes_on_a_server_that_keeps_every_write_and_deletes_its_run(wb, config, capsys):
    assert _selftest(config) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert set(rows.values()) == {"pass"}, out
    assert {"tags written", "notes written", "marker written", "marker on the run's step axis",
            "summary written", "config untouched", "state untouched (running)",
            "state untouched (finished)", "end marker written into the finished run",
            "history and summary keys apart", "scratch run deleted"} <= set(rows), out
    assert [r.run_id for r in wb.iter_runs()] == ["theirs"]
    assert wb.run("team", "proj", "theirs").tags == ["keep"]


def test_keep_leaves_the_scratch_run(wb, config, capsys):
    assert _selftest(config, "--keep") == 0
    (scratch,) = [r for r in wb.iter_runs() if r.run_id.startswith("selftest-")]
    assert "infra:GpuXidError" in scratch.tags and scratch.state == "finished"
    assert "scratch run kept" in capsys.readouterr().out


def test_a_dropped_write_fails_with_the_check_that_saw_it(wb, config, capsys):
    wb.lose = {"tags"}
    assert _selftest(config) == 1
    captured = capsys.readouterr()
    rows = _rows(captured.out)
    assert rows["tags written"] == "FAIL" and rows["notes written"] == "pass"
    assert "infra:GpuXidError missing" in captured.out
    assert "selftest FAILED (1 of" in captured.err and "tags written" in captured.err
    assert [r.run_id for r in wb.iter_runs()] == ["theirs"], "deleted even when failing"


def test_a_server_that_revives_a_finished_run_fails_the_state_check(wb, config, capsys):
    wb.revive_on_join = True
    assert _selftest(config) == 1
    captured = capsys.readouterr()
    assert _rows(captured.out)["state untouched (finished)"] == "FAIL"
    assert "W&B shows running: the writer changed the run's state" in captured.out


def test_a_lost_marker_fails_the_marker_checks(wb, config, capsys):
    wb.lose = {"history"}
    assert _selftest(config) == 1
    rows = _rows(capsys.readouterr().out)
    assert rows["marker written"] == "FAIL" and rows["tags written"] == "pass"


def test_refuses_clearly_without_a_key_or_a_project(tmp_path, capsys):
    bare = tmp_path / "bridge.yaml"
    bare.write_text("wandb: {base_url: 'http://127.0.0.1:9'}\n")
    assert main(["selftest", "--config", str(bare), "team/proj"]) == 2
    assert "no W&B key" in capsys.readouterr().err
    assert main(["selftest", "--config", str(bare), "team"]) == 2
    assert "ENTITY/PROJECT" in capsys.readouterr().err
