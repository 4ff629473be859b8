"""Ended-run verdicts as plain data: coverage judged on a range query's grid, the verdict from a
diagnosis and coverage, the notes and summary they produce, the store's endings table, and the
configuration's checks."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.views import view_of
from wandb_infra.bridge import config as C
from wandb_infra.bridge.diagnosis.coverage import DCGM, NODE, Coverage, judge
from wandb_infra.bridge.diagnosis.outcome import CLEAR, INCOMPLETE, INFRASTRUCTURE, Outcome
from wandb_infra.bridge.diagnosis.outcome import judge as verdict
from wandb_infra.bridge.diagnosis.root_cause import AlertFact, diagnose
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.projection.notes import render_section
from wandb_infra.bridge.prometheus.confirm import Confirmation
from wandb_infra.bridge.prometheus.endings import targets_query, vanished_query
from wandb_infra.bridge.runs.service import RunService
from wandb_infra.common.configfile import ConfigError
from wandb_infra.common.runkey import RunKey

START = datetime(2026, 11, 29, 10, 2, tzinfo=UTC).timestamp()
END = datetime(2026, 11, 29, 12, 31, tzinfo=UTC).timestamp()
STEP = 60.0
RUN = RunKey("team", "proj", "run1")


def _all(start: float = START, end: float = END) -> list[float]:
    return [start + k * STEP for k in range(int((end - start) // STEP) + 1)]


def _coverage(hosts: int = 2, dark: tuple[str, str, float, float] | None = None) -> Coverage:
    names = [f"gpu-node-{i:03d}" for i in range(1, hosts + 1)]
    gpus = {h: [str(g) for g in range(8)] for h in names}
    targets = {(h, e): _all() for h in names for e in (DCGM, NODE)}
    present = {(h, g): _all() for h in names for g in gpus[h]}
    if dark is not None:
        host, exporter, a, b = dark
        targets[(host, exporter)] = [t for t in _all() if not a <= t < b]
    return judge(names, gpus, start=START, end=END, step=STEP, targets=targets,
                 present=present)


def _fact() -> AlertFact:
    at = datetime.fromtimestamp(START + 3600, UTC)
    return AlertFact("f1", "GpuXidError", at, None, "critical", "gpu_hardware", "gpu-node-001",
                     "3", {"alertname": "GpuXidError", "hostname": "gpu-node-001", "gpu": "3",
                           "xid": "79"})


def test_complete_coverage_is_clear_with_hosts_gpus_and_times():
    cov = _coverage(64)
    assert cov.complete and cov.gpus == 512
    out = verdict(diagnose([]), cov, END, "join series gone")
    assert out.verdict == CLEAR
    assert out.text == ("no GPU, node or link fault on its 64 hosts and 512 GPUs on 2026-11-29 "
                        "from 10:02:00 to 12:31:00 UTC; GPU and host telemetry present "
                        "throughout: likely an application problem")


def test_a_blind_host_is_never_clear():
    a = datetime(2026, 11, 29, 11, 40, tzinfo=UTC).timestamp()
    cov = _coverage(2, ("gpu-node-002", DCGM, a, END + STEP))
    assert not cov.complete
    (blind,) = cov.blind  # the GPUs inside the dark exporter are not listed again
    assert blind.text() == "no GPU telemetry from gpu-node-002 from 11:40:00 to 12:31:00"
    out = verdict(diagnose([]), cov, END, "join series gone")
    assert out.verdict == INCOMPLETE
    assert "no GPU telemetry from gpu-node-002 from 11:40:00 to 12:31:00: a fault there would " \
           "not have been seen" in out.text
    assert out.summary()["infra/verdict"] == INCOMPLETE
    assert out.summary()["infra/blind_windows"] == 1


def test_a_gpu_that_stopped_reporting_and_a_host_never_mapped():
    names = ["h1", "h2"]
    gpus = {"h1": ["0", "1"], "h2": ["0"]}
    targets = {("h1", DCGM): _all(), ("h1", NODE): _all(), ("h2", DCGM): _all()}
    present = {("h1", "0"): _all(), ("h1", "1"): _all(START, START + 600), ("h2", "0"): _all()}
    cov = judge(names, gpus, start=START, end=END, step=STEP, targets=targets, present=present)
    texts = [b.text() for b in cov.blind]
    assert texts == ["no host telemetry from h2 from 10:02:00 to 12:31:00",
                     "no GPU 1 from h1 from 10:13:00 to 12:31:00"]


def test_an_issue_makes_it_infrastructure_whatever_the_coverage():
    cov = _coverage(2, ("gpu-node-002", NODE, START, END))
    out = verdict(diagnose([_fact()]), cov, END, "W&B state crashed")
    assert out.verdict == INFRASTRUCTURE and out.text.startswith("GpuXidError")
    assert out.coverage_line.startswith("seen through: dcgm-exporter and node_exporter of 2 "
                                        "hosts and 16 GPUs")
    assert "gaps: no host telemetry from gpu-node-002" in out.coverage_line


def test_no_placement_left_is_incomplete():
    out = verdict(diagnose([]), None, END, "join series gone")
    assert out.verdict == INCOMPLETE and out.coverage is None
    assert Outcome.loads(out.dumps()) == out


def test_round_trip_and_notes_carry_verdict_and_seen_through():
    cov = _coverage(2)
    out = verdict(diagnose([_fact()]), cov, END, "join series gone")
    assert Outcome.loads(out.dumps()) == out
    section = render_section(view_of(diagnose([_fact()]), outcome=out), lambda *_: "")
    assert "**Verdict: infrastructure**" in section
    # the coverage line in the verdict and in the issue
    plain = section.replace("\\", "")  # whatever the Markdown escaping
    assert plain.count("Seen through: dcgm-exporter and node_exporter of 2 hosts") == 2
    clear = verdict(diagnose([]), cov, END, "join series gone")
    section = render_section(view_of(diagnose([]), outcome=clear), lambda *_: "")
    assert "**Verdict: clear**" in section and "No infrastructure issues recorded" not in section


def test_store_endings_verdicts_and_a_late_alert(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    assert store.add_endings([(RUN, END, "join series gone"), (RunKey(), END, "x")], 1.0) == 1
    assert store.add_endings([(RUN, END + 5, "W&B state crashed")], 2.0) == 0  # first kept
    (pending,) = store.pending_endings(3.0, 10)
    assert pending.how == "join series gone" and pending.verdict is None
    clear = verdict(diagnose([]), _coverage(2), END, pending.how)
    store.record_outcome(RUN, clear.verdict, clear.dumps(), 4.0, deliver=True)
    assert store.pending_endings(5.0, 10) == []
    assert store.outbox(RUN) is not None  # queued for W&B though it has no alerts
    assert [e.run for e in store.endings_page(CLEAR, 10)] == [RUN]
    # an alert stored after the verdict: infrastructure from now on, coverage kept, once the
    # worker judged it again (a view shows the verdict as stored)
    ending = store.ending(RUN)
    assert ending is not None and ending.outcome is not None
    service = RunService(store)
    view = service.assemble(RUN, Confirmation.unchecked([_fact()]),
                            stored=Outcome.loads(ending.outcome))
    assert view.outcome == clear
    late = service.judged(view).outcome
    assert late is not None and late.verdict == INFRASTRUCTURE and late.coverage == clear.coverage
    again = store.ending(RUN)
    assert again is not None and again.verdict == INFRASTRUCTURE
    store.set_scanned_to("endings", 42.0)
    assert store.scanned_to("endings") == 42.0
    store.purge(END + 1)
    assert store.ending(RUN) is None


def test_queries_name_only_the_run_hosts_and_the_grace():
    assert "wandb_run_node_info[360s]" in vanished_query(60, 300)
    assert "unless on" in vanished_query(60, 300)
    assert 'hostname=~"a\\\\.b|c"' in targets_query(["c", "a.b"], 30)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("enabled", "yes", "endings.enabled: must be true or false, not 'yes'"),
    ("grace_seconds", 5, "at least endings.step_seconds"),
    ("max_runs_per_pass", 0, "endings.max_runs_per_pass: must be an integer 1-10000, not 0"),
    ("step_seconds", "30", "endings.step_seconds: must be a number >= 1, not '30'"),
])
def test_endings_options_strictly_validated(key, value, message):
    raw = {s: dict(v) if isinstance(v, dict) else v for s, v in C.DEFAULTS.items()}
    raw["endings"][key] = value
    with pytest.raises(ConfigError, match=message):
        C.build_config(raw, {}, insecure_no_auth=True)


def test_endings_defaults_and_unknown_key():
    raw = {s: dict(v) if isinstance(v, dict) else v for s, v in C.DEFAULTS.items()}
    policy = C.build_config(raw, {}, insecure_no_auth=True).policy.endings
    assert policy is not None and policy.enabled and policy.grace == 300 and \
        policy.lookback == 86400
    raw["endings"]["grace"] = 1
    with pytest.raises(ConfigError,
                       match=r"endings\.grace: unknown key \(known: enabled, grace_seconds, "):
        C.build_config(raw, {}, insecure_no_auth=True)
    listing = "\n".join(C.SCHEMA.help_lines())
    assert all(f"\n  endings.{k} (default " in listing for k in C.DEFAULTS["endings"])


