"""The demo's pure parts: rule scaling keeps for/for_seconds in step, MFU from dcgm text, the
MFU drop window, and the terminal report."""

from __future__ import annotations

import pytest
import yaml

from demo.stack import RULES_FILE, scale_rules, scale_windows
from demo.trainer import TrainingJob, host_mfu
from wandb_infra.catalog.alerts import ALERTS, duration_seconds


def test_duration_parsing():
    assert duration_seconds("1m30s") == 90
    assert duration_seconds("2h") == 7200
    assert duration_seconds("250ms") == 0.25
    for bad in ("", "5", "5x", "m5"):
        with pytest.raises(ValueError, match="Prometheus duration"):
            duration_seconds(bad)


def test_scaled_rules_keep_for_and_the_for_seconds_annotation_in_step():
    scaled = yaml.safe_load(scale_rules(RULES_FILE.read_text(), 0.1))
    shipped = yaml.safe_load(RULES_FILE.read_text())
    checked = 0
    for group, original in zip(scaled["groups"], shipped["groups"], strict=True):
        assert ("interval" in group) == ("interval" in original)
        if "interval" in group:
            assert duration_seconds(group["interval"]) == round(
                duration_seconds(original["interval"]) * 0.1)
        for rule, before in zip(group["rules"], original["rules"], strict=True):
            assert rule["expr"] == before["expr"]
            if "for" not in rule:
                continue
            assert duration_seconds(rule["for"]) == round(duration_seconds(before["for"]) * 0.1)
            assert rule["annotations"]["for_seconds"] == str(round(duration_seconds(rule["for"])))
            assert before["annotations"]["for_seconds"] == str(ALERTS[rule["alert"]].for_seconds)
            checked += 1
    assert checked >= 10


def test_scaled_windows_keep_four_scrapes_and_scale_subqueries_and_offsets():
    expr = "rate(x[5m]) > 0.1 and max_over_time(y[1h:30s] offset 10m) unless z[2m]"
    assert scale_windows(expr, 1 / 60, 1) == (
        "rate(x[5s]) > 0.1 and max_over_time(y[60s:1s] offset 10s) unless z[4s]")
    assert scale_windows(expr, 0.1, 2) == (
        "rate(x[30s]) > 0.1 and max_over_time(y[360s:3s] offset 60s) unless z[12s]")
    scaled = yaml.safe_load(scale_rules(RULES_FILE.read_text(), 1 / 60, scrape_seconds=1))
    exprs = [str(r["expr"]) for g in scaled["groups"] for r in g["rules"]]
    assert not any(w in e for e in exprs for w in ("[5m]", "[10m]", "[1h]"))


def test_host_mfu_follows_tensor_activity_and_clock():
    busy = ('DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0"} 0.46\nDCGM_FI_DEV_SM_CLOCK{gpu="0"} 1980\n'
            'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="1"} 0.46\nDCGM_FI_DEV_SM_CLOCK{gpu="1"} 1980\n')
    hot = busy.replace("1980", "990").replace("0.46", "0.21")
    assert host_mfu(busy) == pytest.approx(0.52)
    assert host_mfu(hot) == pytest.approx(0.52 * (0.21 / 0.46) * 0.5)
    assert host_mfu("") == 0.0


def test_drop_window_brackets_the_low_period():
    job = TrainingJob("e", "p", "r", ["h"], [0], "http://x", "http://y", "t", workdir=None)
    job.samples = [(float(t), 0.5) for t in range(10)] + [(10.0, 0.1), (11.0, 0.1),
                                                          (12.0, 0.5)]
    assert job.drop_window() == (10.0, 11.0)
    job.samples = [(0.0, 0.5), (1.0, 0.5), (2.0, 0.5)]
    assert job.drop_window() is None
    # a drop lasting most of the run (the demo's thermal scenario) is still a drop; a single
    # spike is not the healthy level
    job.samples = ([(float(t), 0.5) for t in range(4)] + [(4.0, 0.9)]
                   + [(float(t), 0.1) for t in range(5, 60)] + [(60.0, 0.5)])
    assert job.drop_window() == (5.0, 59.0)
