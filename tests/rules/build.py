"""Build the promtool unit-test files in tests/rules/ from compact case definitions.

Every alert in the catalog gets a fault case (fires, with its exact labels and annotations) and a
healthy twin (stays silent); GPU cases run for both dcgm-exporter label spellings (``Hostname`` up
to 4.8.2, ``hostname`` after). The attribution shapes of contract 2 (two runs on a host, replicated
join series, several faulty GPUs or ports, runs with unknown GPUs, idle hosts) each get a case.
``python -m tests.rules.build`` rewrites the files (``--check`` compares);
``tests/test_generated.py`` checks they are current.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.rules import host_cases
from wandb_infra.alert_rules import generate
from wandb_infra.catalog.alerts import ALERTS
from wandb_infra.common.generated import write_or_check

ROOT = Path(__file__).resolve().parents[2]

HERE = Path(__file__).resolve().parent
SPELLINGS = ("Hostname", "hostname")
RUN_A = {"wandb_entity": "acme", "wandb_project": "llm", "wandb_run_id": "runa"}
RUN_B = {"wandb_entity": "acme", "wandb_project": "llm", "wandb_run_id": "runb"}
GIB_MIB = 40_000


def _labels(d: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in d.items())


@dataclass
class Series:
    """One input series: name, labels, promtool values notation."""

    name: str
    labels: dict[str, str]
    values: str

    def as_dict(self) -> dict[str, str]:
        """The promtool input_series entry."""
        return {"series": f"{self.name}{{{_labels(self.labels)}}}", "values": self.values}


def dcgm(sp: str, metric: str, values: str, host: str = "n1", gpu: str = "0",
         **extra: str) -> Series:
    """A dcgm-exporter series with the given host label spelling."""
    return Series(metric, {sp: host, "gpu": gpu, "UUID": f"GPU-{host}-{gpu}",
                           "device": f"nvidia{gpu}", "modelName": "NVIDIA H100 80GB HBM3",
                           "instance": f"{host}:9400", "job": "dcgm", **extra}, values)


def reported(sp: str, host: str = "n1", metric: str = "DCGM_FI_DEV_GPU_TEMP") -> Series:
    """GPU 0's temperature, which every dcgm-exporter exports: the target map (which host a
    dcgm-exporter target reports) reads it, and the straggler's second utilisation read keeps
    only the targets that map names."""
    return dcgm(sp, metric, "40x80", host)


def node(metric: str, values: str, host: str = "n1", **extra: str) -> Series:
    """A node_exporter series (no hostname label, as scraped)."""
    return Series(metric, {"instance": f"{host}:9100", "job": "node", **extra}, values)


def uname(host: str = "n1") -> Series:
    """node_uname_info, the only node_exporter series that names the host."""
    return node("node_uname_info", "1x80", host, nodename=host, sysname="Linux")


def gpu_info(run: dict[str, str], gpu: str, host: str = "n1", source: str = "slurm") -> Series:
    """Contract-1 per-GPU join metric."""
    return Series("wandb_run_gpu_info", {**run, "hostname": host, "gpu": gpu,
                                         "gpu_uuid": f"GPU-{host}-{gpu}", "source": source},
                  "1x80")


def node_info(run: dict[str, str], host: str = "n1", source: str = "slurm") -> Series:
    """Contract-1 per-host join metric."""
    return Series("wandb_run_node_info", {**run, "wandb_run_name": "run-" + run["wandb_run_id"],
                                          "hostname": host, "source": source}, "1x80")


@dataclass
class Expect:
    """An expected alert: its entity/run labels and its rendered description."""

    labels: dict[str, str]
    description: str


@dataclass
class Case:
    """One promtool test: series, when to evaluate, which alert, what (if anything) fires."""

    name: str
    alert: str
    series: list[Series]
    eval_time: str
    expect: list[Expect] = field(default_factory=list)
    # More times at which the same expectation must hold (one ``alert_rule_test`` each), for a
    # result that must not depend on the evaluation a rule group's timer happens to land on.
    also_at: tuple[str, ...] = ()
    # promtool's input series interval (the rule evaluation interval is the file's).
    interval: str = "30s"

    def as_dict(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """The promtool test entry."""
        d = ALERTS[self.alert]
        static = generate._alert(d, cfg, generate.record_tiers(cfg["violation_unit"]))
        exp = []
        for e in self.expect:
            ann = dict(static["annotations"])
            ann["description"] = e.description
            exp.append({"exp_labels": {**static["labels"], **e.labels}, "exp_annotations": ann})
        checks = []
        for at in (self.eval_time, *self.also_at):
            test: dict[str, Any] = {"eval_time": at, "alertname": self.alert}
            if exp:
                test["exp_alerts"] = exp
            checks.append(test)
        return {"name": self.name, "interval": self.interval,
                "input_series": [s.as_dict() for s in self.series],
                "alert_rule_test": checks}


def g(host: str = "n1", gpu: str = "0", **extra: str) -> dict[str, str]:
    """Entity labels of a GPU alert."""
    return {"hostname": host, "gpu": gpu, "gpu_uuid": f"GPU-{host}-{gpu}", **extra}


def healthy_gpus(sp: str, host: str = "n1", gpus: tuple[str, ...] = ("0", "1")) -> list[Series]:
    """Background telemetry of a healthy host so 'the host still reports' holds."""
    return [dcgm(sp, "DCGM_FI_DEV_GPU_TEMP", "40x80", host, gpu) for gpu in gpus]


def _pair(name: str, alert: str, fault: list[Series], healthy: list[Series], eval_time: str,  # noqa: PLR0917
          expect: list[Expect]) -> list[Case]:
    return [Case(f"{alert}: {name}", alert, fault, eval_time, expect),
            Case(f"{alert}: healthy twin of {name}", alert, healthy, eval_time)]


def _xid(sp: str, code: str, values: str | None = None, gpu: str = "0", **extra: str) -> Series:
    return dcgm(sp, "DCGM_FI_DEV_XID_ERRORS", values or f"{code}x80", gpu=gpu, err_code=code,
                err_msg="msg", **extra)


W = "GPU 0 on n1"


def gpu_cases(sp: str) -> list[Case]:
    """Fault + healthy twin for every GPU alert, unattributed (idle host)."""
    bg = healthy_gpus(sp)
    ok = [*bg, _xid(sp, "0", "0x80")]
    cases: list[Case] = []
    for alert, code, desc in (
        ("GpuXidError", "48", f"XID 48 on {W} (1 event(s) in the last 10-15 minutes)."),
        ("GpuContainedEccError", "94",
         f"Contained uncorrectable ECC error (XID 94) on {W} (1 event(s))."),
        ("GpuUncontainedEccError", "95",
         f"Uncontained uncorrectable ECC error (XID 95) on {W} (1 event(s))."),
        ("GpuXidApplicationError", "13", f"XID 13 on {W} (1 event(s) in the last 10-15 minutes)."),
        ("GpuXidInformational", "63", f"XID 63 on {W} (1 event(s) in the last 10-15 minutes)."),
        ("GpuXidUnclassified", "57", f"XID 57 on {W} (1 event(s) in the last 10-15 minutes)."),
        ("GpuXidDecodeRequired", "145",
         f"XID 145 on {W} (1 event(s) in the last 10-15 minutes)."),
    ):
        cases += _pair(f"XID {code} ({sp})", alert, [*bg, _xid(sp, code)], ok, "3m",
                       [Expect(g(xid=code), desc)])
    cases.append(Case(f"GpuXidError: XID 48 ends after 10 minutes ({sp})", "GpuXidError",
                      [*bg, _xid(sp, "48")], "12m"))
    cases.append(Case(f"GpuXidError: contained ECC 94 is not a generic XID ({sp})",
                      "GpuXidError", [*bg, _xid(sp, "94")], "3m"))
    cases.append(Case(
        f"GpuXidError: DCGM_EXP_XID_ERRORS_COUNT counts ({sp})", "GpuXidError",
        [*bg, dcgm(sp, "DCGM_EXP_XID_ERRORS_COUNT", "0x4 3x20", xid="119",
                   window_size_in_ms="300000")],
        "5m", [Expect(g(xid="119"), f"XID 119 on {W} (3 event(s) in the last 10-15 "
                                    "minutes).")]))
    # the driver's recovery action, current and legacy field name, labelled with its name
    for metric, value, name in (("DCGM_FI_DEV_GPU_RECOVERY_ACTION", "1", "gpu_reset"),
                                ("DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", "2", "node_reboot")):
        cases += _pair(f"{metric} = {value} ({sp})", "GpuRecoveryActionRequired",
                       [*bg, dcgm(sp, metric, f"{value}x80")], [*bg, dcgm(sp, metric, "0x80")],
                       "2m", [Expect(g(recovery_action=name),
                                     f"The driver's recovery action for {W} is {name} (DCGM "
                                     f"field 1523 = {value}).")])
    gone = [dcgm(sp, "DCGM_FI_DEV_GPU_TEMP", "40x80", gpu="0"),
            dcgm(sp, "DCGM_FI_DEV_GPU_TEMP", "40x10", gpu="1")]
    cases += _pair(f"GPU series vanished ({sp})", "GpuFallenOffBus", gone, bg, "14m",
                   [Expect(g(gpu="1"), "GPU 1 on n1 stopped responding: XID 79, or its metrics "
                           "vanished while the host still reports other GPUs.")])
    cases.append(Case(f"GpuFallenOffBus: XID 79 ({sp})", "GpuFallenOffBus",
                      [*bg, _xid(sp, "79")], "3m",
                      [Expect(g(), f"{W} stopped responding: XID 79, or its metrics vanished "
                              "while the host still reports other GPUs.")]))
    cases += _pair(f"GPU series vanished ({sp})", "NodeGpuCountDropped", gone, bg, "14m",
                   [Expect({"hostname": "n1"}, "n1 reports 1 GPU(s) fewer than in the last "
                           "hour.")])

    def one(alert: str, metric: str, bad: str, good: str, at: str, desc: str,  # noqa: PLR0917
            extra: list[Series] | None = None, **labels: str) -> None:
        nonlocal cases
        cases += _pair(f"{metric} ({sp})", alert,
                       [*bg, *(extra or []), dcgm(sp, metric, bad, **labels)],
                       [*bg, *(extra or []), dcgm(sp, metric, good, **labels)], at,
                       [Expect(g(), desc)])

    one("GpuDoubleBitEccErrors", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0x20 2x60", "0x80", "15m",
        f"2 double-bit ECC error(s) on {W} in the last 10 minutes.")
    one("GpuSingleBitEccStorm", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "0+20x80", "0+1x80", "20m",
        f"400 corrected single-bit ECC errors on {W} in 10 minutes.")
    one("GpuMemoryRetirementLimit", "DCGM_FI_DEV_RETIRED_SBE", "40x80", "10x80", "7m",
        f"{W} is over DCGM's memory retirement limit (value 70: retired pages >= 63 or "
        "uncorrectable remapped rows >= 512).",
        extra=[dcgm(sp, "DCGM_FI_DEV_RETIRED_DBE", "30x80")])
    one("GpuRowRemapFailure", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "1x80", "0x80", "1m",
        f"Row remapping failed on {W} (value 1).")
    one("GpuRowRemapPending", "DCGM_FI_DEV_ROW_REMAP_PENDING", "1x80", "0x80", "7m",
        f"1 pending row remap(s) or page retirement(s) on {W}.")
    one("GpuThermalViolation", "DCGM_FI_DEV_THERMAL_VIOLATION", "0+15000000000x80",
        "0+30000000x80", "15m",
        f"{W} was thermally throttled 50% of the last 5 minutes (100% when read from the HW "
        "thermal/slowdown clock-event bits).")
    one("GpuThermalViolation", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "65x80", "1x80", "7m",
        f"{W} was thermally throttled 100% of the last 5 minutes (100% when read from the HW "
        "thermal/slowdown clock-event bits).")
    one("GpuPowerBrake", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "132x80", "4x80", "3m",
        f"The HW power brake clock-event bit is set on {W} (bitmask 132).")
    one("GpuPowerThrottled", "DCGM_FI_DEV_POWER_VIOLATION", "0+15000000000x80", "0x80", "20m",
        f"{W} was power-throttled 50% of the last 5 minutes.")
    for alert, metric, prefix in (("GpuTemperature", "DCGM_FI_DEV_GPU_TEMP", W),
                                  ("GpuMemoryTemperature", "DCGM_FI_DEV_MEMORY_TEMP",
                                   f"HBM of {W}")):
        base = [dcgm(sp, "DCGM_FI_DEV_GPU_TEMP", "40x80", gpu="1")]
        if metric != "DCGM_FI_DEV_GPU_TEMP":
            base.append(dcgm(sp, "DCGM_FI_DEV_GPU_TEMP", "40x80"))
        cases += _pair(f"{metric} 88 C ({sp})", alert + "High",
                       [*base, dcgm(sp, metric, "88x80")], [*base, dcgm(sp, metric, "70x80")],
                       "7m", [Expect(g(), f"{prefix} is at 88 C (warning at 85 C).")])
        cases.append(Case(f"{alert}High: silent when critical ({sp})", alert + "High",
                          [*base, dcgm(sp, metric, "97x80")], "7m"))
        cases += _pair(f"{metric} 97 C ({sp})", alert + "Critical",
                       [*base, dcgm(sp, metric, "97x80")], [*base, dcgm(sp, metric, "88x80")],
                       "3m", [Expect(g(), f"{prefix} is at 97 C (critical at 95 C).")])
    one("GpuNvlinkErrors", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "0+3x80", "0x80",
        "12m", f"NVLink CRC errors on {W}: 100m/s.")
    one("GpuNvlinkFailure", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "0x10 5x70", "0x80",
        "15m", f"NVLink replay/recovery errors or a CRC storm on {W} (value 5).")
    one("GpuPcieReplayRate", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "0+30x80", "0+1x80", "15m",
        f"{W} replays 60 PCIe packets per minute (DCGM warns above 16).")
    return cases


def workload_cases(sp: str) -> list[Case]:
    """TrainingStalled and TrainingStraggler on a run with known GPUs."""
    run = [node_info(RUN_A), *(gpu_info(RUN_A, str(i)) for i in range(4))]
    active = [dcgm(sp, "DCGM_FI_DEV_FB_USED", f"{GIB_MIB}x80", gpu=str(i)) for i in range(4)]
    hung = [dcgm(sp, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.6x30 0.01x50", gpu=str(i))
            for i in range(4)]
    busy = [dcgm(sp, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.6x80", gpu=str(i)) for i in range(4)]
    freed = [dcgm(sp, "DCGM_FI_DEV_FB_USED", f"{GIB_MIB}x30 0x50", gpu=str(i))
             for i in range(4)]
    cases = _pair(f"tensor activity fell, memory held ({sp})", "TrainingStalled",
                  [*run, *active, *hung], [*run, *active, *busy], "30m",
                  [Expect({**RUN_A, "hostname": "n1"},
                          "Tensor activity of the run's GPUs on n1 fell to 1% while their memory "
                          "stays allocated, after being active in the last hour.")])
    cases.append(Case(f"TrainingStalled: silent when memory was freed (crash or end) ({sp})",
                      "TrainingStalled", [*run, *freed, *hung], "30m"))
    cases.append(Case(f"TrainingStalled: silent for a run that never used tensor cores ({sp})",
                      "TrainingStalled",
                      [*run, *active, *(dcgm(sp, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0x80",
                                             gpu=str(i)) for i in range(4))], "30m"))
    cases.append(Case(f"TrainingStalled: silent while one of the run's GPUs still computes ({sp})",
                      "TrainingStalled",
                      [*run, *active, *hung[:3],
                       dcgm(sp, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.6x80", gpu="3")], "30m"))
    host_gpus = [dcgm(sp, "DCGM_FI_DEV_GPU_TEMP", "40x80", gpu=str(i)) for i in range(4)]
    cases.append(Case(f"TrainingStalled: a run with unknown GPUs alone on the host ({sp})",
                      "TrainingStalled", [node_info(RUN_A), *host_gpus, *active, *hung], "30m",
                      [Expect({**RUN_A, "hostname": "n1"},
                              "Tensor activity of the run's GPUs on n1 fell to 1% while their "
                              "memory stays allocated, after being active in the last hour.")]))
    cases.append(Case(f"TrainingStalled: two runs with unknown GPUs share the host ({sp})",
                      "TrainingStalled",
                      [node_info(RUN_A), node_info(RUN_B), *host_gpus, *active, *hung], "30m"))
    util = [reported(sp), *(dcgm(sp, "DCGM_FI_DEV_GPU_UTIL", "95x80", gpu=str(i))
                            for i in range(3))]
    cases += _pair(f"one GPU far behind ({sp})", "TrainingStraggler",
                   [*run, *util, dcgm(sp, "DCGM_FI_DEV_GPU_UTIL", "60x80", gpu="3")],
                   [*run, *util, dcgm(sp, "DCGM_FI_DEV_GPU_UTIL", "92x80", gpu="3")], "8m",
                   [Expect({**RUN_A, "hostname": "n1", "gpu": "3"},
                           "GPU 3 on n1 averaged 60% utilisation over 2 minutes, more than 10 "
                           "points below the run's busiest GPU.")])
    two_hosts = [node_info(RUN_A), gpu_info(RUN_A, "0"), node_info(RUN_A, "n2"),
                 gpu_info(RUN_A, "0", "n2"), dcgm(sp, "DCGM_FI_DEV_GPU_UTIL", "60x80"),
                 node_info(RUN_B, "n3"), gpu_info(RUN_B, "0", "n3"),
                 *(reported(sp, host) for host in ("n1", "n2", "n3"))]
    cases += _pair(f"busiest GPU on another host ({sp})", "TrainingStraggler",
                   [*two_hosts, dcgm(sp, "DCGM_FI_DEV_GPU_UTIL", "95x80", "n2"),
                    dcgm(sp, "DCGM_FI_DEV_GPU_UTIL", "100x80", "n3")],
                   [*two_hosts, dcgm(sp, "DCGM_FI_DEV_GPU_UTIL", "65x80", "n2"),
                    dcgm(sp, "DCGM_FI_DEV_GPU_UTIL", "100x80", "n3")], "8m",
                   [Expect({**RUN_A, "hostname": "n1", "gpu": "0"},
                           "GPU 0 on n1 averaged 60% utilisation over 2 minutes, more than 10 "
                           "points below the run's busiest GPU.")])
    cases += _pair(f"run with unknown GPUs alone on the host ({sp})", "TrainingStraggler",
                   [node_info(RUN_A), *util, dcgm(sp, "DCGM_FI_DEV_GPU_UTIL", "60x80", gpu="3")],
                   [node_info(RUN_A), *util, dcgm(sp, "DCGM_FI_DEV_GPU_UTIL", "92x80", gpu="3")],
                   "8m",
                   [Expect({**RUN_A, "hostname": "n1", "gpu": "3"},
                           "GPU 3 on n1 averaged 60% utilisation over 2 minutes, more than 10 "
                           "points below the run's busiest GPU.")])
    return cases


def node_cases() -> list[Case]:
    """node_exporter-based alerts (no dcgm label spelling involved)."""
    ib = {"device": "mlx5_0", "port": "1"}
    link = {"hostname": "n1", **ib}
    cases = _pair("port went down", "InfinibandLinkDown",
                  [uname(), node("node_infiniband_state_id", "4x10 1x70", **ib)],
                  [uname(), node("node_infiniband_state_id", "4x80", **ib)], "9m",
                  [Expect(link, "InfiniBand mlx5_0 port 1 on n1 is in state 1 (4 = active) after "
                          "being active within the last hour.")])
    cases.append(Case("InfinibandLinkDown: silent for a port never active", "InfinibandLinkDown",
                      [uname(), node("node_infiniband_state_id", "1x80", **ib)], "9m"))
    cases += _pair("link downs", "InfinibandLinkFlapping",
                   [uname(), node("node_infiniband_link_downed_total", "0+1x80", **ib)],
                   [uname(), node("node_infiniband_link_downed_total", "3x80", **ib)], "20m",
                   [Expect(link, "InfiniBand mlx5_0 port 1 on n1 went down or recovered 30 times "
                           "in 15 minutes.")])
    cases += _pair("symbol errors", "InfinibandPhysicalErrors",
                   [uname(), node("node_infiniband_symbol_error_total", "0+30x80", **ib)],
                   [uname(), node("node_infiniband_symbol_error_total", "0x80", **ib)], "15m",
                   [Expect(link, "InfiniBand mlx5_0 port 1 on n1: 1 symbol/link-integrity/remote "
                           "physical errors per second.")])
    cases += _pair("eth0 down", "NetworkInterfaceDown",
                   [uname(), node("node_network_up", "1x10 0x70", device="eth0")],
                   [uname(), node("node_network_up", "1x80", device="eth0")], "9m",
                   [Expect({"hostname": "n1", "device": "eth0"},
                           "Interface eth0 on n1 is down (was up within the last hour; value 0).")])
    cases.append(Case("NetworkInterfaceDown: silent for an interface never up",
                      "NetworkInterfaceDown",
                      [uname(), node("node_network_up", "0x80", device="eth1")], "9m"))
    cases.append(Case("NetworkInterfaceDown: virtual interfaces ignored", "NetworkInterfaceDown",
                      [uname(), node("node_network_up", "1x10 0x70", device="docker0")], "9m"))
    cases += _pair("carrier changes", "NetworkInterfaceFlapping",
                   [uname(), node("node_network_carrier_changes_total", "0+1x80", device="eth0")],
                   [uname(), node("node_network_carrier_changes_total", "2x80", device="eth0")],
                   "20m", [Expect({"hostname": "n1", "device": "eth0"},
                                  "Interface eth0 on n1 changed carrier 30 times in 15 minutes.")])
    cases += _pair("node_exporter target down, no other exporter on the host", "NodeDown",
                   [uname("n1").__class__("node_uname_info", uname().labels, "1x10"),
                    node("up", "1x10 0x70")],
                   [uname(), node("up", "1x80")], "10m",
                   [Expect({"hostname": "n1", "exporter": "node_exporter"}, NODE_LOST)])
    return cases


NODE_LOST = ("n1 is down: its node_exporter target is down or gone together with its "
             "dcgm-exporter, or while the scheduler calls the node down (up = 0).")


def _gap(exporter: str) -> str:
    return (f"The {exporter} target of n1 is down or gone (up = 0) while the node answers: "
            "faults it would report on this host are not seen.")


def exporter_gap_cases(sp: str) -> list[Case]:
    """Down means down: node_exporter down while dcgm-exporter answers is a node loss only when
    the scheduler says the node is down; either exporter down alone is a telemetry gap."""
    temp = dcgm(sp, "DCGM_FI_DEV_GPU_TEMP", "40x80")
    dcgm_up = Series("up", {"instance": "n1:9400", "job": "dcgm"}, "1x80")
    node_down = [Series("node_uname_info", uname().labels, "1x10"), node("up", "1x10 0x70")]
    run = {**RUN_A, "hostname": "n1", "exporter": "node_exporter"}

    def slurm(state: str) -> Series:
        return Series("wandb_infra_node_state", {"instance": "exp:9500", "job": "exporter",
                                                 "hostname": "n1", "scheduler": "slurm",
                                                 "state": state, "reason": ""}, "1x80")

    dcgm_down = [dcgm(sp, "DCGM_FI_DEV_GPU_TEMP", "40x10"),
                 Series("up", {"instance": "n1:9400", "job": "dcgm"}, "1x10 0x70"),
                 uname(), node("up", "1x80"), node_info(RUN_A)]
    gap_dcgm = Expect({**RUN_A, "hostname": "n1", "exporter": "dcgm_exporter"},
                      _gap("dcgm_exporter"))
    return [
        Case(f"NodeDown: silent when only dcgm-exporter is down on a live node ({sp})",
             "NodeDown", dcgm_down, "10m"),
        Case(f"HostTelemetryGap: only dcgm-exporter down on a live node ({sp})",
             "HostTelemetryGap", dcgm_down, "10m", [gap_dcgm]),
        Case(f"NodeDown: node_exporter down, dcgm-exporter up, Slurm says DOWN ({sp})",
             "NodeDown", [temp, dcgm_up, *node_down, node_info(RUN_A), slurm("DOWN+DRAIN")],
             "10m", [Expect(run, NODE_LOST)]),
        Case(f"HostTelemetryGap: silent when the node is lost ({sp})", "HostTelemetryGap",
             [temp, dcgm_up, *node_down, node_info(RUN_A), slurm("IDLE*")], "10m"),
        Case(f"NodeDown: silent when node_exporter is down and the node is in use ({sp})",
             "NodeDown", [temp, dcgm_up, *node_down, node_info(RUN_A), slurm("ALLOCATED")],
             "10m"),
        Case(f"HostTelemetryGap: node_exporter down while dcgm-exporter answers ({sp})",
             "HostTelemetryGap", [temp, dcgm_up, *node_down, node_info(RUN_A),
                                  slurm("ALLOCATED")], "10m",
             [Expect(run, _gap("node_exporter"))]),
    ]


def dcgm_node_cases(sp: str) -> list[Case]:
    """NodeDown from the dcgm-exporter side, and telemetry that is simply not deployed."""
    temp = dcgm(sp, "DCGM_FI_DEV_GPU_TEMP", "40x10")
    up_down = Series("up", {"instance": "n1:9400", "job": "dcgm"}, "1x10 0x70")
    cases = [Case(f"HostTelemetryGap: dcgm-exporter target down ({sp})", "HostTelemetryGap",
                  [temp, up_down], "10m",
                  [Expect({"hostname": "n1", "exporter": "dcgm_exporter"},
                          _gap("dcgm_exporter"))]),
             Case(f"NodeDown: silent when only the dcgm-exporter target is down ({sp})",
                  "NodeDown", [temp, up_down], "10m")]
    only_dcgm = [dcgm(sp, "DCGM_FI_DEV_GPU_TEMP", "40x80"),
                 Series("up", {"instance": "n1:9400", "job": "dcgm"}, "1x80"), node_info(RUN_A)]
    cases.append(Case(f"NodeDown: silent when node_exporter is not deployed ({sp})", "NodeDown",
                      only_dcgm, "20m"))
    gone = [dcgm(sp, "DCGM_FI_DEV_GPU_TEMP", "40x10"),
            Series("up", {"instance": "n1:9400", "job": "dcgm"}, "1x10"), node_info(RUN_A)]
    cases.append(Case(f"HostTelemetryGap: target of a run's host vanished from discovery ({sp})",
                      "HostTelemetryGap", gone, "15m",
                      [Expect({**RUN_A, "hostname": "n1", "exporter": "dcgm_exporter"},
                              _gap("dcgm_exporter"))]))
    moved = [dcgm(sp, "DCGM_FI_DEV_GPU_TEMP", "40x10"),
             Series("up", {"instance": "n1:9400", "job": "dcgm"}, "1x10"),
             dcgm(sp, "DCGM_FI_DEV_GPU_TEMP", "_x5 40x75", instance="10.0.0.1:9400"),
             Series("up", {"instance": "10.0.0.1:9400", "job": "dcgm"}, "_x5 1x75"),
             node_info(RUN_A)]
    cases.append(Case(f"NodeDown: silent when a target moves to a new address ({sp})", "NodeDown",
                      moved, "20m"))
    return cases


def attribution_cases(sp: str) -> list[Case]:
    """Contract 2's join shapes; each must evaluate and attribute exactly as stated."""
    bg = healthy_gpus(sp, gpus=("0", "1", "2", "3"))
    ecc = "GpuContainedEccError"
    d94 = "Contained uncorrectable ECC error (XID 94) on GPU {g} on n1 (1 event(s))."

    def x94(gpu: str) -> Series:
        return _xid(sp, "94", gpu=gpu)

    def e(gpu: str, run: dict[str, str] | None = None) -> Expect:
        return Expect({**(run or {}), **g(gpu=gpu, xid="94")}, d94.format(g=gpu))

    def count94(gpu: str, n: int) -> Series:
        return dcgm(sp, "DCGM_EXP_XID_ERRORS_COUNT", f"{n}x80", gpu=gpu, xid="94",
                    window_size_in_ms="300000")

    def host_e(gpu: str, run: dict[str, str], n: int = 1) -> Expect:
        desc = d94.format(g=gpu).replace("(1 event", f"({n} event")
        return Expect({**run, **g(gpu=gpu, xid="94")}, desc)

    two_runs = [node_info(RUN_A), node_info(RUN_B), gpu_info(RUN_A, "0"), gpu_info(RUN_A, "1"),
                gpu_info(RUN_B, "2"), gpu_info(RUN_B, "3")]
    cases = [
        Case(f"attribution: fault on a run's GPU ({sp})", ecc,
             [*bg, node_info(RUN_A), gpu_info(RUN_A, "0"), x94("0")], "3m", [e("0", RUN_A)]),
        Case(f"attribution: two runs on a host, fault on A's GPU goes to A only ({sp})", ecc,
             [*bg, *two_runs, x94("1")], "3m", [e("1", RUN_A)]),
        Case(f"attribution: join series duplicated by two exporter replicas ({sp})", ecc,
             [*bg, node_info(RUN_A), node_info(RUN_A, source="replica2"),
              gpu_info(RUN_A, "0"), gpu_info(RUN_A, "0", source="replica2"), x94("0")],
             "3m", [e("0", RUN_A)]),
        Case(f"attribution: several faulty GPUs, two runs ({sp})", ecc,
             [*bg, *two_runs, x94("0"), x94("1"), x94("3")], "3m",
             [e("0", RUN_A), e("1", RUN_A), e("3", RUN_B)]),
        Case(f"attribution: two runs share one GPU ({sp})", ecc,
             [*bg, node_info(RUN_A), node_info(RUN_B), gpu_info(RUN_A, "0"),
              gpu_info(RUN_B, "0"), x94("0")], "3m", [e("0", RUN_A), e("0", RUN_B)]),
        Case(f"attribution: run with unknown GPUs gets the host's fault ({sp})", ecc,
             [*bg, node_info(RUN_A), x94("2")], "3m", [host_e("2", RUN_A)]),
        Case(f"attribution: run with unknown GPUs never gets another run's GPU ({sp})", ecc,
             [*bg, node_info(RUN_A), node_info(RUN_B), gpu_info(RUN_A, "0"), x94("0")], "3m",
             [e("0", RUN_A)]),
        Case(f"attribution: two runs with unknown GPUs, several faulty GPUs ({sp})", ecc,
             [*bg, node_info(RUN_A), node_info(RUN_B), count94("1", 1), count94("3", 2)], "3m",
             [host_e("3", RUN_A, 2), host_e("3", RUN_B, 2)]),
        Case(f"attribution: idle host alerts without run labels ({sp})", ecc,
             [*bg, node_info(RUN_A, host="n2"), x94("0"), x94("1")], "3m", [e("0"), e("1")]),
        Case(f"attribution: idle GPU on a busy host stays unattributed ({sp})", ecc,
             [*bg, node_info(RUN_A), gpu_info(RUN_A, "0"), x94("3")], "3m", [e("3")]),
        Case(f"attribution: thermal fault on two runs' GPUs with replicas ({sp})",
             "GpuTemperatureCritical",
             [dcgm(sp, "DCGM_FI_DEV_GPU_TEMP", "97x80", gpu="0"),
              dcgm(sp, "DCGM_FI_DEV_GPU_TEMP", "97x80", gpu="2"),
              dcgm(sp, "DCGM_FI_DEV_GPU_TEMP", "97x80", gpu="2", instance="n1-replica:9400"),
              *two_runs, node_info(RUN_B, source="replica2")], "3m",
             [Expect({**RUN_A, **g(gpu="0")}, "GPU 0 on n1 is at 97 C (critical at 95 C)."),
              Expect({**RUN_B, **g(gpu="2")}, "GPU 2 on n1 is at 97 C (critical at 95 C).")]),
    ]
    return cases


def link_attribution_cases() -> list[Case]:
    """Several faulty ports on a host with two runs (and a replicated join series)."""
    runs = [node_info(RUN_A), node_info(RUN_B), node_info(RUN_B, source="replica2")]
    ports = [node("node_infiniband_state_id", "4x10 1x70", device="mlx5_0", port="1"),
             node("node_infiniband_state_id", "4x10 2x70", device="mlx5_1", port="1")]
    got = []
    for run in (RUN_A, RUN_B):
        got.append(Expect({**run, "hostname": "n1", "device": "mlx5_1", "port": "1"},
                          "InfiniBand mlx5_1 port 1 on n1 is in state 2 (4 = active) after being "
                          "active within the last hour."))
    down = [Series("up", {"instance": "n1:9100", "job": "node"}, "1x10 0x70"),
            Series("up", {"instance": "n1:9400", "job": "dcgm"}, "1x10 0x70"),
            dcgm("Hostname", "DCGM_FI_DEV_GPU_TEMP", "40x10"),
            Series("node_uname_info", uname().labels, "1x10")]
    return [
        Case("attribution: two faulty ports, two runs, replicated join", "InfinibandLinkDown",
             [uname(), *runs, *ports], "9m", got),
        Case("attribution: node down under two runs, both exporters down", "NodeDown",
             [*runs, *down], "10m",
             [Expect({**run, "hostname": "n1", "exporter": "node_exporter"}, NODE_LOST)
              for run in (RUN_A, RUN_B)]),
    ]


def dcgm49_cases() -> list[Case]:
    """dcgm-exporter 4.9 renames and unit changes reach the same alerts."""
    sp = "hostname"
    bg = [dcgm(sp, "DCGM_FI_DEV_GPU_TEMP_CELSIUS", "40x80", gpu="1")]
    run = [node_info(RUN_A), *(gpu_info(RUN_A, str(i)) for i in range(4))]
    util = [reported(sp, metric="DCGM_FI_DEV_GPU_TEMP_CELSIUS"),
            *(dcgm(sp, "DCGM_FI_DEV_GPU_UTIL_RATIO", "0.95x80", gpu=str(i)) for i in range(3))]
    return [
        *_pair("4.9 temperature name", "GpuTemperatureCritical",
               [*bg, dcgm(sp, "DCGM_FI_DEV_GPU_TEMP_CELSIUS", "97x80")],
               [*bg, dcgm(sp, "DCGM_FI_DEV_GPU_TEMP_CELSIUS", "60x80")], "3m",
               [Expect(g(), f"{W} is at 97 C (critical at 95 C).")]),
        *_pair("4.9 XID name", "GpuContainedEccError",
               [*bg, dcgm(sp, "DCGM_FI_DEV_XID_ERROR", "94x80", err_code="94")],
               [*bg, dcgm(sp, "DCGM_FI_DEV_XID_ERROR", "0x80", err_code="0")], "3m",
               [Expect(g(xid="94"),
                       f"Contained uncorrectable ECC error (XID 94) on {W} (1 event(s)).")]),
        *_pair("4.9 utilisation ratio", "TrainingStraggler",
               [*run, *util, dcgm(sp, "DCGM_FI_DEV_GPU_UTIL_RATIO", "0.6x80", gpu="3")],
               [*run, *util, dcgm(sp, "DCGM_FI_DEV_GPU_UTIL_RATIO", "0.92x80", gpu="3")], "8m",
               [Expect({**RUN_A, "hostname": "n1", "gpu": "3"},
                       "GPU 3 on n1 averaged 60% utilisation over 2 minutes, more than 10 "
                       "points below the run's busiest GPU.")]),
        *_pair("4.9 PCIe replay name", "GpuPcieReplayRate",
               [*bg, dcgm(sp, "DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "0+30x80")],
               [*bg, dcgm(sp, "DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "0+1x80")], "15m",
               [Expect(g(), f"{W} replays 60 PCIe packets per minute (DCGM warns above 16).")]),
        *_pair("4.9 row remap name", "GpuRowRemapFailure",
               [*bg, dcgm(sp, "DCGM_FI_DEV_ROW_REMAP_FAILED", "1x80")],
               [*bg, dcgm(sp, "DCGM_FI_DEV_ROW_REMAP_FAILED", "0x80")], "1m",
               [Expect(g(), f"Row remapping failed on {W} (value 1).")]),
    ]


# dcgm-exporter's label sets, vendored from upstream (tests/data/README.md).
EXPOSITION = yaml.safe_load((HERE.parent / "data" / "dcgm" / "exposition-labels.yaml")
                            .read_text(encoding="utf-8"))


def _volatile(kind: str, generation: int) -> dict[str, str]:
    """Labels dcgm-exporter adds or changes without the XID event changing: a new pod or job on
    the GPU, a restarted exporter pod, a driver upgrade (``generation`` 0 is the first)."""
    return {
        "kubernetes": {k: f"{k}-{generation}" for k in EXPOSITION["kubernetes"]},
        "hpc": {k: str(4000 + generation) for k in EXPOSITION["hpc"]},
        "instance": {"instance": f"10.1.0.{generation + 1}:9400"},
        "driver": {EXPOSITION["driver_label"]: f"55{generation}.54.15"},
    }[kind]


def real_telemetry_cases() -> list[Case]:
    """What real dcgm-exporter and node_exporter deployments emit: volatile labels on an old XID,
    the host-label rename across an upgrade, FQDN and EKS node names, MIG instances."""
    ecc, d94 = "GpuContainedEccError", "Contained uncorrectable ECC error (XID 94) on GPU 0 on n1"
    bg = healthy_gpus("hostname")
    runs_after = [node_info(RUN_B), gpu_info(RUN_B, "0")]
    cases = []
    for kind in ("kubernetes", "hpc", "instance", "driver"):
        # XID 94 happened long ago under generation 0; at 20m the labels change (new pod, job,
        # exporter pod, driver) and run B takes the GPU. The gauge still holds 94.
        old = _xid("hostname", "94", "94x39", **_volatile(kind, 0))
        new = _xid("hostname", "94", "_x40 94x40", **_volatile(kind, 1))
        cases.append(Case(f"{ecc}: an old XID under a new {kind} label set is no new event",
                          ecc, [*bg, *runs_after, old, new], "22m"))
        fresh = _xid("hostname", "79", "_x40 79x40", **_volatile(kind, 1))
        cases.append(Case(f"GpuFallenOffBus: a new code after a {kind} label change alerts",
                          "GpuFallenOffBus", [*bg, *runs_after, old, fresh], "22m",
                          [Expect({**RUN_B, **g()}, f"{W} stopped responding: XID 79, or its "
                                  "metrics vanished while the host still reports other GPUs.")]))
    cases.append(Case(f"{ecc}: dcgm-exporter upgrade across the Hostname -> hostname rename",
                      ecc, [*bg, *runs_after, _xid("Hostname", "94", "94x39"),
                            _xid("hostname", "94", "_x40 94x40")], "22m"))
    cases += restart_cases()
    cases.append(Case(f"{ecc}: a new XID reaches only the run on that GPU", ecc,
                      [*bg, node_info(RUN_A), node_info(RUN_B), gpu_info(RUN_A, "0"),
                       gpu_info(RUN_B, "1"), _xid("hostname", "94", "_x20 94x40",
                                                  **_volatile("kubernetes", 0))], "12m",
                      [Expect({**RUN_A, **g(xid="94")}, f"{d94} (1 event(s)).")]))
    for name, raw, key in (("FQDN", "n1.cluster.example.com", "n1"),
                           ("EKS node name", "ip-10-0-1-23.us-west-2.compute.internal",
                            "ip-10-0-1-23"),
                           ("IPv4 address kept whole", "10.0.1.23", "10.0.1.23")):
        for sp in SPELLINGS:
            desc = d94.replace("n1", key)
            cases.append(Case(f"{ecc}: dcgm host label {sp}={raw} ({name})", ecc,
                              [dcgm(sp, "DCGM_FI_DEV_GPU_TEMP", "40x80", raw, "1"),
                               node_info(RUN_A, key), gpu_info(RUN_A, "0", key),
                               dcgm(sp, "DCGM_FI_DEV_XID_ERRORS", "94x80", raw, err_code="94")],
                              "3m", [Expect({**RUN_A, **g(key, xid="94"),
                                             "gpu_uuid": f"GPU-{raw}-0"},
                                            f"{desc} (1 event(s)).")]))
        cases.append(Case(f"InfinibandLinkDown: node_uname_info nodename={raw} ({name})",
                          "InfinibandLinkDown",
                          [node("node_uname_info", "1x80", key, nodename=raw, sysname="Linux"),
                           node_info(RUN_A, key),
                           node("node_infiniband_state_id", "4x10 1x70", key, device="mlx5_0",
                                port="1")], "9m",
                          [Expect({**RUN_A, "hostname": key, "device": "mlx5_0", "port": "1"},
                                  f"InfiniBand mlx5_0 port 1 on {key} is in state 1 (4 = active) "
                                  "after being active within the last hour.")]))
    fqdn = "n1.cluster.example.com"
    util = [reported("hostname", fqdn),
            *(dcgm("hostname", "DCGM_FI_DEV_GPU_UTIL", "95x80", fqdn, str(i)) for i in range(3))]
    run = [node_info(RUN_A), *(gpu_info(RUN_A, str(i)) for i in range(4))]
    cases.append(Case("TrainingStraggler: FQDN dcgm host label", "TrainingStraggler",
                      [*run, *util, dcgm("hostname", "DCGM_FI_DEV_GPU_UTIL", "60x80", fqdn, "3")],
                      "8m", [Expect({**RUN_A, "hostname": "n1", "gpu": "3"},
                                    "GPU 3 on n1 averaged 60% utilisation over 2 minutes, more "
                                    "than 10 points below the run's busiest GPU.")]))
    cases.append(Case("GpuDoubleBitEccErrors: an extrapolated increase prints as a whole number",
                      "GpuDoubleBitEccErrors",
                      [*bg, dcgm("hostname", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0+0.05x40 2x40")],
                      "22m", [Expect(g(), f"3 double-bit ECC error(s) on {W} in the last 10 "
                                          "minutes.")]))
    cases += mig_cases() + kubernetes_cases()
    return cases


# Every evaluation from 9 to 13 minutes after a restart at 20m: the old series ends with a
# staleness marker (its target is gone) and the new one's first scrape is missed, so the
# 10-minute-old sample an XID is compared with is missing at exactly one evaluation (30m).
AFTER_RESTART = ("29m", "29m30s", "30m", "30m30s", "31m", "31m30s", "33m")


def restart_cases() -> list[Case]:
    """dcgm-exporter restarted or upgraded under a GPU whose last-XID gauge holds an old code:
    new target labels (instance, the exporter's pod), one scrape missed, the old series marked
    stale as Prometheus does when a target goes away. The code is no new event at any
    evaluation, whichever group ran first, on the run that now holds the GPU."""
    ecc = "GpuContainedEccError"
    bg = healthy_gpus("hostname")
    runs_after = [node_info(RUN_B), gpu_info(RUN_B, "0")]
    exporter = {"kubernetes": lambda i: {"instance": f"10.1.0.{i + 1}:9400",
                                         "pod": f"dcgm-exporter-{i}", "namespace": "gpu-operator"},
                "hpc": lambda i: {"instance": f"n1:{9400 + i}"}}
    cases = []
    for kind, target in exporter.items():
        old = _xid("hostname", "94", "94x39 stale", **target(0))
        new = _xid("hostname", "94", "_x41 94x40", **target(1))
        cases.append(Case(f"{ecc}: dcgm-exporter restart ({kind} target), one scrape missed: "
                          "an old XID is no new event", ecc, [*bg, *runs_after, old, new],
                          AFTER_RESTART[0], also_at=AFTER_RESTART[1:]))
        fresh = _xid("hostname", "79", "_x41 79x40", **target(1))
        cases.append(Case(f"GpuFallenOffBus: a new code after a dcgm-exporter restart ({kind} "
                          "target) alerts", "GpuFallenOffBus", [*bg, *runs_after, old, fresh],
                          "22m", [Expect({**RUN_B, **g()}, f"{W} stopped responding: XID 79, "
                                         "or its metrics vanished while the host still reports "
                                         "other GPUs.")]))
    upgrade = [*bg, *runs_after, _xid("Hostname", "94", "94x39 stale"),
               _xid("hostname", "94", "_x41 94x40", instance="10.1.0.2:9400")]
    cases.append(Case(f"{ecc}: upgrade across the Hostname -> hostname rename, one scrape "
                      "missed: an old XID is no new event", ecc, upgrade, AFTER_RESTART[0],
                      also_at=AFTER_RESTART[1:]))
    down_long = [*bg, *runs_after, _xid("hostname", "94", "94x39 stale"),
                 _xid("hostname", "94", "_x79 94x40", instance="10.1.0.2:9400")]
    cases.append(Case(f"{ecc}: dcgm-exporter down for 20 minutes, back with the old XID: no "
                      "new event", ecc, down_long, "50m", also_at=("50m30s", "51m", "55m")))
    return cases


def pod_info(run: dict[str, str], pod: str, host: str = "n1") -> Series:
    """The exporter's per-pod join metric (Kubernetes source)."""
    return Series("wandb_run_pod_info", {**run, "hostname": host, "namespace": "ml", "pod": pod,
                                         "source": "kubernetes"}, "1x80")


def kubernetes_cases() -> list[Case]:
    """Two runs' pods on one node, each holding two GPUs: a GPU fault goes to the pod's run."""
    ecc = "GpuContainedEccError"
    desc = "Contained uncorrectable ECC error (XID 94) on GPU 2 on n1 (1 event(s))."
    runs = [node_info(RUN_A, source="kubernetes"), node_info(RUN_B, source="kubernetes"),
            pod_info(RUN_A, "train-a-0"), pod_info(RUN_B, "train-b-0")]
    cases = []
    for spelling in ("pod", "exported_pod"):
        ns = spelling.replace("pod", "namespace")

        def held(gpu: int, values: str, metric: str = "DCGM_FI_DEV_GPU_TEMP",
                 spelling: str = spelling, ns: str = ns, **extra: str) -> Series:
            pod = "train-a-0" if gpu < 2 else "train-b-0"
            return dcgm("hostname", metric, values, gpu=str(gpu),
                        **{spelling: pod, ns: "ml", "container": "trainer", **extra})

        temps = [held(gpu, "40x80") for gpu in range(4)]
        xid = held(2, "_x20 94x60", "DCGM_FI_DEV_XID_ERRORS", err_code="94")
        cases.append(Case(f"{ecc}: Kubernetes, the run whose pod holds the GPU ({spelling})", ecc,
                          [*runs, *temps, xid], "12m",
                          [Expect({**RUN_B, **g(gpu="2", xid="94")}, desc)]))
    unlabelled = [dcgm("hostname", "DCGM_FI_DEV_GPU_TEMP", "40x80", gpu=str(i))
                  for i in range(4)]
    cases.append(Case(f"{ecc}: Kubernetes without pod labels falls back to the node", ecc,
                      [*runs, *unlabelled, _xid("hostname", "94", "_x20 94x60", gpu="2")], "12m",
                      [Expect({**run, **g(gpu="2", xid="94")}, desc) for run in (RUN_A, RUN_B)]))
    claimed_twice = [*runs, pod_info(RUN_A, "train-b-0"),
                     *(dcgm("hostname", "DCGM_FI_DEV_GPU_TEMP", "40x80", gpu=str(i),
                            pod="train-a-0" if i < 2 else "train-b-0", namespace="ml")
                       for i in range(4)),
                     dcgm("hostname", "DCGM_FI_DEV_XID_ERRORS", "_x20 94x60", gpu="0",
                          pod="train-a-0", namespace="ml", err_code="94")]
    cases.append(Case(f"{ecc}: a pod claimed by two runs does not break the pod join", ecc,
                      claimed_twice, "12m",
                      [Expect({**RUN_A, **g(gpu="0", xid="94")}, desc.replace("GPU 2", "GPU 0"))]))
    # Slurm jobs in pods: run A registers its GPUs (0, 1) as well as its pod, run B its pod only.
    # A's GPU rows place A (once, not again through its pod); B is placed by its pod.
    labelled = [dcgm("hostname", "DCGM_FI_DEV_GPU_TEMP", "40x80", gpu=str(i),
                     pod="train-a-0" if i < 2 else "train-b-0", namespace="ml")
                for i in range(4)]
    for gpu, run in (("0", RUN_A), ("2", RUN_B)):
        xid = dcgm("hostname", "DCGM_FI_DEV_XID_ERRORS", "_x20 94x60", gpu=gpu, err_code="94",
                   pod="train-a-0" if run is RUN_A else "train-b-0", namespace="ml")
        cases.append(Case(f"{ecc}: GPU rows and pods on one node, GPU {gpu}", ecc,
                          [*runs, gpu_info(RUN_A, "0"), gpu_info(RUN_A, "1"), *labelled, xid],
                          "12m", [Expect({**run, **g(gpu=gpu, xid="94")},
                                         desc.replace("GPU 2", f"GPU {gpu}"))]))
    # Run A ends at 20m (its rows and its pod's GPU labels go); the pod rows recorded at 16m are
    # read until 25m, but a fault on its former GPU 0 at 21m goes to no run: A is gone.
    gone = node_info(RUN_A, source="kubernetes")
    ended = [Series(gone.name, gone.labels, "1x40 stale"),
             node_info(RUN_B, source="kubernetes"),
             Series("wandb_run_pod_info", {**pod_info(RUN_A, "train-a-0").labels},
                    "1x40 stale"), pod_info(RUN_B, "train-b-0"),
             *(dcgm("hostname", "DCGM_FI_DEV_GPU_TEMP", "40x40 stale", gpu=str(i),
                    pod="train-a-0", namespace="ml") for i in range(2)),
             *(dcgm("hostname", "DCGM_FI_DEV_GPU_TEMP", "_x40 40x40", gpu=str(i))
               for i in range(2)),
             *(dcgm("hostname", "DCGM_FI_DEV_GPU_TEMP", "40x80", gpu=str(i), pod="train-b-0",
                    namespace="ml") for i in (2, 3)),
             dcgm("hostname", "DCGM_FI_DEV_XID_ERRORS", "_x42 94x38", gpu="0", err_code="94")]
    cases.append(Case(f"{ecc}: Kubernetes, a fault on the GPU of a run that ended goes to no "
                      "run, though its pod rows are still read", ecc, ended, "23m",
                      [Expect(g(gpu="0", xid="94"), desc.replace("GPU 2", "GPU 0"))]))
    return cases


# Labels Prometheus puts on a series scraped through each path the project ships or documents.
# A ServiceMonitor adds the target's namespace, pod, service, endpoint and container; without
# honorLabels a scraped label of the same name is renamed exported_<name>, with it the scraped
# one wins and the target's is added only where the series has none.
EXPORTER_TARGET = {"instance": "10.2.0.5:9842", "job": "wandb-infra-exporter",
                   "namespace": "monitoring", "pod": "wandb-infra-exporter-7d9f", "service":
                   "wandb-infra-exporter", "endpoint": "metrics", "container": "exporter"}
DCGM_TARGET = {"instance": "10.1.0.7:9400", "job": "nvidia-dcgm-exporter",
               "namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x2k4l",
               "service": "nvidia-dcgm-exporter", "endpoint": "gpu-metrics",
               "container": "nvidia-dcgm-exporter"}


def _scraped(scraped: dict[str, str], target: dict[str, str], honor: bool | None
             ) -> dict[str, str]:
    """A series' labels after the scrape: ``honor`` None is file_sd/static (instance and job
    only), True/False a ServiceMonitor with or without honorLabels."""
    if honor is None:
        return {**scraped, "instance": target["instance"], "job": target["job"]}
    if honor:
        return {**target, **scraped}
    renamed = {(f"exported_{k}" if k in target else k): v for k, v in scraped.items()}
    return {**renamed, **target}


def scrape_path_cases() -> list[Case]:
    """GPU attribution through every scrape path of both exporters: the exporter's join metrics
    and dcgm-exporter's GPU series scraped by a ServiceMonitor with and without honorLabels, or
    by file_sd/static. Two runs' pods on n1 hold GPUs 0-1 (A) and 2 (B); GPU 3 is free."""
    ecc = "GpuContainedEccError"
    desc = "Contained uncorrectable ECC error (XID 94) on GPU {g} on n1 (1 event(s))."
    paths = {"honorLabels true": True, "honorLabels false": False}
    cases = []
    for e_name, e_honor in paths.items():
        for d_name, d_honor in paths.items():
            def exporter(s: Series, honor: bool | None = e_honor) -> Series:
                return Series(s.name, _scraped(s.labels, EXPORTER_TARGET, honor), s.values)

            def held(metric: str, values: str, gpu: int, honor: bool | None = d_honor,
                     **extra: str) -> Series:
                pod = {0: "train-a-0", 1: "train-a-0", 2: "train-b-0"}.get(gpu)
                workload = {"pod": pod, "namespace": "ml", "container": "trainer"} if pod else {}
                s = dcgm("hostname", metric, values, gpu=str(gpu), **workload, **extra)
                own = {k: v for k, v in s.labels.items() if k not in ("instance", "job")}
                return Series(metric, _scraped(own, DCGM_TARGET, honor), values)

            runs = [exporter(s) for s in (node_info(RUN_A, source="kubernetes"),
                                          node_info(RUN_B, source="kubernetes"),
                                          pod_info(RUN_A, "train-a-0"),
                                          pod_info(RUN_B, "train-b-0"))]
            temps = [held("DCGM_FI_DEV_GPU_TEMP", "40x80", gpu) for gpu in range(4)]
            where = f"exporter ServiceMonitor {e_name}, dcgm-exporter ServiceMonitor {d_name}"
            for gpu, run in ((2, RUN_B), (0, RUN_A), (3, None)):
                xid = held("DCGM_FI_DEV_XID_ERRORS", "_x20 94x60", gpu, err_code="94",
                           err_msg="msg")
                whom = f"the run whose pod holds GPU {gpu}" if run else f"nobody for free GPU {gpu}"
                cases.append(Case(f"{ecc}: {where}: {whom}", ecc, [*runs, *temps, xid], "12m",
                                  [Expect({**(run or {}), **g(gpu=str(gpu), xid="94")},
                                          desc.format(g=gpu))]))
    # file_sd/static (Slurm, bare metal): no pod labels; the exporter's per-GPU rows attribute.
    static = [Series(s.name, _scraped(s.labels, EXPORTER_TARGET, None), s.values)
              for s in (node_info(RUN_A), node_info(RUN_B), gpu_info(RUN_A, "0"),
                        gpu_info(RUN_A, "1"), gpu_info(RUN_B, "2"))]
    dcgm_static = [dcgm("hostname", "DCGM_FI_DEV_GPU_TEMP", "40x80", gpu=str(i))
                   for i in range(4)]
    for gpu, run in ((2, RUN_B), (3, None)):
        xid = _xid("hostname", "94", "_x20 94x60", gpu=str(gpu))
        whom = f"the run holding GPU {gpu}" if run else f"nobody for free GPU {gpu}"
        cases.append(Case(f"{ecc}: exporter and dcgm-exporter by file_sd/static: {whom}", ecc,
                          [*static, *dcgm_static, xid], "12m",
                          [Expect({**(run or {}), **g(gpu=str(gpu), xid="94")},
                                  desc.format(g=gpu))]))
    return cases


def mig_cases() -> list[Case]:
    """Two runs on two MIG instances of the same GPUs: one hangs, the other computes."""
    mig = EXPOSITION["mig"]

    def inst(metric: str, values: str, gpu: str, i: int) -> Series:
        return dcgm("hostname", metric, values, gpu=gpu,
                    **{mig[0]: "3g.40gb", mig[1]: str(i)})

    runs = [node_info(RUN_A), node_info(RUN_B), *(gpu_info(r, str(gpu)) for r in (RUN_A, RUN_B)
                                                   for gpu in range(2))]
    memory = [inst("DCGM_FI_DEV_FB_USED", f"{GIB_MIB // 2}x80", str(gpu), i)
              for gpu in range(2) for i in (1, 2)]
    hung = [inst("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.6x30 0.01x50", str(gpu), 1)
            for gpu in range(2)]
    busy = [inst("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.6x80", str(gpu), 2) for gpu in range(2)]
    both_hung = [inst("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.6x30 0.01x50", str(gpu), 2)
                 for gpu in range(2)]
    stalled = ("Tensor activity of the run's GPUs on n1 fell to 1% while their memory stays "
               "allocated, after being active in the last hour.")
    return [
        Case("TrainingStalled: MIG, one instance hangs while the other computes",
             "TrainingStalled", [*runs, *memory, *hung, *busy], "30m"),
        Case("TrainingStalled: MIG, every instance of the GPUs hangs", "TrainingStalled",
             [*runs, *memory, *hung, *both_hung], "30m",
             [Expect({**run, "hostname": "n1"}, stalled) for run in (RUN_A, RUN_B)]),
    ]


def pipeline_cases() -> list[Case]:
    """This project's own exporter and bridge, from the metrics they serve."""
    exp = {"instance": "exporter:9842", "job": "wandb-infra-exporter"}
    brg = {"instance": "bridge:9461", "job": "wandb-infra-bridge"}

    def e(name: str, values: str, **extra: str) -> Series:
        return Series(name, {**exp, **extra}, values)

    def b(name: str, values: str) -> Series:
        return Series(name, brg, values)

    slurm = {"source": "slurm"}
    exporter_up = [e("wandb_infra_exporter_hosts", "64x80"), Series("up", exp, "1x80")]
    bridge_up = [b("wandb_infra_bridge_queue_runs", "0x80"), Series("up", brg, "1x80")]
    busy = [dcgm("hostname", "DCGM_FI_DEV_FB_USED", f"{GIB_MIB}x80", gpu=str(i))
            for i in range(2)]
    runs = [node_info(RUN_A)]
    # last success: a Unix time that follows the test clock (0 s at start), or stops at 60 s
    return [
        *_pair("Slurm source failing", "WandbInfraExporterSourceDown",
               [*exporter_up, e("wandb_infra_exporter_source_up", "1x10 0x70", **slurm)],
               [*exporter_up, e("wandb_infra_exporter_source_up", "1x80", **slurm)], "20m",
               [Expect({**exp, **slurm}, "Source slurm of the exporter at exporter:9842 failed "
                       "its last polls (source_up = 0).")]),
        *_pair("Slurm source stale", "WandbInfraExporterSourceStale",
               [*exporter_up, e("wandb_infra_exporter_source_last_success_timestamp_seconds",
                                "30+30x2 60x77", **slurm)],
               [*exporter_up, e("wandb_infra_exporter_source_last_success_timestamp_seconds",
                                "30+30x80", **slurm),
                e("wandb_infra_exporter_source_last_success_timestamp_seconds", "0x80",
                  source="registrations")], "30m",
               [Expect({**exp, **slurm}, "Source slurm of the exporter at exporter:9842 last "
                       "succeeded 29m 0s ago.")]),
        *_pair("exporter target down", "WandbInfraExporterDown",
               [e("wandb_infra_exporter_hosts", "64x10"), Series("up", exp, "1x10 0x70")],
               exporter_up, "20m",
               [Expect(exp, "The exporter target exporter:9842 (job wandb-infra-exporter) is "
                       "down (up = 0).")]),
        *_pair("no run mapped while GPUs hold memory", "WandbInfraJoinMetricsMissing",
               [*busy], [*busy, *runs], "30m",
               [Expect({}, "GPU 0 holds memory on 1 host(s), and no wandb_run_node_info series "
                              "exists.")]),
        Case("WandbInfraJoinMetricsMissing: silent on an idle cluster without runs",
             "WandbInfraJoinMetricsMissing",
             [dcgm("hostname", "DCGM_FI_DEV_FB_USED", "0x80", gpu="0")], "30m"),
        *_pair("run host without dcgm-exporter", "WandbInfraRunHostWithoutGpuTelemetry",
               [uname(), node("up", "1x80"), node_info(RUN_A)],
               [uname(), node("up", "1x80"), node_info(RUN_A),
                dcgm("hostname", "DCGM_FI_DEV_GPU_TEMP", "40x80"),
                Series("up", {"instance": "n1:9400", "job": "dcgm"}, "1x80")], "30m",
               [Expect({}, "1 host(s) running W&B runs have no dcgm-exporter target reporting "
                           "their host name in the last hour.")]),
        *_pair("run host without node state", "WandbInfraRunHostWithoutNodeState",
               [node_info(RUN_A)],
               [node_info(RUN_A),
                Series("wandb_infra_node_state", {"instance": "exp:9500", "job": "exporter",
                                                  "hostname": "n1", "scheduler": "slurm",
                                                  "state": "ALLOCATED", "reason": ""}, "1x80")],
               "30m",
               [Expect({}, "1 host(s) running W&B runs have no wandb_infra_node_state series "
                           "(nor kube-state-metrics' node series).")]),
        *_pair("bridge target down", "WandbInfraBridgeDown",
               [b("wandb_infra_bridge_queue_runs", "0x10"), Series("up", brg, "1x10 0x70")],
               bridge_up, "20m",
               [Expect(brg, "The bridge target bridge:9461 (job wandb-infra-bridge) is "
                       "down (up = 0).")]),
        *_pair("runs parked", "WandbInfraRunsParked",
               [*bridge_up, b("wandb_infra_bridge_parked_runs", "0x10 2x70")],
               [*bridge_up, b("wandb_infra_bridge_parked_runs", "0x80")], "20m",
               [Expect(brg, "2 run(s) parked by the bridge at bridge:9461.")]),
        *_pair("delivery backlog", "WandbInfraDeliveryBacklog",
               [*bridge_up, b("wandb_infra_bridge_oldest_undelivered_seconds", "0+30x80")],
               [*bridge_up, b("wandb_infra_bridge_oldest_undelivered_seconds", "0x80")], "20m",
               [Expect(brg, "The oldest undelivered change at the bridge bridge:9461 is 20m 0s "
                       "old.")]),
        *_pair("store not writable", "WandbInfraBridgeStoreNotWritable",
               [*bridge_up, b("wandb_infra_bridge_store_writable", "1x10 0x70")],
               [*bridge_up, b("wandb_infra_bridge_store_writable", "1x80")], "20m",
               [Expect(brg, "The bridge at bridge:9461 cannot write its state store "
                       "(store_writable = 0).")]),
    ]


@dataclass
class Timeline:
    """One promtool test over shared series with several alerts checked at several times: for
    scenarios that span hours, where each test case costs every rule at every step."""

    name: str
    series: list[Series]
    interval: str
    # (alert, times, expected alerts at each of them)
    checks: list[tuple[str, tuple[str, ...], list[Expect]]]
    # promtool ``promql_expr_test`` entries, for what a check at a few instants cannot see
    # (an alert that stops and fires again between two checks)
    expr_checks: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """The promtool test entry."""
        tests = []
        for alert, times, expect in self.checks:
            case = Case(self.name, alert, self.series, times[0], expect, times[1:],
                        self.interval).as_dict(cfg)
            tests += case["alert_rule_test"]
        out: dict[str, Any] = {"name": self.name, "interval": self.interval,
                               "input_series": [s.as_dict() for s in self.series],
                               "alert_rule_test": tests}
        if self.expr_checks:
            out["promql_expr_test"] = self.expr_checks
        return out


def down_cases() -> list[Timeline]:
    """Down means down: NodeDown, WandbInfraExporterDown and WandbInfraBridgeDown fire for as
    long as the target is down and its host still matters (checked at 2 h and 24 h, samples every
    minute), and end when it is back or removed from discovery on purpose (no run on its host).
    One timeline, one host or target per scenario."""
    day = 1450  # minutes of samples: a day and a little
    down = f"1x10 0x{day}"
    back = f"1x10 0x110 1x{day - 120}"
    decommissioned = "1x10 0x110 stale"

    def up(instance: str, job: str, values: str) -> Series:
        return Series("up", {"instance": instance, "job": job}, values)

    def host(name: str, up_values: str, uname_values: str = "1x10", run: bool = False
             ) -> list[Series]:
        out = [node("node_uname_info", uname_values, name, nodename=name, sysname="Linux"),
               up(f"{name}:9100", "node", up_values)]
        if run:
            info = node_info({**RUN_A, "wandb_run_id": f"run-{name}"}, name)
            out.append(Series(info.name, info.labels, f"1x{day}"))
        return out

    series = [
        *host("down-run", down, run=True),  # down for a day under a run
        *host("down-idle", down),  # down for a day, no run
        *host("gone-run", "1x10 stale", run=True),  # removed from discovery under a run
        *host("back", back, "1x10 _x110 1x1330", run=True),  # back after 2 hours
        *host("decom", decommissioned),  # down, then removed from discovery, no run
        dcgm("hostname", "DCGM_FI_DEV_GPU_TEMP", "40x10", "gpu-down"),
        up("gpu-down:9400", "dcgm", down),  # dcgm-exporter down for a day
    ]

    def node_down(name: str, run: bool = False, exporter: str = "node_exporter") -> Expect:
        labels = {"hostname": name, "exporter": exporter}
        if run:
            labels = {**RUN_A, "wandb_run_id": f"run-{name}", **labels}
        return Expect(labels, NODE_LOST.replace("n1", name))

    always = [node_down("down-run", True), node_down("down-idle"), node_down("gone-run", True)]
    # dcgm-exporter down for a day on a host whose node_exporter is not deployed: a gap
    gap = [Expect({"hostname": "gpu-down", "exporter": "dcgm_exporter"},
                  _gap("dcgm_exporter").replace("n1", "gpu-down"))]
    # After 2 h, every few hours and just before the day ends, so a gap that fires again by
    # 24 h fails; the sample count below catches a gap between two of these checks too.
    later = ("2h10m", "6h", "12h", "23h59m", "24h")
    checks = [("NodeDown", ("1h55m", "2h"),
               [*always, node_down("back", True), node_down("decom")]),
              ("NodeDown", later, always),
              ("HostTelemetryGap", ("2h", *later), gap)]
    firing = [{"alertname": alert, "hostname": e.labels["hostname"],
               "exporter": e.labels["exporter"]}
              for alert, expected in (("NodeDown", always), ("HostTelemetryGap", gap))
              for e in expected]
    for alert, metric, what, port in (("WandbInfraExporterDown", "wandb_infra_exporter_hosts",
                                       "exporter", "9842"),
                                      ("WandbInfraBridgeDown", "wandb_infra_bridge_queue_runs",
                                       "bridge", "9461")):
        job = f"wandb-infra-{what}"
        targets = {kind: {"instance": f"{what}-{kind}:{port}", "job": job}
                   for kind in ("down", "back", "decom")}
        series += [Series(metric, targets["down"], "3x10"), Series("up", targets["down"], down),
                   Series(metric, targets["back"], "3x10 _x110 3x1330"),
                   Series("up", targets["back"], back),
                   Series(metric, targets["decom"], "3x10"),
                   Series("up", targets["decom"], decommissioned)]

        def gone(kind: str, what: str = what, job: str = job, port: str = port) -> Expect:
            instance = f"{what}-{kind}:{port}"
            return Expect({"instance": instance, "job": job},
                          f"The {what} target {instance} (job {job}) is down (up = 0).")

        checks += [(alert, ("1h55m", "2h"), [gone("down"), gone("back"), gone("decom")]),
                   (alert, later, [gone("down")])]
        firing.append({"alertname": alert, "instance": targets["down"]["instance"]})
    # Firing at every evaluation (every 5 minutes) from 2 h to 24 h: ALERTS{alertstate="firing"}
    # has one sample per evaluation while the alert fires, none while it does not. The window
    # starts half a step after 2 h so its left end holds no sample; targets back or removed
    # (a few samples after 2 h at most) fall under the floor and are left out.
    step = DAY_EVALUATION_MINUTES
    steps = 22 * 60 // step
    names = "|".join(sorted({f["alertname"] for f in firing}))
    continuous = {"expr": f'min by (alertname, hostname, exporter, instance) (count_over_time('
                          f'ALERTS{{alertstate="firing",alertname=~"{names}"}}'
                          f'[{(22 * 60 - step / 2) * 60:g}s]) > 30)',
                  "eval_time": "24h",
                  "exp_samples": [{"labels": f"{{{_labels(f)}}}", "value": steps} for f in firing]}
    return [Timeline("down means down: node, exporter and bridge targets over a day", series,
                     "1m", checks, [continuous])]


# promtool evaluates every group at every step, so a file's steps are its cost: the cases that
# span a day evaluate every 5 minutes (a tenth of the steps at 30 s), the host alerts every
# minute (their records run every 3 or 4 minutes in Prometheus; their inputs still change every
# 30 s), the others every 30 s, the recommended evaluation_interval.
DAY_EVALUATION_MINUTES = 5
EVALUATION_INTERVAL = {"down_long.test.yml": f"{DAY_EVALUATION_MINUTES}m",
                       "host_alerts.test.yml": "1m"}


def files(cfg: dict[str, Any]) -> dict[str, str]:
    """Test file name -> YAML text."""
    rules = f"../../alert_rules/{generate.RULES_FILE}"
    groups: dict[str, Sequence[Case | Timeline]] = {"node_alerts.test.yml": [
                                         *node_cases(), *exporter_gap_cases("Hostname")],
                                     "link_attribution.test.yml": link_attribution_cases(),
                                     "dcgm_4_9.test.yml": dcgm49_cases(),
                                     "real_telemetry.test.yml": real_telemetry_cases(),
                                     "pipeline.test.yml": pipeline_cases(),
                                     # tests/rules/host_cases.py
                                     "host_alerts.test.yml": host_cases.cases()}
    for sp in SPELLINGS:
        groups[f"gpu_alerts_{sp}.test.yml"] = gpu_cases(sp) + dcgm_node_cases(sp)
        groups[f"workload_{sp}.test.yml"] = workload_cases(sp)
        groups[f"attribution_{sp}.test.yml"] = attribution_cases(sp)
    groups["scrape_paths.test.yml"] = scrape_path_cases()
    groups["down_long.test.yml"] = down_cases()
    out = {}
    for name, cases in groups.items():
        doc = {"rule_files": [rules],
               "evaluation_interval": EVALUATION_INTERVAL.get(name, "30s"),
               "tests": [c.as_dict(cfg) for c in cases]}
        out[name] = generate.HEADER.replace("alert_rules/generate.py", "tests/rules/build.py") \
            + generate.dump(doc)
    return out


def default_cfg() -> dict[str, Any]:
    """The generator's defaults (the committed rule files are built with them)."""
    return generate.options(generate.parse_args([]))


def main(argv: list[str] | None = None) -> int:
    """Rewrite every test file, or with --check exit 1 if a committed one is stale."""
    parser = argparse.ArgumentParser(description="Build the promtool unit tests in tests/rules/.")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a committed file differs")
    args = parser.parse_args(argv)
    return write_or_check({HERE / name: text for name, text in files(default_cfg()).items()},
                          args.check, lambda path: f"tests/rules/{path.name}")


if __name__ == "__main__":
    sys.exit(main())
