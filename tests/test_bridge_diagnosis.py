"""Root-cause diagnosis on the two motivating cases, determinism, grouping and resolution."""

from __future__ import annotations

import json
import random
from datetime import timedelta

from harness.bridge_payloads import T0, alert, cascade, notification
from wandb_infra.bridge.diagnosis.root_cause import AlertFact, diagnose
from wandb_infra.bridge.ingest import identity
from wandb_infra.bridge.ingest.payload import parse_notification


def facts(alerts: list[dict]) -> list[AlertFact]:
    """Parse webhook alerts the same way the bridge does and turn them into facts."""
    parsed = parse_notification(json.dumps(notification(alerts)).encode())
    out = []
    for a in parsed.alerts:
        ident = identity.read(a.labels)
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


def test_a_later_warning_of_a_stronger_class_does_not_become_the_cause():
    """A critical InfiniBand link loss stalls every rank; minutes later an
    unrelated correctable-ECC warning (category gpu_hardware) on another host. Severity counts
    across classes and a cause cannot start after what it explains."""
    link = alert("InfinibandLinkDown", category="network", host="h1", run="r", start=T0)
    stalls = [alert("TrainingStalled", category="workload", host=f"h{i}", run="r",
                    start=T0 + timedelta(seconds=40), severity="warning") for i in range(1, 9)]
    ecc = alert("GpuCorrectableEccErrors", category="gpu_hardware", host="h9", gpu="2", run="r",
                start=T0 + timedelta(minutes=4), severity="warning")
    diagnosis = diagnose(facts([ecc, *stalls, link]))
    first, second = diagnosis.issues
    assert first.root.alertname == "InfinibandLinkDown"
    assert {c.alertname for c in first.consequences} == {"TrainingStalled"}
    assert second.root.alertname == "GpuCorrectableEccErrors" and not second.consequences
    assert "separate issue" in second.reasoning and "cannot have caused it" in second.reasoning
    assert diagnosis.root_cause is first
    assert "severity decided" in diagnosis.headline_reason
    assert diagnosis.ranked == (first, second)
    # Within the tolerance the warning may lead by time, but severity decides.
    near = alert("GpuCorrectableEccErrors", category="gpu_hardware", host="h9", gpu="2",
                 run="r", start=T0 + timedelta(seconds=30), severity="warning")
    diagnosis = diagnose(facts([near, *stalls, link]))
    assert [i.root.alertname for i in diagnosis.issues] == ["InfinibandLinkDown",
                                                            "GpuCorrectableEccErrors"]
    assert "severity decided" in diagnosis.issues[0].reasoning


def test_a_later_cause_never_explains_what_preceded_it():
    """An earlier thermal warning still firing, then a job-killing XID: two issues; the XID is
    the run's headline but not the cause of the heat, which started 3 minutes before it."""
    heat = alert("GpuClocksThrottledThermal", category="gpu_thermal", host="h3", gpu="1",
                 run="r", start=T0 - timedelta(minutes=3), severity="warning")
    xid = alert("GpuXidError", category="gpu_hardware", host="h1", gpu="2", run="r", start=T0,
                extra={"xid": "79"})
    stall = alert("TrainingStalled", category="workload", host="h2", run="r",
                  start=T0 + timedelta(seconds=40), severity="warning")
    diagnosis = diagnose(facts([stall, xid, heat]))
    assert [i.root.alertname for i in diagnosis.issues] == ["GpuClocksThrottledThermal",
                                                            "GpuXidError"]
    heat_issue, xid_issue = diagnosis.issues
    assert heat_issue.consequences == ()
    assert [c.alertname for c in xid_issue.consequences] == ["TrainingStalled"]
    assert diagnosis.root_cause is xid_issue
    assert diagnosis.ranked[0] is xid_issue
    assert "GpuXidError on h1 GPU 2 is the most consequential of 2 issues: severity decided" \
        in diagnosis.headline_reason


def test_two_critical_faults_in_reverse_order():
    """Class decides between two critical faults of the same moment, in any arrival order; a
    stronger-class fault that began minutes later is a separate issue and the headline."""
    node = alert("NodeDown", category="node", host="h2", run="r", start=T0)
    xid = alert("GpuXidError", category="gpu_hardware", host="h1", gpu="0", run="r",
                start=T0 + timedelta(seconds=20))
    for order in ([node, xid], [xid, node]):
        issue, = diagnose(facts(order)).issues
        assert issue.root.alertname == "GpuXidError"
        assert "cause class decided" in issue.reasoning
    late = alert("GpuXidError", category="gpu_hardware", host="h1", gpu="0", run="r",
                 start=T0 + timedelta(minutes=3))
    diagnosis = diagnose(facts([late, node]))
    assert [i.root.alertname for i in diagnosis.issues] == ["NodeDown", "GpuXidError"]
    assert diagnosis.root_cause.root.alertname == "GpuXidError"
    assert "cause class decided" in diagnosis.headline_reason


def test_same_moment_same_alert_on_several_gpus_is_one_event():
    """Thermal on GPUs 0-3 of one host at one instant: one root event, not GPU 0 + 3 others."""
    hot = [alert("GpuTemperatureHigh", category="gpu_thermal", host="gpu-node-065", gpu=str(g),
                 run="r", start=T0 + timedelta(seconds=g), severity="warning")
           for g in range(4)]
    slow = alert("TrainingStraggler", category="workload", host="gpu-node-065", run="r",
                 start=T0 + timedelta(minutes=1), severity="warning")
    issue, = diagnose(facts([*hot, slow])).issues
    assert issue.title == "GpuTemperatureHigh on gpu-node-065 GPUs 0-3"
    assert [c.alertname for c in issue.consequences] == ["TrainingStraggler"]
    assert len(issue.peers) == 3


def test_severity_ranks_within_a_class():
    """A critical memory temperature is not a consequence of a same-class warning."""
    warm = alert("GpuTemperatureHigh", category="gpu_thermal", host="h", gpu="0", run="r",
                 start=T0, severity="warning")
    hbm = alert("GpuMemoryTemperatureCritical", category="gpu_thermal", host="h", gpu="0",
                run="r", start=T0 + timedelta(seconds=30))
    issue, = diagnose(facts([warm, hbm])).issues
    assert issue.root.alertname == "GpuMemoryTemperatureCritical"
    assert "severity decided" in issue.reasoning
    later = alert("GpuMemoryTemperatureCritical", category="gpu_thermal", host="h", gpu="0",
                  run="r", start=T0 + timedelta(minutes=4))
    diagnosis = diagnose(facts([warm, later]))
    assert [i.root.alertname for i in diagnosis.issues] == ["GpuTemperatureHigh",
                                                            "GpuMemoryTemperatureCritical"]
    assert diagnosis.root_cause.root.alertname == "GpuMemoryTemperatureCritical"


def test_root_resolved_while_consequences_fire():
    xid = alert("GpuXidError", category="gpu_hardware", host="h1", gpu="0", run="r", start=T0,
                end=T0 + timedelta(minutes=2))
    stall = alert("TrainingStalled", category="workload", host="h2", run="r",
                  start=T0 + timedelta(seconds=40), severity="warning")
    issue, = diagnose(facts([xid, stall])).issues
    assert issue.open and issue.root_ended_at == T0 + timedelta(minutes=2)
    assert issue.consequences_firing == 1


def test_a_hardware_fault_explains_a_later_maintenance_alert_in_words():
    """A maintenance alert after a hardware fault is explained by it; the reasoning names it
    (its plural was missing: a KeyError ended the run page)."""
    alerts = facts([
        alert("GpuXidError", category="gpu_hardware", host="h1", gpu="1", run="r", start=T0),
        alert("NodeMaintenance", category="maintenance", host="h1", run="r",
              start=T0 + timedelta(seconds=5)),
    ])
    issue = diagnose(alerts).issues[0]
    assert issue.root.alertname == "GpuXidError"
    assert "explains node maintenance" in issue.reasoning
