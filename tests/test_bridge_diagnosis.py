"""Root-cause diagnosis on the two motivating cases, determinism, grouping and resolution."""

from __future__ import annotations

import json
import random
from datetime import timedelta

from bridge.diagnosis import AlertFact, diagnose
from bridge.identity import IdentityReader
from bridge.payload import parse_notification
from tests.bridge_payloads import T0, alert, cascade, notification


def facts(alerts: list[dict]) -> list[AlertFact]:
    """Parse webhook alerts the same way the bridge does and turn them into facts."""
    parsed = parse_notification(json.dumps(notification(alerts)).encode())
    reader = IdentityReader()
    out = []
    for a in parsed.alerts:
        ident = reader.read(a.raw)
        out.append(AlertFact(a.fingerprint, a.alertname, a.starts_at, a.ends_at,
                             a.labels.get("severity", ""), a.labels.get("category", ""),
                             ident.hostname, ident.gpu, a.labels, a.annotations))
    return out


def test_xid94_cascade_on_64_hosts_has_one_root_cause():
    alerts = facts(cascade(hosts=64, gpus=8))
    diagnosis = diagnose(alerts)
    assert len(diagnosis.issues) == 1
    issue = diagnosis.issues[0]
    assert issue.root.alertname == "GpuContainedEccError"
    assert (issue.root.hostname, issue.root.gpu) == ("node017", "3")
    assert len(issue.consequences) == len(alerts) - 1 == 64 + 64 * 8 - 1
    assert {c.alertname for c in issue.consequences} == {"TrainingStalled",
                                                         "GpuXidApplicationError"}
    assert issue.started_at == T0
    assert "GpuContainedEccError on node017 GPU 3" in issue.reasoning
    assert "64 hosts" in issue.reasoning
    assert issue.alertnames[0] == "GpuContainedEccError"


def test_diagnosis_is_deterministic_under_any_order():
    alerts = facts(cascade(hosts=16, gpus=8))
    expected = diagnose(alerts)
    rng = random.Random(7)
    for _ in range(5):
        shuffled = alerts[:]
        rng.shuffle(shuffled)
        assert diagnose(shuffled) == expected


def test_thermal_slowdown_issue_starts_where_the_slowdown_starts():
    # The straggler symptom becomes visible 2 minutes before the thermal alert's startsAt is
    # reported for the throttled host; the issue starts at the slowdown, rooted at the heat.
    slow_start = T0 - timedelta(minutes=2)
    alerts = facts([
        alert("TrainingStraggler", category="workload", host="gpu-a7", run="r1",
              start=slow_start, severity="warning"),
        alert("GpuThermalViolation", category="gpu_thermal", host="gpu-a7", gpu="5", run="r1",
              start=T0, severity="warning"),
    ])
    diagnosis = diagnose(alerts)
    assert len(diagnosis.issues) == 1
    issue = diagnosis.issues[0]
    assert issue.root.alertname == "GpuThermalViolation" and issue.root.gpu == "5"
    assert issue.started_at == slow_start
    assert [c.alertname for c in issue.consequences] == ["TrainingStraggler"]
    assert issue.open


def test_hardware_beats_node_loss_beats_link_loss_beats_degradation():
    alerts = facts([
        alert("GpuThermalViolation", category="gpu_thermal", host="h1", gpu="0", run="r",
              start=T0),
        alert("InfinibandLinkDown", category="network", host="h2", run="r",
              start=T0 + timedelta(seconds=1)),
        alert("NodeDown", category="node", host="h3", run="r", start=T0 + timedelta(seconds=2)),
        alert("GpuXidError", category="gpu_hardware", host="h4", gpu="1", run="r",
              start=T0 + timedelta(seconds=3)),
    ])
    issue = diagnose(alerts).issues[0]
    assert issue.root.alertname == "GpuXidError"
    without_hw = [a for a in alerts if a.alertname != "GpuXidError"]
    assert diagnose(without_hw).issues[0].root.alertname == "NodeDown"


def test_earliest_wins_within_a_cause_class():
    alerts = facts([
        alert("GpuXidError", category="gpu_hardware", host="h2", gpu="1", run="r",
              start=T0 + timedelta(seconds=5)),
        alert("GpuXidError", category="gpu_hardware", host="h1", gpu="0", run="r", start=T0),
    ])
    assert diagnose(alerts).issues[0].root.hostname == "h1"


def test_separate_incidents_and_resolution():
    alerts = facts([
        alert("GpuThermalViolation", category="gpu_thermal", host="h1", gpu="0", run="r",
              start=T0, end=T0 + timedelta(minutes=5)),
        alert("NodeDown", category="node", host="h2", run="r", start=T0 + timedelta(hours=3)),
    ])
    diagnosis = diagnose(alerts)
    assert [i.root.alertname for i in diagnosis.issues] == ["GpuThermalViolation", "NodeDown"]
    first, second = diagnosis.issues
    assert first.ended_at == T0 + timedelta(minutes=5) and not first.open
    assert second.open
    assert diagnosis.root_cause is second  # node loss outranks degradation
    assert "only alert" in first.reasoning


def test_empty_and_unknown_alerts():
    assert diagnose([]).issues == ()
    assert diagnose([]).root_cause is None
    custom = facts([alert("MyOwnRule", category="", host="h", run="r")])
    assert diagnose(custom).issues[0].root.cause.name == "SYMPTOM"


def test_xid_alert_names_the_event_even_when_a_counter_alert_evaluated_first():
    """XID 94 also bumps the ECC counters; rule evaluation order must not change the headline."""
    dbe = alert("GpuDoubleBitEccErrors", category="gpu_hardware", host="node017", gpu="3",
                run="r1", start=T0)
    xid = alert("GpuContainedEccError", category="gpu_hardware", host="node017", gpu="3",
                run="r1", start=T0 + timedelta(seconds=2), extra={"xid": "94"})
    stall = alert("TrainingStalled", category="workload", host="node001", run="r1",
                  start=T0 + timedelta(seconds=40), severity="warning")
    issue = diagnose(facts([dbe, xid, stall])).issues[0]
    assert issue.root.alertname == "GpuContainedEccError"
    assert [c.alertname for c in issue.consequences] == ["GpuDoubleBitEccErrors",
                                                         "TrainingStalled"]
    assert "XID 94" in issue.reasoning and "GpuDoubleBitEccErrors" in issue.reasoning
    later_xid = alert("GpuContainedEccError", category="gpu_hardware", host="node017", gpu="3",
                      run="r1", start=T0 + timedelta(minutes=5), extra={"xid": "94"})
    assert diagnose(facts([dbe, later_xid])).issues[0].root.alertname == "GpuDoubleBitEccErrors"


def test_issue_starts_at_the_fault_onset_not_when_the_rule_fired():
    """Prometheus stamps startsAt after the rule's ``for``; the rule states it in for_seconds."""
    thermal = alert("GpuThermalViolation", category="gpu_thermal", host="node065", gpu="0",
                    run="r2", start=T0 + timedelta(minutes=5), severity="warning",
                    annotations={"summary": "Hot.", "for_seconds": "300"})
    stall = alert("TrainingStraggler", category="workload", host="node066", run="r2",
                  start=T0 + timedelta(minutes=4), severity="warning",
                  annotations={"summary": "Slow.", "for_seconds": "180"})
    issue = diagnose(facts([thermal, stall])).issues[0]
    assert issue.root.alertname == "GpuThermalViolation"
    assert issue.started_at == T0
    assert issue.root.onset == T0 and issue.consequences[0].onset == T0 + timedelta(minutes=1)
    for bad in ("", "soon", "-5", "1e12"):
        odd = alert("GpuThermalViolation", category="gpu_thermal", host="h", run="r2",
                    start=T0, annotations={"for_seconds": bad})
        assert facts([odd])[0].onset == T0, bad
