"""The notes section: user's notes preserved byte for byte, idempotent, injection-proof; measured
impacts as the notes, the W&B summary, the run page and /runs show them, with the GPU-hours kept
in the store across a restart."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from harness.bridge_payloads import T0, cascade, notification, serve_app
from harness.wandb_standin import WandbStandin
from tests.budget import examples
from tests.pages_helpers import HTML, MEASURED_AT, FakePrometheus, cascade_bridge
from tests.views import user_part, view_of
from wandb_infra.bridge.diagnosis.impact import HANG, SLOWDOWN, Impact, Signals, measure, unmeasured
from wandb_infra.bridge.diagnosis.links import GrafanaLinks
from wandb_infra.bridge.diagnosis.root_cause import AlertFact, Diagnosis, diagnose
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.metrics import BridgeMetrics
from wandb_infra.bridge.projection.delivery import DeliveryPolicy, DeliveryWorker
from wandb_infra.bridge.projection.notes import (
    BEGIN,
    END,
    md_escape,
    render_section,
    replace_section,
)
from wandb_infra.bridge.projection.plan import impact_entries
from wandb_infra.bridge.projection.wandb_client import (
    STEP_NEAR,
    STEP_READS,
    STEP_SAMPLES,
    RunStep,
    WandbClient,
)
from wandb_infra.common.runkey import RunKey


def _link(_fact, _start, _end) -> str:
    return "https://grafana.example/d/x/y?orgId=1&viewPanel=20"


def _diagnosis(**annotations: str) -> Diagnosis:
    fact = AlertFact("abcd", "GpuXidError", T0, T0 + timedelta(minutes=1), "critical",
                     "gpu_hardware", "node1", "3", {}, {"summary": "XID.", **annotations})
    return diagnose([fact])


@given(st.text())
@settings(max_examples=examples(300), deadline=None)
def test_user_notes_preserved_byte_for_byte(user: str):
    section = render_section(view_of(_diagnosis()), _link)
    once = replace_section(user, section)
    twice = replace_section(once, section)
    assert once == twice
    assert once.startswith(user)
    newer = render_section(view_of(_diagnosis(description="changed")), _link)
    updated = replace_section(once, newer)
    assert updated.startswith(user) and newer in updated and section not in updated


def test_text_the_user_adds_after_the_section_survives():
    section = render_section(view_of(_diagnosis()), _link)
    notes = replace_section("mine\r\n  ", section) + "\n\nlater note ✓"
    updated = replace_section(notes, render_section(view_of(_diagnosis(impact="x")), _link))
    assert updated.startswith("mine\r\n  ") and updated.endswith("\n\nlater note ✓")
    assert user_part(updated) == user_part(notes)
    assert updated.count(BEGIN) == 1 and updated.count(END) == 1


def test_label_text_cannot_inject_markup():
    evil = ("<script>alert(1)</script> [click](javascript:alert(1)) ![img](http://x/y.png) "
            "# heading\n- list\x00\x1b[31m <!-- wandb-infra-bridge:end --> http://phish.example")
    section = render_section(
        view_of(_diagnosis(description=evil, impact=evil, remediation=evil)), _link)
    assert "<script>" not in section and "&lt;script&gt;" in section
    # inert: no unescaped "](" can form a link, no "![" an image (the bridge's own Grafana link
    # is the one link of the section)
    assert re.findall(r"(?<!\\)\]\(", section) == ["]("] and "[Open in Grafana](" in section
    assert "![img]" not in section
    assert section.count(END) == 1 and "\x00" not in section and "\x1b" not in section
    # no autolink either: the URL stays text ("http:\/\/" renders as "http://", unlinked)
    assert "http://phish" not in section and "http:\\/\\/phish.example" in section
    assert md_escape("see www.evil.example") == "see www\\.evil.example"
    body = section.split("\n")
    assert not any(line.startswith(("# heading", "- list")) for line in body)
    assert md_escape("a_b*c") == "a\\_b\\*c"
    # readable: host names, times and prose are not escaped
    assert md_escape("gpu-node-017 at 2026-12-01 18:47:23 (GPU 3).") == \
        "gpu-node-017 at 2026-12-01 18:47:23 (GPU 3)."


def test_section_lists_what_the_drawer_needs():
    section = render_section(view_of(_diagnosis(
        description="XID 79 on GPU 3", impact="Run crashes.", remediation="Drain node1.")), _link)
    for text in ("GpuXidError", "node1 GPU 3", "2026-11-29 12:00:00 UTC",
                 "XID 79 on GPU 3", "Run crashes.", "Drain node1.",
                 "https://grafana.example/d/x/y?orgId=1&viewPanel=20", "resolved"):
        assert text in section, text


def test_catalog_texts_fill_in_missing_annotations():
    fact = AlertFact("abcd", "GpuContainedEccError", T0, None, "critical", "gpu_hardware",
                     "node1", "3", {}, {})
    section = render_section(view_of(diagnose([fact])), _link)
    assert "Impact on this run:" in section and "What to do:" in section


# --- the run's step at an issue's onset, read from its W&B history (the stand-in) -------------

def _log(wb, run: str, rows: list[dict]) -> None:
    """Append history rows through ``file_stream``, as the wandb SDK does (the stand-in numbers
    ``_step`` in arrival order, like the shared run's history)."""
    lines = [json.dumps(r) for r in rows]
    resp = requests.post(f"{wb.url}/files/team/proj/{run}/file_stream", timeout=5,
                         auth=("api", wb.api_key),
                         json={"files": {"wandb-history.jsonl": {"offset": 0, "content": lines}}})
    assert resp.status_code == 200, resp.text


@pytest.fixture
def wb():
    with WandbStandin() as server:
        for run in ("r1", "long", "empty", "quiet"):
            server.add_run("team", "proj", run)
        yield server


ONSET = T0.timestamp() + 55.5


def _steps(wb, client, run, onset=ONSET):
    info = client.find_run("team", "proj", run)
    return client.steps_at(info, "team", "proj", run, {"issue": onset})


def test_the_notes_say_at_which_step_the_issue_began(wb):
    # a trainer logging every 10 s, then the bridge's own marker row stamped with the onset
    _log(wb, "r1", [{"loss": 1.0 / (i + 1), "_timestamp": T0.timestamp() + 10 * i}
                    for i in range(9)])
    _log(wb, "r1", [{"infra/issue": 1, "infra/issue_alert": "GpuXidError",
                     "_timestamp": ONSET}])
    client = WandbClient(wb.url, wb.api_key, timeout=5)
    steps = _steps(wb, client, "r1")
    # step 5 (logged at +50 s) is the last before the onset; the marker row (step 9) is not
    assert steps == {"issue": RunStep(5, T0.timestamp() + 50, True)}
    [call] = wb.calls("BridgeSampledHistory")
    specs = [json.loads(s) for s in call.variables["specs"]]
    assert specs[0]["keys"] == ["_step", "_timestamp"] and specs[0]["maxStep"] == 10
    # settled (the run logged past the onset): not read again
    assert _steps(wb, client, "r1") == steps and len(wb.calls("BridgeSampledHistory")) == 1
    diagnosis = _diagnosis()
    section = render_section(view_of(diagnosis), _link,
                             steps={diagnosis.issues[0].key: steps["issue"]})
    assert ("- Began at step 5 of the run (its last step logged before the onset, at "
            "2026-11-29 12:00:50 UTC)") in section
    assert "Began at step" not in render_section(view_of(diagnosis), _link)


def test_a_long_history_is_narrowed_not_read_whole(wb):
    _log(wb, "long", [{"mfu": 0.5, "_timestamp": T0.timestamp() + i} for i in range(2500)])
    client = WandbClient(wb.url, wb.api_key, timeout=5)
    onset = T0.timestamp() + 1234.5
    assert _steps(wb, client, "long", onset)["issue"].step == 1234
    calls = wb.calls("BridgeSampledHistory")
    assert 2 <= len(calls) <= STEP_READS
    last = json.loads(calls[-1].variables["specs"][0])
    assert last["maxStep"] - last["minStep"] < STEP_SAMPLES  # the last read held every row


def test_no_step_without_history_near_the_onset_and_a_failed_read_is_no_failure(wb):
    client = WandbClient(wb.url, wb.api_key, timeout=5)
    assert _steps(wb, client, "empty") == {}
    assert wb.calls("BridgeSampledHistory") == []  # a run that logged nothing costs no read
    _log(wb, "quiet", [{"loss": 1.0, "_timestamp": ONSET - STEP_NEAR - 1}])
    assert _steps(wb, client, "quiet") == {}  # its last step is too long before the onset
    _log(wb, "quiet", [{"loss": 0.9, "_timestamp": ONSET + 1}])
    fresh = WandbClient(wb.url, wb.api_key, timeout=5)  # nothing cached
    assert _steps(wb, fresh, "quiet") == {}  # and the next one is after it
    _log(wb, "r1", [{"loss": 1.0, "_timestamp": ONSET - 1}])
    wb.fail(500, None, operation="BridgeSampledHistory")
    assert _steps(wb, client, "r1") == {}  # logged, the notes go out without the step
    wb.clear_faults()
    assert _steps(wb, client, "r1") == {}  # not read again before STEP_RETRY


def test_delivery_writes_the_step_into_the_runs_notes(tmp_path, wb):
    """Through the delivery worker: the XID 94 cascade's notes in the stand-in name the step the
    trainer had logged at the issue's onset (T0, the alert's start)."""
    _log(wb, "r1", [{"loss": 1.0, "_timestamp": T0.timestamp() - 60 + 7 * i} for i in range(20)])
    store = Store(tmp_path / "bridge.sqlite")
    worker = DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                            markers=None, links=GrafanaLinks("https://grafana.example"),
                            metrics=BridgeMetrics(), policy=DeliveryPolicy(flush_interval=0),
                            clock=lambda: T0.timestamp() + 300, seed=1)
    body = json.dumps(notification(cascade(hosts=2, gpus=1, run="r1"))).encode()
    store.ingest(parse_notification(body), T0.timestamp() + 60)
    assert worker.run_once() == 1
    notes = wb.run("team", "proj", "r1").notes
    # steps at -60 + 7 i s: step 8 (T0 - 4 s) is the last at or before T0
    assert "- Began at step 8 of the run (its last step logged before the onset, at " \
           "2026-11-29 11:59:56 UTC)" in notes


# --- measured impacts as shown: notes, summary, run page, /runs ------------------------------

def _slowdown(diagnosis: Diagnosis) -> Impact:
    """The issue's impact measured on made-up samples: 50% tensor activity falling to 35% 20 s
    before the alert (T0) and back 5 minutes later, on a 16-GPU run."""
    base = T0.timestamp() - 300
    level = [(base + i, 0.50 if i < 280 or i >= 580 else 0.35) for i in range(900)]
    issue = diagnosis.issues[0]
    return measure(Signals("tensor activity", "node1 GPU 3", level, level, level, 16, base),
                   onset=issue.root.onset.timestamp(), fired=issue.root.starts_at.timestamp(),
                   ended=issue.ended_at.timestamp(), now=base + 900)


def test_notes_and_summary_carry_the_measured_impact_and_its_cost():
    diagnosis = _diagnosis(impact="Run crashes.")
    key = diagnosis.issues[0].key
    impact = _slowdown(diagnosis)
    assert impact.kind == SLOWDOWN
    section = render_section(view_of(diagnosis, impacts={key: impact}), _link)
    for line in ("GPU-hours lost by this run: **1.33**",
                 "- Impact on this run (measured): Slowdown of 30%: tensor activity on node1 "
                 "GPU 3 fell 30% at 11:59:40, 20 s before the alert",
                 "- Expected from this fault: Run crashes.",
                 "- GPU-hours lost: 1.33 GPU-hours (16 GPUs x 5 min from 11:59:40 until "
                 "recovery at 12:04:40)",
                 "- Onset: Onset moved from 12:00:00"):
        assert line in section, (line, section)
    assert impact_entries(diagnosis, {key: impact}) == {"infra/gpu_hours_lost": 1.333,
                                                        "infra/impact": "slowdown"}
    # not measured: the catalog's prose, no cost, nothing in the summary
    unread = {key: unmeasured("Prometheus down", T0.timestamp())}
    plain = render_section(view_of(diagnosis, impacts=unread), _link)
    assert "- Impact on this run: Run crashes." in plain and "GPU-hours" not in plain
    assert impact_entries(diagnosis, unread) == {}


class _Measured:
    """The impact reader as the worker sees it: every issue hung the run's 16 GPUs for 5
    minutes; remembers the W&B state it was given."""

    def __init__(self) -> None:
        self.states: list[str | None] = []

    def for_diagnosis(self, _run: RunKey, diagnosis: Diagnosis,
                      state: str | None = None) -> dict[str, Impact]:
        self.states.append(state)
        start = T0.timestamp() + 40
        return {i.key: Impact(HANG, "no GPU of the run computed from 12:00:40 to 12:05:40",
                              start, "", start + 300, "recovery", 16, 16 * 300 / 3600)
                for i in diagnosis.issues}


GAUGE = 'wandb_infra_bridge_gpu_hours_lost{entity="team",project="proj"} 1.333'


def test_delivery_writes_measured_impacts_and_the_gpu_hours_survive_a_restart(tmp_path, wb):
    wb.set_state("team", "proj", "r1", "crashed")
    path = tmp_path / "bridge.sqlite"
    store, metrics = Store(path), BridgeMetrics()
    worker = DeliveryWorker(store, client=WandbClient(wb.url, wb.api_key, timeout=5),
                            markers=None, links=GrafanaLinks("https://grafana.example"),
                            metrics=metrics, policy=DeliveryPolicy(flush_interval=0),
                            clock=lambda: T0.timestamp() + 400, seed=1)
    reader = worker.projector.impact = _Measured()
    body = json.dumps(notification(cascade(hosts=2, gpus=1, run="r1"))).encode()
    store.ingest(parse_notification(body), T0.timestamp() + 60)
    assert worker.run_once() == 1
    rec = wb.run("team", "proj", "r1")
    assert "- Impact on this run (measured): Hang: no GPU of the run computed from 12:00:40 " \
           "to 12:05:40" in rec.notes
    assert "GPU-hours lost by this run: **1.33**" in rec.notes
    assert rec.summary["infra/gpu_hours_lost"] == 1.333 and rec.summary["infra/impact"] == "hang"
    run = RunKey("team", "proj", "r1")
    assert store.gpu_hours(run) == 1.333
    assert GAUGE in generate_latest(metrics.registry).decode()
    # the next projection knows the run's W&B state (a finished run is never a crash)
    body = json.dumps(notification(cascade(hosts=3, gpus=1, run="r1"))).encode()
    store.ingest(parse_notification(body), T0.timestamp() + 90)
    worker.run_once()
    assert reader.states == [None, "crashed"]
    store.close()
    # a restarted bridge: nothing measured yet, the figures are back from the store
    again = BridgeMetrics()
    DeliveryWorker(Store(path), client=None, markers=None, links=GrafanaLinks(""),
                   metrics=again, policy=DeliveryPolicy())
    assert GAUGE in generate_latest(again.registry).decode()


def test_run_page_and_runs_list_show_the_measured_gpu_hours(tmp_path):
    """The 64-host cascade measured by the real reader on the fake Prometheus: no GPU computed
    since the first stall, so the run's 512 GPUs are lost from the XID 94's onset (T0) until
    ``MEASURED_AT``, 10 minutes: 85.3 GPU-hours, on the run page and in /runs."""
    with serve_app(FakePrometheus().app()) as prom_url, \
            cascade_bridge(tmp_path, prom_url, measured=True) as running:
        page = requests.get(running.url + "/runs/team/proj/cascade1", headers=HTML,
                            timeout=30).text
        listing = requests.get(running.url + "/runs", headers=HTML, timeout=30).text
    assert "<dt>GPU-hours lost</dt><dd>85.3 GPU-hours (512 GPUs x 10 min from 12:00:00 " \
           "until now)" in page
    assert "Hang: no GPU of the run has computed since 12:00:40" in page
    assert "&middot; 85.3 GPU-hours lost</span>" in listing
    assert running.ctx.store.gpu_hours(RunKey("team", "proj", "cascade1")) == \
        pytest.approx(512 * (MEASURED_AT - T0.timestamp()) / 3600, abs=0.001)
