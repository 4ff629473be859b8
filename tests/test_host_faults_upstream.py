"""The issue-28 host rules under promtool on what the exporters themselves publish: node_exporter's
collector fixture (vmstat, pressure, EDAC, mountstats, boot time), smartctl_exporter's EXAMPLE.md
(a real exposition with a failing NVMe disk) and ipmi_exporter's docs/metrics.md examples
(provenance in tests/data/README.md). Each is scraped from one FQDN target for 40 minutes and the
faults are attributed to the run on that host."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tests.rules import build
from tests.rules.build import RUN_A, Case, Expect, Series
from tests.test_node_exporter_upstream import FQDN, HOST, PROMTOOL_TIMEOUT, _run, _uname

# one promtool run per test, bounded by its own timeout (minutes when the machine is loaded)
pytestmark = pytest.mark.timeout(PROMTOOL_TIMEOUT + 60)

DATA = Path(__file__).resolve().parent / "data"
NODE = DATA / "node_exporter" / "e2e-output.txt"
SMARTCTL = DATA / "smartctl" / "EXAMPLE.md"
IPMI = DATA / "ipmi" / "metrics.md"
NODE_FAMILIES = ("node_vmstat_oom_kill", "node_pressure_memory_", "node_edac_",
                 "node_mountstats_nfs_mountpoint_info",
                 "node_mountstats_nfs_operations_major_timeouts_total", "node_boot_time_seconds")
WHERE = {**RUN_A, "hostname": HOST}


def _series(text: str, port: int, job: str, keep: tuple[str, ...] = ("",),  # noqa: PLR0917
            faults: dict[tuple[str, str], str] | None = None,
            drop: dict[str, str] | None = None) -> list[Series]:
    """Every finite sample whose name starts with one of ``keep``, as scraped from
    ``FQDN:port``; ``faults`` maps (name, sorted label values) to promtool values."""
    out = []
    for name, labels, value in samples(text):
        if not name.startswith(keep) or math.isnan(value):
            continue
        if drop and all(labels.get(k) == v for k, v in drop.items()):
            continue
        key = (name, ",".join(v for _, v in sorted(labels.items())))
        values = (faults or {}).get(key, f"{value:g}x80")
        out.append(Series(name, {"instance": f"{FQDN}:{port}", "job": job, **labels}, values))
    return out


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a text exposition with their names as Prometheus stores them (the Python
    client's parser would add ``_total`` to counters that lack it, which Prometheus does not)."""
    out = []
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if line.startswith("#") or not m:
            continue
        out.append((m.group(1), dict(LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


def node_series(faults: dict[tuple[str, str], str] | None = None) -> list[Series]:
    return _series(NODE.read_text(), 9100, "node", NODE_FAMILIES, faults)


def smartctl_text() -> str:
    """The exposition inside EXAMPLE.md's code block."""
    return SMARTCTL.read_text().split("```\n", 2)[1]


def ipmi_text() -> str:
    """The example lines of docs/metrics.md (indented four spaces), one per series."""
    lines = re.findall(r"^    (ipmi_[a-z_]+(?:\{[^}]*\})? \S+)$", IPMI.read_text(), flags=re.M)
    return "\n".join(lines) + "\n"


def base() -> list[Series]:
    return [_uname(), build.node_info(RUN_A, HOST)]


def test_fixtures_hold_the_families_the_rules_read():
    names = {s.name for s in node_series()}
    for needed in ("node_vmstat_oom_kill", "node_pressure_memory_stalled_seconds_total",
                   "node_edac_uncorrectable_errors_total", "node_edac_correctable_errors_total",
                   "node_mountstats_nfs_mountpoint_info",
                   "node_mountstats_nfs_operations_major_timeouts_total",
                   "node_boot_time_seconds"):
        assert needed in names
    smart = {s.name for s in _series(smartctl_text(), 9633, "smartctl")}
    assert {"smartctl_device_smart_status", "smartctl_device_critical_warning",
            "smartctl_device_media_errors"} <= smart
    ipmi = {s.name for s in _series(ipmi_text(), 9290, "ipmi")}
    assert {"ipmi_sensor_state", "ipmi_fan_speed_state", "ipmi_power_state",
            "ipmi_temperature_state", "ipmi_voltage_state", "ipmi_current_state"} <= ipmi


@pytest.mark.integration
def test_node_exporter_fixture_as_captured(tmp_path):
    """As captured the fixture's EDAC counts 5 uncorrectable errors on controller 0 (a real
    fault: it fires); nothing else does."""
    series = [*base(), *node_series()]
    cases = [Case("HostMemoryUncorrectableErrors on the fixture's EDAC counts",
                  "HostMemoryUncorrectableErrors", series, "20m",
                  [Expect({**WHERE, "controller": "0"},
                          f"5 uncorrectable memory error(s) on {HOST} since boot (EDAC memory "
                          "controller 0).")])]
    cases += [Case(f"{alert}: node_exporter fixture as captured", alert, series, "30m")
              for alert in ("HostOomKill", "HostMemoryPressure", "HostMemoryCorrectableErrors",
                            "FilesystemNotResponding", "SharedFilesystemNotResponding",
                            "NodeRebooted")]
    proc = _run(tmp_path, cases)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.integration
def test_node_exporter_fixture_faults_reach_the_run(tmp_path):
    udp_write = ("node_mountstats_nfs_operations_major_timeouts_total",
                 "192.168.1.1:/srv/test,192.168.1.1,WRITE,udp")
    faults = {("node_vmstat_oom_kill", ""): "0x20 2x60", udp_write: "0x20 0+1x60",
              ("node_pressure_memory_stalled_seconds_total", ""): "0+6x80",
              ("node_boot_time_seconds", ""): "1.418183276e+09x30 _x9 1.7e+09x40"}
    series = [*base(), *node_series(faults)]
    cases = [
        Case("HostOomKill on the fixture's vmstat", "HostOomKill", series, "15m",
             [Expect(WHERE, f"The OOM killer ran 2 time(s) on {HOST} in the last 10 minutes "
                            "(node_vmstat_oom_kill).")]),
        Case("HostMemoryPressure on the fixture's PSI", "HostMemoryPressure", series, "15m",
             [Expect(WHERE, f"Every task on {HOST} waited for memory 20% of the last 5 minutes "
                            "(PSI memory full).")]),
        Case("SharedFilesystemNotResponding on the fixture's NFS mount (udp: test-dupe)",
             "SharedFilesystemNotResponding", series, "26m",
             [Expect({**WHERE, "mountpoint": "/mnt/nfs/test-dupe", "fstype": "nfs"},
                     f"/mnt/nfs/test-dupe on {HOST} is not answering (statfs failing, or 20 NFS "
                     "major timeout(s) in the last 10 minutes).")]),
        Case("NodeRebooted on the fixture's boot time", "NodeRebooted", series, "25m",
             [Expect(WHERE, f"{HOST} booted again at 2023-11-14 22:13:20 +0000 UTC "
                            "(node_boot_time_seconds moved later), with no maintenance state "
                            "seen in the last 30 minutes.")]),
    ]
    proc = _run(tmp_path, cases)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.integration
def test_smartctl_example_failing_nvme_reaches_the_run(tmp_path):
    """EXAMPLE.md's /dev/nvme0 reports SMART failed with critical warning 4: the alert names the
    stronger reading; the same exposition without it is healthy."""
    failing = [*base(), *_series(smartctl_text(), 9633, "smartctl")]
    healthy = [*base(), *_series(smartctl_text(), 9633, "smartctl",
                                 drop={"device": "/dev/nvme0"})]
    cases = [Case("LocalDiskFailing on smartctl_exporter's example", "LocalDiskFailing",
                  failing, "10m",
                  [Expect({**WHERE, "device": "/dev/nvme0", "check": "NVMe critical warning"},
                          f"Disk /dev/nvme0 on {HOST}: NVMe critical warning (value 4; "
                          "smartctl_exporter).")]),
             Case("LocalDiskFailing: the example's SATA disks are healthy", "LocalDiskFailing",
                  healthy, "10m")]
    proc = _run(tmp_path, cases)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.integration
def test_ipmi_documented_sensors(tmp_path):
    text = ipmi_text()
    as_documented = [*base(), *_series(text, 9290, "ipmi")]
    faults = {("ipmi_fan_speed_state", "12,Fan1A"): "0x20 2x60",
              ("ipmi_power_state", "90,Pwr Consumption"): "0x20 2x60"}
    faulty = [*base(), *_series(text, 9290, "ipmi", faults=faults)]
    cases = [
        Case("HostPowerSupplyFault: ipmi_exporter's examples as documented",
             "HostPowerSupplyFault", as_documented, "20m"),
        Case("HostChassisSensorCritical: ipmi_exporter's examples as documented",
             "HostChassisSensorCritical", as_documented, "20m"),
        Case("HostPowerSupplyFault on the documented power sensor", "HostPowerSupplyFault",
             faulty, "20m", [Expect({**WHERE, "name": "Pwr Consumption"},
                                    f"IPMI sensor Pwr Consumption on {HOST} is critical "
                                    "(state 2).")]),
        Case("HostChassisSensorCritical on the documented fan", "HostChassisSensorCritical",
             faulty, "20m", [Expect({**WHERE, "name": "Fan1A"},
                                    f"IPMI sensor Fan1A on {HOST} is critical (state 2).")]),
    ]
    proc = _run(tmp_path, cases)
    assert proc.returncode == 0, proc.stdout + proc.stderr
