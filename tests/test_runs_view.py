"""The run view after a repair: once the GPU reset or the node reboot the fault needed is seen
done, no line of the issue on any surface (W&B notes, run page HTML and JSON, ``explain``'s
text) tells the user to reset, reboot, exclude or drain what was repaired. The GPU-hours the
worker stores for ``/metrics`` are the view's."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest

from harness.bridge_payloads import alert, cascade, notification
from tests.test_verdict import _done_evidence, fact, healthy, in_pool, run
from tests.views import RUN, view_of
from wandb_infra.bridge.diagnosis.impact import HANG, Impact
from wandb_infra.bridge.diagnosis.need import Policy
from wandb_infra.bridge.diagnosis.root_cause import AlertFact, diagnose
from wandb_infra.bridge.diagnosis.verdict import SAFE
from wandb_infra.bridge.ingest.payload import parse_notification
from wandb_infra.bridge.ingest.store import Store
from wandb_infra.bridge.projection.notes import render_section
from wandb_infra.bridge.prometheus.confirm import Confirmation
from wandb_infra.bridge.prometheus.history import as_facts
from wandb_infra.bridge.prometheus.remediation import remediations_for
from wandb_infra.bridge.runs.service import NOT_ASKED, RunService
from wandb_infra.bridge.runs.text import render_text
from wandb_infra.bridge.web.pages import run_html
from wandb_infra.catalog.recovery import Action

# An instruction to repair the host again: the imperative, or an exclusion to use.
REPAIR_AGAIN = re.compile(r"\b(Reset|Reboot|Drain|Exclude|exclude|drain)\b|--exclude|without gpu")
REPAIRS = {"xid95-gpu-reset": (fact("GpuUncontainedEccError", xid=95), Action.RESET_GPU),
           "xid79-node-reboot": (fact("GpuFallenOffBus", xid=79), Action.REBOOT_NODE),
           "gpu-count-node-reboot": (fact("NodeGpuCountDropped"), Action.REBOOT_NODE)}


def _lines(text: str) -> list[str]:
    """A surface's lines (an HTML page's cells and line breaks count as lines)."""
    return [line for line in re.split(r"\n|<d[td]>|<br>|</b>", text) if line.strip()]


@pytest.mark.parametrize("name", REPAIRS)
def test_no_line_says_to_repair_what_was_repaired(name):
    f, action = REPAIRS[name]
    assert run(f, in_pool(), healthy()).need.action is action
    done, pool, evidence, now = _done_evidence(action, f)
    diagnosis = diagnose([done])
    view = view_of(diagnosis, remediations_for(diagnosis, Policy(), (pool, evidence), now))
    head = view.head
    assert head is not None and head.remediation is not None
    assert head.remediation.verdict == SAFE and not head.remediation.exclusion
    assert head.advice.startswith("Done: ")
    page = view.as_dict(lambda *_: "")
    surfaces = {"notes": render_section(view, lambda *_: ""),
                "page": run_html(view, "t", lambda *_: ""),
                "explain": render_text(view, lambda *_: ""),
                "json": json.dumps(page, indent=0)}
    said = [(where, line) for where, text in surfaces.items() for line in _lines(text)
            if REPAIR_AGAIN.search(line.split("Done: ", 1)[-1])]
    assert said == [], said


def test_the_stored_gpu_hours_are_the_runs_figure(tmp_path):
    """``/metrics`` sums the figure the worker stored per run: it is the run view's (two issues
    costing the run at the same time counted once), never the issues' plain sum."""
    start = datetime(2026, 12, 1, 12, tzinfo=UTC)
    facts = [AlertFact("a", "GpuThermalViolation", start - timedelta(minutes=30),
                       start - timedelta(minutes=25), "warning", "gpu_degradation", "h3", "1"),
             AlertFact("b", "GpuXidError", start, None, "critical", "gpu_hardware", "h1", "2")]
    store = Store(tmp_path / "bridge.sqlite")
    service = RunService(store)
    view = service.assemble(RUN, Confirmation.unchecked(facts))
    assert len(view.issues) == 2
    at = start.timestamp()
    shown = service.record_impacts(view, {i.issue.key: Impact(HANG, "no GPU computed", at, "",
                                                              at + 3600, "recovery", 8, 8.0)
                                          for i in view.issues})
    assert shown.gpu_hours == 8.0 and store.gpu_hours(RUN) == 8.0
    assert store.gpu_hours_by_project() == [(RUN.entity, RUN.project, 8.0)]


def test_pages_show_the_confirmations_the_worker_stored(tmp_path):
    """The pages' service asks nothing: an alert the worker has not asked Prometheus about is
    listed apart as not asked yet, one it stored as raised is diagnosed, one refused stays
    apart with Prometheus' reason."""
    store = Store(tmp_path / "bridge.sqlite")
    store.ingest(parse_notification(json.dumps(notification([
        alert("GpuXidError", category="gpu_hardware", host="h1", gpu="2", run=RUN.run_id),
        alert("GpuFallenOffBus", category="gpu_hardware", host="h2", run=RUN.run_id),
    ])).encode()))
    service = RunService(store, confirms=True)  # no confirmer: what the worker stored
    before = service.view(RUN)
    assert before is not None and not before.issues
    assert {u.reason for u in before.unconfirmed} == {NOT_ASKED}
    stored = {f.alertname: f for f in store.facts(RUN)}
    store.record_confirmations(RUN, [(stored["GpuXidError"], ""),
                                     (stored["GpuFallenOffBus"], "not raised")])
    after = service.view(RUN)
    assert after is not None and [i.issue.root.alertname for i in after.issues] == ["GpuXidError"]
    assert [(u.fact.alertname, u.reason, u.final) for u in after.unconfirmed] == [
        ("GpuFallenOffBus", "not raised", True)]


def test_the_text_puts_the_root_cause_first_and_groups_consequences():
    """``explain`` and the ``?format=text`` page: the root cause first, then the consequences
    one line per alert name, six hosts named and the rest counted."""
    body = json.dumps(notification(cascade(hosts=10, gpus=1, bad_host=7, bad_gpu=0))).encode()
    view = view_of(diagnose(as_facts(parse_notification(body).alerts)))
    text = render_text(view, lambda *_: "https://g/d/x")
    assert text.index("ROOT CAUSE  GpuContainedEccError on node007 GPU 0") < text.index("Stalled")
    assert "- TrainingStalled on 10 host(s) (node000, node001, node002, node003, node004, " \
           "node005 and 4 more), from " in text
    assert "    grafana     https://g/d/x" in text and "a separate issue" not in text
