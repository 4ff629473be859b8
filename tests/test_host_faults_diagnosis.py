"""End to end through the bridge's diagnosis: the host alerts, with the labels and
annotations the shipped rules give them (alert_rules/wandb-infra.rules.yml), parsed from a
webhook body as the bridge parses it, then diagnosed and decided (diagnosis/verdict.py). A host OOM
kill or a lost mount explains the NCCL errors and stalls that follow; maintenance is shown as
maintenance, never as a hardware fault; a later hardware fault is its own issue; a repeat
offender is "replace, not reset"."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from harness.bridge_payloads import T0, alert, rfc3339
from tests.test_bridge_diagnosis import facts
from wandb_infra.bridge.diagnosis.evidence import Change, HostEvidence, Timeline
from wandb_infra.bridge.diagnosis.need import Policy
from wandb_infra.bridge.diagnosis.root_cause import diagnose
from wandb_infra.bridge.diagnosis.verdict import decide
from wandb_infra.bridge.prometheus.remediation import exclusion
from wandb_infra.catalog import host_alerts
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.catalog.recovery import Action
from wandb_infra.catalog.vocabulary import CauseClass

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "alert_rules" / "wandb-infra.rules.yml"
RUN = "r28"
HOSTS = [f"gpu-{i:02d}" for i in range(8)]


def _shipped() -> dict[str, dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


SHIPPED = _shipped()


def shipped(name: str, *, host: str, gpu: str = "", minutes: float = 0,
            extra: dict[str, str] | None = None) -> dict:
    """A webhook alert as the shipped rule raises it: its labels and static annotations, started
    ``minutes`` after T0 (Prometheus' startsAt: the onset plus the rule's ``for``)."""
    rule = SHIPPED[name]
    labels = rule["labels"]
    annotations = {k: v for k, v in rule["annotations"].items() if "{{" not in v}
    annotations["description"] = f"{name} on {host}"
    for_seconds = int(annotations.get("for_seconds", "0"))
    return alert(name, category=labels["category"], severity=labels["severity"], host=host,
                 gpu=gpu, run=RUN, start=T0 + timedelta(minutes=minutes, seconds=for_seconds),
                 annotations=annotations, extra=extra)


def nccl_aftermath(minutes: float, skip: str = "") -> list[dict]:
    """What the other ranks report after one dies: application XIDs (NCCL errors surfacing as
    illegal accesses) and a stall on every host."""
    out = [shipped("GpuXidApplicationError", host=h, gpu="0", minutes=minutes,
                   extra={"xid": "13"}) for h in HOSTS if h != skip]
    out += [shipped("TrainingStalled", host=h, minutes=minutes + 1) for h in HOSTS if h != skip]
    return out


def test_every_host_alert_is_shipped_and_attributed():
    for name in ("HostOomKill", "FilesystemNotResponding", "NodeMaintenance", "NodeRebooted",
                 "HostMemoryUncorrectableErrors", "GpuRepeatOffender"):
        assert name in SHIPPED
        # attributed through its fault family's join rows (alert_rules/attribution.py)
        assert re.search(r"wandb_run_(gpu|hostname):(gpu|host)_faults:runs",
                         SHIPPED[name]["expr"]), name


def test_host_oom_kill_explains_the_nccl_errors_and_stalls():
    diagnosis = diagnose(facts([shipped("HostOomKill", host="gpu-03"), *nccl_aftermath(1)]))
    assert len(diagnosis.issues) == 1
    issue = diagnosis.issues[0]
    assert issue.root.alertname == "HostOomKill"
    assert issue.root.cause is CauseClass.HOST_RESOURCE
    assert {c.alertname for c in issue.consequences} == {"GpuXidApplicationError",
                                                         "TrainingStalled"}
    assert len(issue.consequences) == 16
    assert "the loss of a host resource" in issue.reasoning
    decision = decide(issue, Policy(), timelines=None, evidence=None,
                      now=(T0 + timedelta(minutes=5)).timestamp(), exclusion_for=exclusion)
    assert decision is not None and decision.need.action is Action.RESTART_APP
    assert decision.verdict == "safe" and not decision.drain


def test_lost_mount_on_every_host_explains_the_stalls():
    mount = {"mountpoint": "/mnt/ckpt", "fstype": "nfs4"}
    lost = [shipped("SharedFilesystemNotResponding", host=h, extra=mount) for h in HOSTS]
    diagnosis = diagnose(facts([*lost, *[shipped("TrainingStalled", host=h, minutes=3)
                                         for h in HOSTS]]))
    assert len(diagnosis.issues) == 1
    issue = diagnosis.issues[0]
    assert issue.root.alertname == "SharedFilesystemNotResponding"
    assert {c.alertname for c in issue.consequences} == {"SharedFilesystemNotResponding",
                                                         "TrainingStalled"}


def test_a_later_hardware_fault_is_its_own_issue_and_the_headline():
    alerts = [shipped("HostOomKill", host="gpu-03"), *nccl_aftermath(1),
              shipped("GpuFallenOffBus", host="gpu-05", gpu="2", minutes=4)]
    diagnosis = diagnose(facts(alerts))
    roots = [i.root.alertname for i in diagnosis.issues]
    assert roots == ["HostOomKill", "GpuFallenOffBus"]
    assert diagnosis.root_cause is not None
    assert diagnosis.root_cause.root.alertname == "GpuFallenOffBus"


def test_maintenance_is_shown_as_maintenance_and_explains_the_node_loss():
    maint = {"scheduler": "slurm", "state": "ALLOCATED+MAINT", "reason": "BIOS update"}
    alerts = [shipped("NodeMaintenance", host="gpu-06", extra=maint),
              shipped("NodeDown", host="gpu-06", minutes=4, extra={"exporter": "node_exporter"}),
              shipped("GpuFallenOffBus", host="gpu-06", gpu="1", minutes=4),
              *(shipped("TrainingStalled", host=h, minutes=5) for h in HOSTS if h != "gpu-06")]
    diagnosis = diagnose(facts(alerts))
    assert len(diagnosis.issues) == 1
    issue = diagnosis.issues[0]
    assert issue.root.alertname == "NodeMaintenance"
    assert issue.root.cause is CauseClass.MAINTENANCE
    assert "hardware" not in issue.root.cause.name.lower()
    assert "under maintenance" in issue.reasoning
    assert {c.alertname for c in issue.consequences} == {"NodeDown", "GpuFallenOffBus",
                                                         "TrainingStalled"}


def test_unplanned_reboot_needs_nothing_once_back():
    diagnosis = diagnose(facts([shipped("NodeRebooted", host="gpu-01"), *nccl_aftermath(0)]))
    issue = diagnosis.issues[0]
    assert issue.root.alertname == "NodeRebooted"
    decision = decide(issue, Policy(), timelines=None, evidence=None,
                      now=(T0 + timedelta(minutes=5)).timestamp(), exclusion_for=exclusion)
    assert decision is not None and decision.need.action is Action.NONE
    assert decision.verdict == "safe"


def test_edac_uncorrectable_needs_service():
    diagnosis = diagnose(facts([shipped("HostMemoryUncorrectableErrors", host="gpu-02",
                                        extra={"controller": "0"}), *nccl_aftermath(1)]))
    issue = diagnosis.issues[0]
    assert issue.root.alertname == "HostMemoryUncorrectableErrors"
    decision = decide(issue, Policy(), timelines=None, evidence=None,
                      now=(T0 + timedelta(minutes=5)).timestamp(), exclusion_for=exclusion)
    assert decision is not None and decision.need.action is Action.SERVICE
    assert "without gpu-02" in decision.advice


def test_repeat_offender_gpu_is_replace_not_reset():
    fault = shipped("GpuDoubleBitEccErrors", host="gpu-04", gpu="3")
    flagged = shipped("GpuRepeatOffender", host="gpu-04", gpu="3", minutes=3)
    now = (T0 + timedelta(minutes=10)).timestamp()
    plain = diagnose(facts([fault])).issues[0]
    base = decide(plain, Policy(), timelines=None, evidence=None, now=now,
                  exclusion_for=exclusion)
    assert base is not None and base.need.action is Action.RESET_GPU
    issue = diagnose(facts([fault, flagged, *nccl_aftermath(1, skip="gpu-04")])).issues[0]
    assert issue.root.alertname == "GpuDoubleBitEccErrors"
    assert "GpuRepeatOffender" in issue.alertnames
    decision = decide(issue, Policy(), timelines=None, evidence=None, now=now,
                      exclusion_for=exclusion)
    assert decision is not None and decision.need.action is Action.REPLACE
    assert "replace, not reset" in decision.detail
    assert "replacement" in decision.advice


def test_repeat_offender_host_is_replace_not_reset():
    """A host's third hardware-fault episode (HostRepeatOffender: an operators' alert on no run)
    reaches its run's decision through the host's evidence: a replacement, which the fault
    clearing (as each episode of a lemon does) never shows; a host-resource fault there stays
    the job's."""
    psu = shipped("HostPowerSupplyFault", host="gpu-04", extra={"name": "PS1 Status"})
    cleared = {**psu, "status": "resolved", "endsAt": rfc3339(T0 + timedelta(minutes=4))}
    lemon = {"gpu-04": HostEvidence(repeat_episodes=3)}
    now = (T0 + timedelta(hours=2)).timestamp()
    pool = {"gpu-04": _schedulable("gpu-04")}
    issue = diagnose(facts([cleared])).issues[0]
    plain = decide(issue, Policy(), timelines=pool, evidence={}, now=now, exclusion_for=exclusion)
    assert plain is not None and (plain.need.action, plain.verdict) == (Action.SERVICE, "safe")
    decision = decide(issue, Policy(), timelines=pool, evidence=lemon, now=now,
                      exclusion_for=exclusion)
    assert decision is not None and decision.need.action is Action.REPLACE
    assert decision.verdict == "unsafe"
    assert ("gpu-04 is a repeat offender (HostRepeatOffender: 3 hardware-fault episodes in the "
            "last 7 days): replace, not reset") in decision.detail
    assert "failing part replaced" in decision.advice and "dcgmi" not in decision.advice
    oom = diagnose(facts([shipped("HostOomKill", host="gpu-04")])).issues[0]
    job = decide(oom, Policy(), timelines=pool, evidence=lemon, now=now, exclusion_for=exclusion)
    assert job is not None and job.need.action is Action.RESTART_APP


def test_catalog_needs_follow_the_recovery_model():
    needs = {n: ALERTS[n].needs for n in ("HostOomKill", "HostMemoryUncorrectableErrors",
                                          "FilesystemReadOnly", "FilesystemFull", "NodeRebooted",
                                          "NodeMaintenance", "GpuRepeatOffender")}
    assert needs == {"HostOomKill": Action.RESTART_APP,
                     "HostMemoryUncorrectableErrors": Action.SERVICE,
                     "FilesystemReadOnly": Action.SERVICE, "FilesystemFull": Action.SERVICE,
                     "NodeRebooted": Action.NONE, "NodeMaintenance": Action.SERVICE,
                     "GpuRepeatOffender": Action.REPLACE}
    assert ALERTS["FilesystemReadOnly"].clears_when_fixed
    assert ALERTS["FilesystemFull"].clears_when_fixed
    assert ALERTS["NodeMaintenance"].cause is CauseClass.MAINTENANCE


# Each host alert of the catalog as the bridge must read it, stated here (not read back from the
# catalog): its cause class, what it needs, and whether the quarantine may take the node out.
H, D, M = CauseClass.HARDWARE, CauseClass.DEGRADATION, CauseClass.MAINTENANCE
R, L = CauseClass.HOST_RESOURCE, CauseClass.NODE_LOSS
EXPECTED: dict[str, tuple[CauseClass, Action, bool]] = {
    "HostOomKill": (R, Action.RESTART_APP, False),
    "HostMemoryPressure": (R, Action.NONE, False),
    "HostMemoryExhausted": (R, Action.NONE, False),
    "HostMemoryUncorrectableErrors": (H, Action.SERVICE, True),
    "HostMemoryCorrectableErrors": (D, Action.NONE, False),
    "FilesystemReadOnly": (R, Action.SERVICE, True),
    "FilesystemFull": (R, Action.SERVICE, True),
    "FilesystemNotResponding": (R, Action.SERVICE, True),
    "SharedFilesystemReadOnly": (R, Action.RESTART_APP, False),
    "SharedFilesystemFull": (R, Action.RESTART_APP, False),
    "SharedFilesystemNotResponding": (R, Action.RESTART_APP, False),
    "LocalDiskFailing": (H, Action.SERVICE, True),
    "NodeRebooted": (L, Action.NONE, False),
    "NodeMaintenance": (M, Action.SERVICE, True),
    "NvswitchFatalError": (H, Action.REBOOT_NODE, True),
    "FabricManagerNotReady": (H, Action.SERVICE, True),
    "HostPowerSupplyFault": (H, Action.SERVICE, True),
    "HostChassisSensorCritical": (H, Action.SERVICE, True),
    "GpuRepeatOffender": (H, Action.REPLACE, True),
}
# Label values for the alerts' copied labels (a Slurm state that is maintenance, a shared type
# for the shared filesystems, a local one for the others).
LABEL_VALUES = {"mountpoint": "/mnt/ckpt", "controller": "0", "nvswitch": "2", "gpu": "0",
                "name": "PS1 Status", "device": "/dev/nvme0", "check": "media errors",
                "scheduler": "slurm", "state": "IDLE+MAINT", "reason": "BIOS update"}


def _labels_of(name: str) -> dict[str, str]:
    fstype = "nfs4" if name.startswith("Shared") else "xfs"
    return {k: {**LABEL_VALUES, "fstype": fstype}[k] for k in ALERTS[name].copy_labels
            if k != "gpu"}


def test_every_host_alert_has_its_expectation():
    """A new host alert must be added to ``EXPECTED`` (the operators' repeat-offender flag is
    on no run, so never a run's root cause)."""
    names = set(host_alerts.definitions(lambda **kw: kw["name"]))
    assert names - {"HostRepeatOffender"} == set(EXPECTED)
    assert "wandb_run_node_info" not in SHIPPED["HostRepeatOffender"]["expr"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_host_alert_is_the_root_cause_with_its_class_and_need(name):
    """Each host alert on one host, then the stalls on every host: the alert is the issue's root
    with its cause class, every stall its consequence, and the decision needs what the recovery
    model says; only a need that takes the node out lets the quarantine drain it."""
    cause, action, drains = EXPECTED[name]
    gpu = "0" if "gpu" in ALERTS[name].copy_labels or ALERTS[name].scope == "gpu" else ""
    root = shipped(name, host="gpu-03", gpu=gpu, extra=_labels_of(name))
    stalls = [shipped("TrainingStalled", host=h, minutes=2) for h in HOSTS]
    diagnosis = diagnose(facts([root, *stalls]))
    assert len(diagnosis.issues) == 1
    issue = diagnosis.issues[0]
    assert issue.root.alertname == name
    assert issue.root.cause is cause
    assert {c.alertname for c in issue.consequences} == {"TrainingStalled"}
    decision = decide(issue, Policy(), timelines=None, evidence=None,
                      now=(T0 + timedelta(minutes=5)).timestamp(), exclusion_for=exclusion)
    assert decision is not None
    assert decision.need.action is action
    assert decision.drain is drains
    assert decision.hosts == ("gpu-03",)
    if not drains:
        assert decision.verdict == "safe"
        assert "the node can stay in service" in decision.advice


def _schedulable(host: str) -> Timeline:
    now = Change((T0 - timedelta(hours=1)).timestamp(), "slurm", "ALLOCATED", "")
    return Timeline(host, (now,), now)


def test_lost_shared_filesystem_on_every_host_drains_no_node():
    """An NFS/Lustre export lost on every host was rooted on one of them and
    the quarantine could drain it. The storage service is at fault: the verdict is safe on
    schedulable nodes, nothing is drained or excluded, and the issue says whose fault it is."""
    mount = {"mountpoint": "/mnt/ckpt", "fstype": "nfs4"}
    lost = [shipped("SharedFilesystemNotResponding", host=h, extra=mount) for h in HOSTS]
    stalls = [shipped("TrainingStalled", host=h, minutes=3) for h in HOSTS]
    issue = diagnose(facts([*lost, *stalls])).issues[0]
    assert issue.root.alertname == "SharedFilesystemNotResponding"
    assert issue.root.cause is CauseClass.HOST_RESOURCE
    decision = decide(issue, Policy(), timelines={h: _schedulable(h) for h in HOSTS},
                      evidence={}, now=(T0 + timedelta(minutes=5)).timestamp(),
                      exclusion_for=exclusion)
    assert decision is not None
    assert decision.verdict == "safe" and not decision.drain and not decision.exclusion
    assert "the node can stay in service" in decision.advice
    assert "storage service is at fault" in issue.root.text("summary")
    assert issue.root.text("remediation").startswith("The storage service is at fault")


def test_lost_local_filesystem_takes_its_node_out():
    """The twin on a local filesystem is the node's fault: it must leave the pool."""
    lost = shipped("FilesystemNotResponding", host="gpu-03",
                   extra={"mountpoint": "/scratch", "fstype": "xfs"})
    issue = diagnose(facts([lost, *nccl_aftermath(1, skip="gpu-03")])).issues[0]
    decision = decide(issue, Policy(), timelines={h: _schedulable(h) for h in HOSTS},
                      evidence={}, now=(T0 + timedelta(minutes=5)).timestamp(),
                      exclusion_for=exclusion)
    assert decision is not None
    assert decision.verdict == "unsafe" and decision.drain and decision.hosts == ("gpu-03",)

