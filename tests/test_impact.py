"""diagnosis/impact.py on made-up series: a slowdown moves the onset to the measured drop, a hang
spans the busiest GPU's idle time, noise is no effect, a run that ended soon after the fault is a
crash (unless W&B says it finished) and one that ran on is not, the run's GPU-hours do not
count overlapping issues twice, and a metric the run logs itself (mfu) is named where it fell."""

from __future__ import annotations

import pytest

from wandb_infra.bridge.diagnosis.impact import (
    CRASH,
    CRASH_WINDOW,
    HANG,
    MAX_LEAD,
    NONE,
    SLOWDOWN,
    Impact,
    RunMetric,
    Signals,
    change_point,
    measure,
    run_gpu_hours,
    with_run_metric,
)

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


def steps(levels: list[tuple[float, float]], end: float, step: float = 1.0
          ) -> list[tuple[float, float]]:
    """Samples every ``step`` from T0: each (from, value) holds until the next."""
    out, t = [], T0
    while t <= end:
        value = [v for start, v in levels if start <= t][-1]
        out.append((t, value + (0.004 if int(t) % 2 else -0.004)))
        t += step
    return out


def signals(affected, mean=None, top=None, *, gpus=16, run_end=None, state=None) -> Signals:
    return Signals("tensor activity", "gpu-node-065 GPUs 0-3", affected, mean or affected,
                   top or affected, gpus, T0, run_end, state)


def test_a_slowdown_before_the_alert_moves_the_onset_and_costs_until_recovery():
    affected = steps([(T0, 0.50), (T0 + 100, 0.35), (T0 + 400, 0.50)], T0 + 600)
    got = measure(signals(affected), onset=T0 + 110, fired=T0 + 129, ended=T0 + 399,
                  now=T0 + 600)
    assert got.kind == SLOWDOWN and got.drop == pytest.approx(0.30, abs=0.02)
    assert got.text.startswith("tensor activity on gpu-node-065 GPUs 0-3 fell 30% at 08:01:40, "
                               "29 s before the alert")
    assert got.onset == T0 + 100 and "onset moved from 08:01:50" in got.onset_reason
    assert got.until == T0 + 400 and got.until_what == "recovery"
    assert got.gpu_hours == pytest.approx(16 * 300 / 3600)
    assert got.headline.startswith("Slowdown of 30%: ")
    assert got.cost_text == ("1.33 GPU-hours (16 GPUs x 5 min from 08:01:40 until recovery "
                             "at 08:06:40)")


def test_a_change_beyond_the_bounded_window_does_not_move_the_onset():
    affected = steps([(T0, 0.47), (T0 + 10, 0.33)], T0 + 2000)
    got = measure(signals(affected), onset=T0 + 1000, fired=T0 + 1010, ended=None,
                  now=T0 + 2000)
    assert MAX_LEAD < 990  # the drop at +10 s is more than MAX_LEAD before the onset
    assert got.kind == NONE and got.onset == T0 + 1000 and got.gpu_hours == 0.0


def test_a_hang_is_no_gpu_of_the_run_computing():
    busy = steps([(T0, 0.46), (T0 + 60, 0.0), (T0 + 2460, 0.46)], T0 + 3000, step=15)
    got = measure(signals(busy), onset=T0 + 90, fired=T0 + 120, ended=T0 + 2500,
                  now=T0 + 3000)
    assert got.kind == HANG
    assert got.text == "no GPU of the run computed from 08:01:00 to 08:41:00"
    assert got.onset == T0 + 60 and got.until == T0 + 2460
    assert got.gpu_hours == pytest.approx(16 * 2400 / 3600)


def test_an_ongoing_hang_costs_until_now():
    busy = steps([(T0, 0.46), (T0 + 60, 0.0)], T0 + 300)
    got = measure(signals(busy, gpus=512), onset=T0 + 60, fired=T0 + 80, ended=None,
                  now=T0 + 300)
    assert got.kind == HANG and "has computed since 08:01:00" in got.text
    assert got.until_what == "now" and got.gpu_hours == pytest.approx(512 * 240 / 3600)


def test_noise_is_no_visible_effect():
    flat = steps([(T0, 0.46)], T0 + 300)
    got = measure(signals(flat), onset=T0 + 100, fired=T0 + 110, ended=None, now=T0 + 300)
    assert got.kind == NONE and got.gpu_hours == 0.0 and got.onset_reason == ""
    assert got.headline.startswith("No visible effect: no change in the run's GPU activity")


def test_a_run_that_ended_after_the_fault_crashed():
    busy = steps([(T0, 0.46), (T0 + 130, 0.0)], T0 + 130)
    got = measure(signals(busy, run_end=T0 + 130), onset=T0 + 100, fired=T0 + 105,
                  ended=None, now=T0 + 600)
    assert got.kind == CRASH and got.text == ("the run ended at 08:02:10, 30 s after the "
                                              "root cause's onset")
    assert got.gpu_hours == pytest.approx(16 * 30 / 3600)


def test_change_point_needs_samples_on_both_sides():
    assert change_point([(T0, 1.0), (T0 + 1, 0.5)]) is None
    k, before, after = change_point([(T0 + i, 1.0 if i < 5 else 0.5) for i in range(10)])
    assert (k, before, after) == (5, 1.0, 0.5)


def test_run_gpu_hours_counts_overlapping_issues_once():
    def cost(start: float, end: float, gpus: int = 8) -> Impact:
        return Impact(HANG, "", start, "", end, "recovery", gpus,
                      gpus * (end - start) / 3600)
    assert run_gpu_hours([cost(0, 3600), cost(1800, 5400), cost(7200, 9000)]) == \
        pytest.approx(8 * 1.5 + 8 * 0.5)


def test_a_run_that_ended_after_its_issue_did_not_crash_of_it():
    affected = steps([(T0, 0.50), (T0 + 100, 0.25), (T0 + 200, 0.50)], T0 + 300)
    got = measure(signals(affected, run_end=T0 + 300), onset=T0 + 100, fired=T0 + 110,
                  ended=T0 + 210, now=T0 + 600)
    assert got.kind == SLOWDOWN and got.until == T0 + 200 and got.until_what == "recovery"


@pytest.mark.parametrize("state", [None, "finished"])
def test_a_long_slowdown_on_a_run_that_finished_is_not_a_crash(state):
    """A 2-hour thermal slowdown, the run finishing normally with the alert still firing (it
    resolves when the join series go): a slowdown until the run's end, never a crash."""
    end = T0 + 100 + 7200
    affected = steps([(T0, 0.46), (T0 + 100, 0.30)], end, step=15)
    got = measure(signals(affected, gpus=504, run_end=end, state=state), onset=T0 + 110,
                  fired=T0 + 170, ended=end + 30, now=end + 600)
    assert got.kind == SLOWDOWN, got
    assert got.until == end and got.until_what == "the run's end"


@pytest.mark.parametrize("state", [None, "finished"])
def test_a_fault_with_no_effect_on_a_run_that_ended_later_is_no_effect(state):
    """An XID 94 that left the GPUs computing; the run ended 10 minutes later (its alert
    resolving with the join series): no visible effect, no GPU-hours."""
    end = T0 + 100 + 600
    assert end - (T0 + 100) > CRASH_WINDOW
    busy = steps([(T0, 0.46)], end)
    got = measure(signals(busy, run_end=end, state=state), onset=T0 + 100, fired=T0 + 100,
                  ended=end + 20, now=end + 300)
    assert got.kind == NONE and got.gpu_hours == 0.0, got
    assert got.until_what == "the run's end"


def test_a_run_wandb_says_finished_did_not_crash_even_right_after_the_fault():
    busy = steps([(T0, 0.46)], T0 + 130)
    got = measure(signals(busy, run_end=T0 + 130, state="finished"), onset=T0 + 100,
                  fired=T0 + 105, ended=None, now=T0 + 600)
    assert got.kind == NONE and got.gpu_hours == 0.0
    crashed = measure(signals(busy, run_end=T0 + 130, state="crashed"), onset=T0 + 100,
                      fired=T0 + 105, ended=None, now=T0 + 600)
    assert crashed.kind == CRASH


def test_a_run_that_stopped_computing_and_ended_later_hung_until_its_end():
    """Ranks waiting on a dead peer until NCCL's watchdog ends the job 10 minutes on: the run
    ended outside the crash window, so it is the hang, costed until the run's end."""
    end = T0 + 130 + 600
    busy = steps([(T0, 0.46), (T0 + 130, 0.0)], end, step=15)
    got = measure(signals(busy, run_end=end), onset=T0 + 120, fired=T0 + 125, ended=None,
                  now=end + 300)
    assert got.kind == HANG, got
    assert got.text == "no GPU of the run computed from 08:02:15 until the run ended at 08:12:10"
    assert got.until == end and got.until_what == "the run's end"


def _flat_gpus() -> Impact:
    """The GPU-signal measurement of an issue whose GPUs showed nothing."""
    flat = steps([(T0, 0.50)], T0 + 600)
    return measure(signals(flat), onset=T0 + 110, fired=T0 + 129, ended=None, now=T0 + 600)


def test_the_runs_own_mfu_falling_is_named_and_moves_the_onset():
    gpu = _flat_gpus()
    assert gpu.kind == NONE
    mfu = RunMetric("mfu", steps([(T0, 0.42), (T0 + 100, 0.29), (T0 + 400, 0.42)], T0 + 600,
                                 step=5.0))
    got = with_run_metric(gpu, mfu, onset=T0 + 110, fired=T0 + 129, ended=T0 + 399,
                          not_before=T0, now=T0 + 600)
    assert got.kind == SLOWDOWN and got.drop == pytest.approx(0.31, abs=0.02)
    assert got.text == "the run's own mfu fell 31% at 08:01:40, 29 s before the alert"
    assert got.headline.startswith("Slowdown of 31%: the run's own mfu fell")
    assert got.signal == "own mfu" and "the run's own mfu changed then" in got.onset_reason
    assert got.onset == T0 + 100 and got.until == T0 + 400 and got.until_what == "recovery"
    assert got.gpu_hours == pytest.approx(16 * 300 / 3600)


def test_the_runs_own_throughput_stopping_is_a_hang_and_follows_the_gpus_slowdown():
    affected = steps([(T0, 0.50), (T0 + 100, 0.35)], T0 + 600)
    gpu = measure(signals(affected), onset=T0 + 110, fired=T0 + 129, ended=None, now=T0 + 600)
    assert gpu.kind == SLOWDOWN
    tps = RunMetric("tokens_per_s", [(t, 0.0 if t >= T0 + 100 else 12_000.0)
                                     for t in range(int(T0), int(T0) + 600, 10)])
    got = with_run_metric(gpu, tps, onset=T0 + 110, fired=T0 + 129, ended=None,
                          not_before=T0, now=T0 + 600)
    assert got.kind == HANG and got.headline.startswith(
        "Hang: the run's own tokens_per_s stopped at 08:01:40, 29 s before the alert "
        "(from 1.2e+04 to 0); tensor activity on gpu-node-065")
    assert got.until == T0 + 600 and got.until_what == "now"


def test_a_flat_or_noisy_run_metric_keeps_the_gpu_measurement():
    gpu = _flat_gpus()
    for series in (steps([(T0, 0.42)], T0 + 600, step=5.0),  # no change
                   steps([(T0, 0.42), (T0 + 100, 0.40)], T0 + 600, step=5.0),  # under 10 %
                   [(T0 + 100.0, 0.42), (T0 + 200.0, 0.1)]):  # too few samples
        assert with_run_metric(gpu, RunMetric("mfu", series), onset=T0 + 110, fired=T0 + 129,
                               ended=None, not_before=T0, now=T0 + 600) is gpu


def test_a_crash_or_a_gpu_hang_stands_over_a_metric_slowdown():
    mfu = RunMetric("mfu", steps([(T0, 0.42), (T0 + 100, 0.29)], T0 + 600, step=5.0))
    top = steps([(T0, 0.5), (T0 + 100, 0.0)], T0 + 600)
    hang = measure(signals(top, top=top), onset=T0 + 110, fired=T0 + 129, ended=None,
                   now=T0 + 600)
    crash = measure(signals(steps([(T0, 0.5)], T0 + 200), run_end=T0 + 200), onset=T0 + 110,
                    fired=T0 + 129, ended=None, now=T0 + 600)
    assert (hang.kind, crash.kind) == (HANG, CRASH)
    for gpu in (hang, crash):
        assert with_run_metric(gpu, mfu, onset=T0 + 110, fired=T0 + 129, ended=None,
                               not_before=T0, now=T0 + 600) is gpu


def test_a_run_metric_change_before_the_window_is_not_the_issue():
    gpu = _flat_gpus()
    early = RunMetric("mfu", steps([(T0, 0.42), (T0 + 50, 0.29)], T0 + 2000, step=5.0))
    got = with_run_metric(gpu, early, onset=T0 + 1300, fired=T0 + 1319, ended=None,
                          not_before=T0, now=T0 + 2000)
    assert got is gpu
