"""The restart decision (diagnosis/verdict.py) over every catalogued fault and every action state:
the advice, the verdict and the quarantine's permission come from one decision and agree; the
scheduler-state probe cases; the site policy; XIDs against NVIDIA's vendored catalog."""

from __future__ import annotations

import csv
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from wandb_infra.bridge.diagnosis.evidence import Change, GpuEvidence, HostEvidence, Timeline
from wandb_infra.bridge.diagnosis.need import Policy
from wandb_infra.bridge.diagnosis.root_cause import AlertFact, Issue, diagnose
from wandb_infra.bridge.diagnosis.verdict import SAFE, UNKNOWN, UNSAFE, Decision, decide
from wandb_infra.bridge.prometheus.remediation import exclusion, remediations_for
from wandb_infra.catalog import xid as xid_catalog
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.catalog.recovery import SPECS, Action
from wandb_infra.catalog.runbook import CLASS_ALERT
from wandb_infra.catalog.xid import CATALOG_URL, XIDS, XidClass, codes
from wandb_infra.common.configfile import ConfigError

pytestmark = pytest.mark.unit

DATA = Path(__file__).parent / "data" / "nvidia"
HOST, GPU = "gpu-07", "3"
ONSET = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
T = ONSET.timestamp()
SETTLE = Policy().settle_seconds


def fact(name: str, *, xid: int | None = None, end: datetime | None = None,
         labels: dict[str, str] | None = None, severity: str = "") -> AlertFact:
    known = ALERTS.get(name)
    extra = dict(labels or {})
    if xid is not None:
        extra["xid"] = str(xid)
    gpu = GPU if known is None or known.scope == "gpu" else ""
    return AlertFact(
        fingerprint=f"{name}-{xid}", alertname=name, starts_at=ONSET, ends_at=end,
        severity=severity or (known.severity if known else "critical"),
        category=known.category if known else "gpu_hardware", hostname=HOST, gpu=gpu,
        labels={"alertname": name, "hostname": HOST, **({"gpu": gpu} if gpu else {}), **extra})


def issue_of(f: AlertFact) -> Issue:
    (issue,) = diagnose([f], timedelta(minutes=10)).issues
    return issue


def in_pool(*extra: Change) -> dict[str, Timeline]:
    changes = (Change(T - 3600, "slurm", "IDLE", ""), *extra)
    return {HOST: Timeline(HOST, changes, changes[-1])}


def healthy(**over: object) -> dict[str, HostEvidence]:
    base: dict[str, object] = {"boot_time": T - 86400, "gpus_now": 8, "gpus_before": 8,
                               "gpus": {GPU: GpuEvidence(("GPU-aaa",), True, ((T - 3600, 0),))}}
    base.update(over)
    return {HOST: HostEvidence(**base)}  # type: ignore[arg-type]


def run(f: AlertFact, timelines: dict[str, Timeline] | None,
        evidence: dict[str, HostEvidence] | None, now: float | None = None,
        policy: Policy | None = None) -> Decision:
    got = decide(issue_of(f), policy or Policy(), timelines=timelines, evidence=evidence,
                 now=now if now is not None else T + 300, exclusion_for=exclusion)
    assert got is not None
    return got


RETURNED = (Change(T + 60, "slurm", "IDLE+DRAIN", "repair"), Change(T + 900, "slurm", "IDLE", ""))


def _done_evidence(action: Action, f: AlertFact) -> tuple[AlertFact, dict[str, Timeline],
                                                            dict[str, HostEvidence], float]:
    """Telemetry in which ``action`` was seen done after the onset (fact, scheduler state,
    evidence, now)."""
    known = ALERTS.get(f.alertname)
    if SPECS[action].out_of_service is not True:
        return f, in_pool(), healthy(), T + 600
    if known is not None and known.clears_when_fixed:
        ended = ONSET + timedelta(seconds=60)
        return (fact(f.alertname, end=ended, labels=dict(f.labels)), in_pool(), healthy(),
                ended.timestamp() + SETTLE + 1)
    if action is Action.REBOOT_NODE:
        return f, in_pool(), healthy(boot_time=T + 120), T + 600
    if action is Action.REPLACE:
        return (f, in_pool(), healthy(gpus={GPU: GpuEvidence(("GPU-aaa", "GPU-bbb"), True, ())}),
                T + 600)
    if action is Action.SERVICE:  # an alert whose end proves nothing: the operator's return
        return f, in_pool(*RETURNED), healthy(), T + 1000
    driver = ((T - 3600, 0), (T + 10, 1), (T + 200, 0))
    return f, in_pool(), healthy(gpus={GPU: GpuEvidence(("GPU-aaa",), True, driver)}), T + 600


def _cases() -> list[tuple[str, AlertFact]]:
    """Every XID NVIDIA lists (on the alert its class raises) and every catalogued alert that
    names a GPU, host or link."""
    out = [(f"xid-{c}", fact(CLASS_ALERT[x.cls], xid=c)) for c, x in XIDS.items()]
    out += [(a.name, fact(a.name)) for a in ALERTS.values()
            if a.scope in ("gpu", "host", "link") and "xid" not in a.copy_labels]
    return out


CASES = _cases()


@pytest.mark.parametrize(("name", "f"), CASES, ids=[n for n, _ in CASES])
def test_advice_verdict_and_quarantine_agree_in_every_state(name, f):
    first = run(f, in_pool(), healthy())
    need = first.need.action
    spec = SPECS[need]
    states = {
        "in the pool, not done": first,
        "no Prometheus": run(f, None, None),
        "no scheduler data": run(f, {}, healthy()),
        "drained after the onset": run(f, in_pool(Change(T + 60, "slurm", "IDLE+DRAIN", "x")),
                                       healthy()),
    }
    done_fact, done_pool, done_ev, done_now = _done_evidence(need, f)
    states["action seen done"] = run(done_fact, done_pool, done_ev, done_now)
    for state, d in states.items():
        where = f"{name} / {state}: {d.verdict}: {d.detail}"
        assert d.need.action is need or state == "action seen done", where
        if spec.out_of_service is False:
            assert d.verdict == SAFE and not d.drain and not d.exclusion, where
            assert ("stay in service" in d.advice or "Not the hardware" in d.advice), where
            assert "without" not in d.advice, where
            continue
        if state == "action seen done" and d.verdict == SAFE:  # nothing left to do there
            assert d.advice.startswith("Done: ") and "can take it again" in d.advice, where
            assert not re.search(r"\b(Reset|Reboot|Stop every job|without|drain)\b",
                                 d.advice.split(". Restart")[1]), where
        else:
            assert "without gpu-07" in d.advice or "Decode" in d.advice or d.need.action in (
                Action.UNKNOWN, Action.FOLLOW_DRIVER), where
        assert "stay in service" not in d.advice, where
        if state == "drained after the onset":
            assert d.verdict == SAFE and not d.drain and "out of the pool" in d.detail, where
        elif spec.out_of_service is None:
            # nothing acts on a need nobody could resolve; the verdict says what is missing
            assert d.verdict == UNKNOWN and not d.drain, where
        elif state == "in the pool, not done":
            assert d.verdict == UNSAFE and d.drain, where
            assert d.exclusion == "sbatch --exclude=gpu-07", where
        elif state == "action seen done":
            assert d.verdict == SAFE and not d.drain and not d.exclusion, where
        else:
            assert d.verdict == UNKNOWN and d.drain, where


def test_single_code_alerts_name_their_xid_without_the_label():
    d = run(fact("GpuContainedEccError"), in_pool(), healthy())
    assert d.verdict == SAFE and d.need.subject == "XID 94"
    assert run(fact("GpuUncontainedEccError"), in_pool(), healthy(gpus={})).verdict == UNSAFE


def test_xid_94_needs_only_an_application_restart_and_stays_in_service():
    d = run(fact("GpuContainedEccError", xid=94), in_pool(), healthy())
    assert d.verdict == SAFE and not d.drain and not d.exclusion
    assert d.detail == "XID 94 needs only an application restart: the node can stay in service"
    assert d.advice.startswith("Restart the job from its last checkpoint; the node can stay in "
                               "service")


@pytest.mark.parametrize("code", [13, 31, 43, 68, 69])
def test_application_xids_say_not_the_hardware(code):
    d = run(fact(CLASS_ALERT[XIDS[code].cls], xid=code), in_pool(), healthy())
    assert d.verdict == SAFE and not d.drain
    if XIDS[code].cls is XidClass.APPLICATION:
        assert d.detail.startswith("not the hardware: XID")
        assert d.advice.startswith("Not the hardware: a restart on the same GPUs is fine")
    else:  # 43: NVIDIA says ignore
        assert "needs no action" in d.detail


def test_gpu_reset_unsafe_then_safe_once_the_driver_action_clears():
    f = fact("GpuUncontainedEccError", xid=95)
    pending = healthy(gpus={GPU: GpuEvidence(("GPU-aaa",), True, ((T + 5, 1),))})
    d = run(f, in_pool(), pending)
    assert d.verdict == UNSAFE and d.drain
    assert "the driver still asks for a GPU reset on gpu-07" in d.detail
    assert "Reset GPU 3 of gpu-07 (nvidia-smi -r -i 3)" in d.advice
    cleared = healthy(gpus={GPU: GpuEvidence(("GPU-aaa",), True, ((T + 5, 1), (T + 400, 0)))})
    d = run(f, in_pool(), cleared, T + 500)
    assert d.verdict == SAFE and not d.drain
    assert "GPU 3 of gpu-07 was reset at 2026-12-01 12:06:40 UTC" in d.detail


def test_reset_not_observable_says_what_to_export():
    d = run(fact("GpuUncontainedEccError", xid=95), in_pool(), healthy(gpus={}))
    assert d.verdict == UNSAFE
    assert "add DCGM_FI_DEV_GPU_RECOVERY_ACTION to its counters file" in d.detail


def test_reboot_counts_only_with_the_gpus_back():
    f = fact("GpuFallenOffBus")
    assert run(f, in_pool(), healthy(boot_time=T + 100, gpus_now=7)).verdict == UNSAFE
    d = run(f, in_pool(), healthy(boot_time=T + 100, gpus_now=8))
    assert d.verdict == SAFE and "gpu-07 rebooted at 2026-12-01 12:01:40 UTC" in d.detail
    # a reboot before the fault is not a repair
    assert run(f, in_pool(), healthy(boot_time=T - 100)).verdict == UNSAFE


@pytest.mark.parametrize("name", ["GpuFallenOffBus", "NvswitchFatalError"])
def test_returned_without_the_reboot_it_needs_is_unsafe(name):
    """An operator's drain and return is no repair when the boot time shows the reboot the
    fault needs has not happened."""
    f = fact(name)
    d = run(f, in_pool(*RETURNED), healthy(), T + 1000)
    assert d.need.action is Action.REBOOT_NODE
    assert d.verdict == UNSAFE and d.drain and d.exclusion == "sbatch --exclude=gpu-07"
    assert "gpu-07 has not rebooted since the fault (up since 2026-11-30 12:00:00 UTC)" in \
        d.detail
    rebooted = run(f, in_pool(*RETURNED), healthy(boot_time=T + 300), T + 1000)
    assert rebooted.verdict == SAFE and "gpu-07 rebooted at" in rebooted.detail
    # no boot time read: nothing contradicts the operator
    unread = run(f, in_pool(*RETURNED), healthy(boot_time=None), T + 1000)
    assert unread.verdict == SAFE and "treated as repaired by the operator" in unread.detail


@pytest.mark.parametrize("name", ["HostMemoryUncorrectableErrors", "GpuNvlinkFailure"])
def test_a_counter_window_ending_is_no_repair(name):
    """The alert ends when its count leaves the window (no traffic after the crash, a reboot
    zeroing the EDAC count): only an operator's return counts."""
    ended = ONSET + timedelta(minutes=10)
    f = fact(name, end=ended)
    later = ended.timestamp() + SETTLE + 60
    d = run(f, in_pool(), healthy(), later)
    assert d.verdict == UNSAFE and d.drain
    assert "nothing on gpu-07 shows an operator's inspection of the node yet" in d.detail
    assert run(f, in_pool(), healthy(boot_time=T + 120), later).verdict == UNSAFE
    back = run(f, in_pool(*RETURNED), healthy(), later)
    assert back.verdict == SAFE and "treated as repaired by the operator" in back.detail


def test_link_back_counts_only_after_the_settle_time():
    up = ONSET + timedelta(minutes=2)
    f = fact("InfinibandLinkDown", end=up)
    early = run(f, in_pool(), healthy(), up.timestamp() + 60)
    assert early.verdict == UNSAFE and "to see it stay clear" in early.detail
    late = run(f, in_pool(), healthy(), up.timestamp() + SETTLE + 1)
    assert late.verdict == SAFE and "cleared at 2026-12-01 12:02:00 UTC and stayed clear" in \
        late.detail


def test_xid_154_follows_the_driver_recovery_action():
    f = fact("GpuXidError", xid=154)
    assert run(f, in_pool(), healthy(gpus={})).verdict == UNKNOWN
    reboot = healthy(gpus={GPU: GpuEvidence(("GPU-aaa",), True, ((T + 1, 2),))})
    d = run(f, in_pool(), reboot)
    assert d.need.action is Action.REBOOT_NODE and d.verdict == UNSAFE and d.drain
    assert "the driver's recovery action said a reboot of the node" in d.detail
    labelled = fact("GpuRecoveryActionRequired", labels={"recovery_action": "gpu_reset"})
    assert run(labelled, in_pool(), healthy()).need.action is Action.RESET_GPU


def test_driver_asking_for_more_than_the_catalog_wins():
    more = healthy(gpus={GPU: GpuEvidence(("GPU-aaa",), True, ((T + 1, 1),))})
    d = run(fact("GpuContainedEccError", xid=94), in_pool(), more)
    assert d.need.action is Action.RESET_GPU and d.verdict == UNSAFE
    assert "the driver's recovery action asks for a GPU reset" in d.detail


def test_nvlink5_xid_needs_decoding_and_never_drains():
    d = run(fact("GpuXidDecodeRequired", xid=145), in_pool(), healthy(gpus={}))
    assert d.verdict == UNKNOWN and not d.drain
    assert "its fields decoded" in d.detail and d.exclusion == "sbatch --exclude=gpu-07"


def test_unknown_xid_points_at_nvidias_catalog():
    d = run(fact("GpuXidUnclassified", xid=999), in_pool(), healthy())
    assert d.verdict == UNKNOWN and not d.drain
    assert "https://docs.nvidia.com/deploy/xid-errors/" in d.advice


def test_stall_is_a_symptom_not_a_faulty_node():
    f = AlertFact(fingerprint="s", alertname="TrainingStalled", starts_at=ONSET,
                  severity="warning", category="workload", hostname=HOST)
    d = run(f, in_pool(), healthy())
    assert d.verdict == UNKNOWN and not d.drain and not d.exclusion
    assert "is a symptom" in d.detail


# --- scheduler state read for what it means to the next job (the probe's cases) ---------------

def test_a_drain_before_the_fault_is_not_remediation():
    kernel_update = (Change(T - 480, "slurm", "IDLE+DRAIN", "kernel update"),
                     Change(T - 120, "slurm", "IDLE", ""))
    f = fact("GpuUncontainedEccError", xid=95, end=ONSET + timedelta(minutes=1))
    d = run(f, in_pool(*kernel_update), healthy(gpus={}))
    assert d.verdict == UNSAFE and "is schedulable (IDLE)" in d.detail


@pytest.mark.parametrize("state", ["IDLE+POWERED_DOWN", "IDLE+RESERVED", "IDLE+POWERING_DOWN"])
def test_power_saving_and_reserved_nodes_are_in_the_pool(state):
    d = run(fact("GpuUncontainedEccError", xid=95),
            in_pool(Change(T + 30, "slurm", state, "")), healthy(gpus={}))
    assert d.verdict == UNSAFE and d.drain


def test_returned_by_an_operator_after_the_onset_is_repaired():
    back = (Change(T + 60, "slurm", "IDLE+DRAIN", "reset"), Change(T + 900, "slurm", "IDLE", ""))
    d = run(fact("GpuUncontainedEccError", xid=95), in_pool(*back), healthy(gpus={}), T + 1000)
    assert d.verdict == SAFE and "treated as repaired by the operator" in d.detail
    still = healthy(gpus={GPU: GpuEvidence(("GPU-aaa",), True, ((T + 5, 1),))})
    d = run(fact("GpuUncontainedEccError", xid=95), in_pool(*back), still, T + 1000)
    assert d.verdict == UNSAFE  # returned, but the driver still asks for the reset


# --- policy ---------------------------------------------------------------------------------------

def test_site_policy_overrides_nvidia_and_says_so():
    policy = Policy.from_config({"xid": {94: "reset_gpu"}})
    d = run(fact("GpuContainedEccError", xid=94), in_pool(), healthy(gpus={}), policy=policy)
    assert d.verdict == UNSAFE and d.drain
    assert ("site policy: XID 94 needs a GPU reset (NVIDIA's catalog: only an application "
            "restart)") in d.detail
    by_bucket = Policy.from_config({"bucket": {"RESTART_APP": "reset_gpu"}})
    assert run(fact("GpuXidApplicationError", xid=13), in_pool(), healthy(gpus={}),
               policy=by_bucket).verdict == UNSAFE
    by_alert = Policy.from_config({"alert": {"GpuThermalViolation": "none"}})
    assert run(fact("GpuThermalViolation"), in_pool(), healthy(),
               policy=by_alert).verdict == SAFE


@pytest.mark.parametrize(("raw", "message"), [
    ({"xid": {94: "drain"}}, "restart_policy.xid.94: 'drain' is not one of"),
    ({"xid": {"x": "none"}}, "restart_policy.xid: 'x' is not an XID code"),
    ({"bucket": {"RESTART": "none"}}, "restart_policy.bucket: 'RESTART' is not an NVIDIA bucket"),
    ({"alert": {"Nope": "none"}}, "restart_policy.alert: 'Nope' is not an alert"),
    ({"xids": {}}, "unknown keys in restart_policy: xids"),
    ({"settle_seconds": "soon"}, "restart_policy.settle_seconds must be a number"),
])
def test_policy_errors_are_named(raw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        Policy.from_config(raw)


def test_without_prometheus_every_host_issue_has_a_verdict():
    facts = [fact("GpuContainedEccError", xid=94),
             AlertFact(fingerprint="d", alertname="GpuDoubleBitEccErrors", starts_at=ONSET
                       + timedelta(hours=2), severity="critical", category="gpu_hardware",
                       hostname="gpu-09", gpu="1")]
    diagnosis = diagnose(facts, timedelta(minutes=10))
    rems = remediations_for(diagnosis, Policy(), None, T + 9000, scheduler="slurm")
    verdicts = sorted((r.verdict, r.exclusion) for r in rems.values())
    assert verdicts == [("safe", ""), ("unknown", "sbatch --exclude=gpu-09")]
    unknown = next(r for r in rems.values() if r.verdict == "unknown")
    assert "the bridge has no Prometheus (prometheus.url not set)" in unknown.detail


# --- the catalog against NVIDIA's -----------------------------------------------------------------

def _rows(name: str) -> list[list[str]]:
    with (DATA / name).open(newline="") as handle:
        return [row for row in csv.reader(handle) if row and row[0].isdigit()]


def test_every_xid_nvidia_lists_is_classified_with_its_bucket():
    nvidia = {int(code): bucket for code, bucket in _rows("xid-catalog-immediate-actions.csv")}
    assert len(nvidia) == 109
    assert set(XIDS) == set(nvidia)
    wrong = {c: (XIDS[c].bucket, b) for c, b in nvidia.items() if XIDS[c].bucket != b}
    assert not wrong


def test_nvsentinel_differs_from_the_catalog_only_where_known():
    # NVSentinel names NVIDIA's CONTACT_SUPPORT "UNEXPECTED_ERR_REPORT_ISSUE"
    sentinel = {int(row[0]): row[2].strip().replace("UNEXPECTED_ERR_REPORT_ISSUE",
                                                   "CONTACT_SUPPORT")
                for row in _rows("nvsentinel-xiderrorsmapping.csv")}
    differs = {c for c, x in XIDS.items() if c in sentinel and sentinel[c] != x.bucket}
    assert differs == {108, 154, 160, 162}


def test_each_code_raises_exactly_one_alert_class():
    seen: list[int] = []
    for cls in XidClass:
        seen += codes(cls)
    assert sorted(seen) == sorted(XIDS)
    assert codes(XidClass.CONTAINED_ECC) == (94,) and codes(XidClass.FALLEN_OFF_BUS) == (79,)
    assert {46, 110} <= set(codes(XidClass.HARDWARE))  # a GPU reset: critical, not a warning
    assert set(codes(XidClass.DECODE)) == {74, *range(144, 151)}
    assert XIDS[156].meaning == "Resource retirement event"


def test_the_vendored_catalogs_say_where_they_come_from():
    """Each file under tests/data/nvidia has its provenance row (NVIDIA's page for the catalog
    transcription), and the tests catalog/xid.py cites exist."""
    readme = (DATA.parent / "README.md").read_text()
    missing = [p.name for p in sorted(DATA.iterdir()) if f"`nvidia/{p.name}`" not in readme]
    assert not missing
    assert CATALOG_URL in readme
    cited = re.findall(r"``(tests/\w+\.py)``", xid_catalog.__doc__ or "")
    root = Path(__file__).resolve().parent.parent
    assert cited and [c for c in cited if not (root / c).exists()] == []
