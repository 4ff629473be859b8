"""The simulated cluster: hosts x GPUs, the faults injected into them, the runs placed on them.

Why one object: faults, workload, run placements and Slurm states change the same hosts under one
lock, and the render cache must know when a host changed (its ``version``). The readings follow
from the state (``model``); the text comes from ``exposition``; each host's text is cached and
re-rendered only when it is older than ``render_ttl`` or its state changed, so 2,000 hosts stay
cheap to scrape.

Faults (``Cluster.inject`` or ``POST /control/fault``): xid, thermal, stall, ib_flap, ib_down,
host_lost, nvlink, pcie, ecc_dbe, row_remap_pending, power_brake, eth_flap, eth_down, straggler
(a GPU that keeps up less: lower utilisation and activity), row_remap_failure, sbe_storm
(single-bit errors at a high rate, pages retired past DCGM's limit); on the host, oom_kill (one
more OOM kill), memory_pressure (tasks stalled on memory 30% of the time, MemAvailable at 0.2%
of MemTotal), edac_uncorrectable (one more uncorrectable DIMM error), edac_correctable (a storm of
corrected ones), fs_readonly, fs_full,
fs_not_answering (on the mount point ``device``, /scratch by default) and reboot (unplanned: the
boot time moves to now and the host's faults end); ``clear`` removes them.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable

from demo.simulator.exposition import (
    FLAVOURS,
    GPU_METRICS,
    IB_COUNTERS,
    dcgm_text,
    node_text,
    runs_text,
    scontrol_line,
)
from demo.simulator.model import (
    IB_FLAP_PERIOD_S,
    POD_NAMESPACE,
    Counter,
    EthPort,
    Gpu,
    Host,
    IbPort,
    Mount,
    RunAssignment,
    SimulatorError,
    apply_port_rates,
    apply_rates,
    stable_int,
)
from wandb_infra.catalog.alerts import RETIRED_PAGES_LIMIT
from wandb_infra.catalog.recovery import Action
from wandb_infra.catalog.xid import XIDS, XidClass, codes
from wandb_infra.common.logsetup import log_fields

log = logging.getLogger("demo.simulator")

FAULT_KINDS: tuple[str, ...] = (
    "xid", "thermal", "stall", "ib_flap", "ib_down", "host_lost", "nvlink", "pcie", "ecc_dbe",
    "row_remap_pending", "power_brake", "eth_flap", "eth_down", "straggler", "row_remap_failure",
    "sbe_storm", "oom_kill", "memory_pressure", "edac_uncorrectable", "edac_correctable",
    "fs_readonly", "fs_full", "fs_not_answering", "reboot",
)
# Faults that act on one GPU when ``gpu`` is given, on every GPU of the host otherwise.
GPU_FAULTS = frozenset({"xid", "thermal", "stall", "nvlink", "pcie", "ecc_dbe",
                        "row_remap_pending", "power_brake", "straggler", "row_remap_failure",
                        "sbe_storm"})
LINK_FAULTS = frozenset({"ib_flap", "ib_down"})
ETH_FAULTS = frozenset({"eth_flap", "eth_down"})
ETH_DEVICES: tuple[str, ...] = ("eth0",)
MEMORY_FAULTS = frozenset({"oom_kill", "memory_pressure", "edac_uncorrectable",
                           "edac_correctable"})
MOUNT_FAULTS = frozenset({"fs_readonly", "fs_full", "fs_not_answering"})
DEFAULT_MOUNT = "/scratch"
# Share of time every task waits for memory under memory_pressure, and corrected DIMM errors per
# second under edac_correctable: both well past the host alerts' thresholds.
MEMORY_STALLED_RATIO = 0.3
EDAC_CORRECTABLE_PER_S = 1.0

HOST_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,50}")

ECC_DBE_XIDS = frozenset({48, 94, 95})
FALLEN_OFF_BUS_XIDS = frozenset(codes(XidClass.FALLEN_OFF_BUS))
# What the driver sets its recovery action to after an XID, as the catalog's action says; an
# XID whose action is a restart or nothing leaves it at none.
DRIVER_ACTION_OF = {Action.RESET_GPU: 1, Action.REBOOT_NODE: 2}


class Cluster:
    """Hosts x GPUs with state; renders exposition text and accepts faults. Thread-safe."""

    def __init__(
        self,
        hosts: int = 4,
        *,
        gpus_per_host: int = 8,
        flavour: str = "hostname",
        prefix: str = "gpu-node",
        ib_ports: int = 8,
        host_flavours: dict[str, str] | None = None,
        xid_count: bool = False,
        xid_absent_until_first: bool = False,
        kubernetes_pods: bool = False,
        render_ttl: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if hosts < 1 or gpus_per_host < 1 or ib_ports < 0:
            raise SimulatorError("hosts and gpus_per_host must be >= 1, ib_ports >= 0")
        if not HOST_PREFIX.fullmatch(prefix):
            raise SimulatorError(f"host prefix {prefix!r} must match {HOST_PREFIX.pattern}")
        for fl in [flavour, *(host_flavours or {}).values()]:
            if fl not in FLAVOURS:
                raise SimulatorError(f"unknown dcgm flavour {fl!r}; expected one of {FLAVOURS}")
        self.clock = clock
        self.render_ttl = render_ttl
        self.xid_count = xid_count
        self.xid_absent_until_first = xid_absent_until_first
        # dcgm-exporter in Kubernetes mode: the GPUs a run holds carry its pod's labels, and the
        # join metrics include wandb_run_pod_info (as the exporter's Kubernetes source).
        self.kubernetes_pods = kubernetes_pods
        self._pod_of: dict[tuple[str, int], tuple[str, str]] = {}
        self.gpus_per_host = gpus_per_host
        self._lock = threading.RLock()
        self.runs: dict[tuple[str, str, str], RunAssignment] = {}
        self._runs_version = 0
        self._runs_cache: tuple[int, bytes] | None = None
        now = clock()
        width = max(3, len(str(hosts)))
        names = [f"{prefix}-{i:0{width}d}" for i in range(1, hosts + 1)]
        unknown = set(host_flavours or {}) - set(names)
        if unknown:
            raise SimulatorError(f"host_flavours names unknown hosts: {sorted(unknown)}")
        self.hosts: dict[str, Host] = {}
        for name in names:
            gpus = [self._new_gpu(name, i, now) for i in range(gpus_per_host)]
            ib = {f"mlx5_{d}": self._new_port(f"mlx5_{d}", now) for d in range(ib_ports)}
            eth = {d: EthPort(d, Counter(2.0, now)) for d in ETH_DEVICES}
            self.hosts[name] = Host(name, (host_flavours or {}).get(name, flavour), gpus, ib, eth,
                                    boot_time=now - 86400)
            for gpu in gpus:
                apply_rates(gpu, now)
            for port in ib.values():
                apply_port_rates(self.hosts[name], port, now)

    # ---- construction -------------------------------------------------------------------------

    @staticmethod
    def _new_gpu(host: str, index: int, now: float) -> Gpu:
        digest = hashlib.sha256(f"{host}/{index}".encode()).hexdigest()
        uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
        bus = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)[index % 8] + 0x100 * (index // 8)
        gpu = Gpu(host, index, uuid, f"00000000:{bus:02X}:00.0")
        seed = stable_int(uuid, 1000)
        start = {
            "energy": 4.0e11 + seed * 1e8, "ecc_sbe_vol": 0, "ecc_sbe_agg": seed % 3,
            "correctable_remapped": seed % 2,
        }
        for metric in GPU_METRICS:
            if metric.kind == "counter":
                gpu.counters[metric.key] = Counter(float(start.get(metric.key, 0)), now)
        return gpu

    @staticmethod
    def _new_port(device: str, now: float) -> IbPort:
        port = IbPort(device)
        for name in IB_COUNTERS:
            port.counters[name] = Counter(0.0, now)
        return port

    # ---- lookups -------------------------------------------------------------------------------

    def host(self, name: str) -> Host:
        """A host by name, or a SimulatorError naming the problem."""
        try:
            return self.hosts[name]
        except KeyError:
            raise SimulatorError(f"unknown host {name!r}") from None

    def _select_gpus(self, host: Host, gpu: int | None) -> list[Gpu]:
        if gpu is None:
            return list(host.gpus)
        if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < len(host.gpus):
            raise SimulatorError(f"gpu must be an index 0..{len(host.gpus) - 1}, got {gpu!r}")
        return [host.gpus[gpu]]

    def _select_ports(self, host: Host, device: str | None) -> list[IbPort]:
        if device is None:
            if not host.ib:
                raise SimulatorError(f"host {host.name} has no InfiniBand ports")
            return [next(iter(host.ib.values()))]
        if device not in host.ib:
            raise SimulatorError(f"unknown InfiniBand device {device!r} on {host.name}")
        return [host.ib[device]]

    @staticmethod
    def _select_eth(host: Host, device: str | None) -> list[EthPort]:
        name = device or ETH_DEVICES[0]
        if name not in host.eth:
            raise SimulatorError(f"unknown network interface {name!r} on {host.name}")
        return [host.eth[name]]

    # ---- faults --------------------------------------------------------------------------------

    def inject(self, kind: str, host: str, gpu: int | None = None, code: int | None = None,
               device: str | None = None) -> None:
        """Start a fault. Everything is validated before anything changes."""
        if kind not in FAULT_KINDS:
            raise SimulatorError(f"unknown fault kind {kind!r}; expected one of {FAULT_KINDS}")
        with self._lock:
            target = self.host(host)
            if kind == "xid":
                if gpu is None:
                    raise SimulatorError("an xid fault needs a gpu index")
                if isinstance(code, bool) or not isinstance(code, int) or not 1 <= code <= 999:
                    raise SimulatorError(f"xid code must be an integer 1..999, got {code!r}")
            gpus = self._select_gpus(target, gpu) if kind in GPU_FAULTS else []
            ports = self._select_ports(target, device) if kind in LINK_FAULTS else []
            eths = self._select_eth(target, device) if kind in ETH_FAULTS else []
            mounts = self._select_mounts(target, device) if kind in MOUNT_FAULTS else []
            now = self.clock()
            if kind == "reboot":
                self._reboot(target, now)
            for mount in mounts:
                mount.fault = kind
            if kind in MEMORY_FAULTS:
                self._inject_memory(target, kind, now)
            for eth in eths:
                eth.fault, eth.fault_since = kind, now
                if kind == "eth_down":
                    eth.carrier.base += 1
                eth.carrier.set_rate(2.0 / IB_FLAP_PERIOD_S if kind == "eth_flap" else 0.0, now)
            if kind == "host_lost":
                target.lost = True
            for port in ports:
                port.fault, port.fault_since = kind, now
                if kind == "ib_down":
                    port.counters["link_downed_total"].base += 1
                apply_port_rates(target, port, now)
            for g in gpus:
                self._inject_gpu(g, kind, code, now)
            if kind in {"stall", "thermal"}:
                for port in target.ib.values():
                    apply_port_rates(target, port, now)
            target.version += 1
        log.info("fault injected", extra=log_fields(kind=kind, host=host, gpu=gpu, code=code,
                                                     device=device))

    @staticmethod
    def _select_mounts(host: Host, mountpoint: str | None) -> list[Mount]:
        name = mountpoint or DEFAULT_MOUNT
        if name not in host.mounts:
            raise SimulatorError(f"unknown mount point {name!r} on {host.name}")
        return [host.mounts[name]]

    @staticmethod
    def _inject_memory(host: Host, kind: str, now: float) -> None:
        if kind == "oom_kill":
            host.oom_kills += 1
        elif kind == "edac_uncorrectable":
            host.edac_uncorrectable += 1
        elif kind == "memory_pressure":
            host.memory_stalled.set_rate(MEMORY_STALLED_RATIO, now)
        else:
            host.edac_correctable.set_rate(EDAC_CORRECTABLE_PER_S, now)

    def inject_hosts(self, kind: str, hosts: Iterable[str], gpu: int | None = None,
                     code: int | None = None, device: str | None = None) -> None:
        """Start the same fault on several hosts under one lock hold, so no scrape sees some of
        them faulty and the others not yet."""
        with self._lock:
            for name in hosts:
                self.inject(kind, name, gpu, code, device)

    def _inject_gpu(self, gpu: Gpu, kind: str, code: int | None, now: float) -> None:
        if kind == "xid":
            assert code is not None
            gpu.last_xid = code
            gpu.xid_events.append((now, code))
            known = XIDS.get(code)
            if known is not None and known.action in DRIVER_ACTION_OF:
                gpu.recovery_action = max(gpu.recovery_action, DRIVER_ACTION_OF[known.action])
            if code in ECC_DBE_XIDS:
                for key in ("ecc_dbe_vol", "ecc_dbe_agg"):
                    gpu.counters[key].base += 1
            if code in FALLEN_OFF_BUS_XIDS:
                gpu.faults.add("fallen_off_bus")
        elif kind == "ecc_dbe":
            for key in ("ecc_dbe_vol", "ecc_dbe_agg", "retired_dbe"):
                gpu.counters[key].base += 1
            gpu.retired_pending = 1
        elif kind == "row_remap_pending":
            gpu.row_remap_pending = True
            gpu.counters["uncorrectable_remapped"].base += 1
        else:
            gpu.faults.add(kind)
            if kind == "row_remap_failure":
                gpu.counters["uncorrectable_remapped"].base += 1
            if kind == "sbe_storm":
                gpu.counters["retired_sbe"].base += RETIRED_PAGES_LIMIT + 1
        apply_rates(gpu, now)

    def clear(self, host: str | None = None, gpu: int | None = None, kind: str | None = None,
              device: str | None = None) -> None:
        """End faults: all, one host's, one GPU's, of one kind. Clearing ``xid`` models a GPU reset
        with an exporter restart (the last-XID series disappears); counters never go back (OOM
        kills and uncorrectable DIMM errors count since boot: only a reboot resets them)."""
        if kind is not None and kind not in FAULT_KINDS:
            raise SimulatorError(f"unknown fault kind {kind!r}; expected one of {FAULT_KINDS}")
        with self._lock:
            targets = [self.host(host)] if host is not None else list(self.hosts.values())
            selections = [(t, self._select_gpus(t, gpu)) for t in targets]
            if device is not None:
                for t in targets:
                    if device not in t.eth and device not in t.mounts:
                        self._select_ports(t, device)
            now = self.clock()
            for target, gpus in selections:
                if kind in (None, "host_lost"):
                    target.lost = False
                for g in gpus:
                    self._clear_gpu(g, kind, now)
                for port in target.ib.values():
                    if (device in (None, port.device)) and kind in (None, port.fault):
                        port.fault = None
                    apply_port_rates(target, port, now)
                for eth in target.eth.values():
                    if (device in (None, eth.device)) and kind in (None, eth.fault):
                        eth.fault = None
                        eth.carrier.set_rate(0.0, now)
                for mount in target.mounts.values():
                    if device in (None, mount.mountpoint) and kind in (None, mount.fault):
                        mount.fault = None
                if kind in (None, "memory_pressure"):
                    target.memory_stalled.set_rate(0.0, now)
                if kind in (None, "edac_correctable"):
                    target.edac_correctable.set_rate(0.0, now)
                target.version += 1
        log.info("faults cleared", extra=log_fields(kind=kind, host=host, gpu=gpu, device=device))

    def reboot(self, host: str) -> None:
        """Reboot a host (the ``reboot`` fault: an unplanned one unless the scheduler says
        maintenance)."""
        self.inject("reboot", host)

    def _reboot(self, target: Host, now: float) -> None:
        """Its boot time moves to now, every GPU comes back without faults (XIDs, the driver's
        recovery action, a GPU that fell off the bus), the kernel's counts since boot start again,
        every mount is mounted afresh, its telemetry answers."""
        target.boot_time = now
        target.lost = False
        for g in target.gpus:
            self._clear_gpu(g, None, now)
        target.oom_kills = target.edac_uncorrectable = 0
        target.edac_correctable, target.memory_stalled = Counter(0.0, now), Counter(0.0, now)
        for mount in target.mounts.values():
            mount.fault = None

    def _clear_gpu(self, gpu: Gpu, kind: str | None, now: float) -> None:
        if kind in (None, "xid"):
            gpu.last_xid = None
            gpu.xid_events.clear()
            gpu.faults.discard("fallen_off_bus")
            gpu.recovery_action = 0
        if kind in (None, "ecc_dbe"):
            gpu.retired_pending = 0
        if kind in (None, "row_remap_pending"):
            gpu.row_remap_pending = False
        if kind is None:
            gpu.faults.clear()
        else:
            gpu.faults.discard(kind)
        apply_rates(gpu, now)

    def set_busy(self, host: str, busy: bool, gpu: int | None = None) -> None:
        """Start or stop the workload on a host's GPUs (idle GPUs draw little and free memory)."""
        with self._lock:
            target = self.host(host)
            gpus = self._select_gpus(target, gpu)
            now = self.clock()
            for g in gpus:
                g.busy = bool(busy)
                apply_rates(g, now)
            for port in target.ib.values():
                apply_port_rates(target, port, now)
            target.version += 1

    # ---- runs (join-metric stand-in) -------------------------------------------------------------

    def assign_run(self, entity: str, project: str, run_id: str, hosts: Iterable[str], *,
                   gpus: Iterable[int] | None = None, run_name: str | None = None) -> RunAssignment:
        """Place a run on hosts (and GPU indices on each); served at ``/runs/metrics``."""
        host_list = tuple(hosts)
        if not (entity and project and run_id and host_list):
            raise SimulatorError("a run needs entity, project, run_id and at least one host")
        gpu_list = None if gpus is None else tuple(gpus)
        with self._lock:
            for name in host_list:
                target = self.host(name)
                for index in gpu_list or ():
                    self._select_gpus(target, index)
            run = RunAssignment(entity, project, run_id, host_list, gpu_list, run_name or run_id)
            self.runs[(entity, project, run_id)] = run
            self._runs_version += 1
            if self.kubernetes_pods:
                self._set_pods(run, held=True)
        return run

    def _set_pods(self, run: RunAssignment, held: bool) -> None:
        """Label (or unlabel) the GPUs of a run's pods, one pod per host."""
        for i, name in enumerate(run.hosts):
            for index in run.gpus if run.gpus is not None else range(self.gpus_per_host):
                if held:
                    self._pod_of[(name, index)] = (POD_NAMESPACE, f"{run.run_id}-{i}")
                else:
                    self._pod_of.pop((name, index), None)
            self.hosts[name].version += 1

    def end_run(self, entity: str, project: str, run_id: str) -> None:
        """Remove a run's join series (they go stale in Prometheus)."""
        with self._lock:
            run = self.runs.pop((entity, project, run_id), None)
            if run is None:
                raise SimulatorError(f"unknown run {entity}/{project}/{run_id}")
            self._runs_version += 1
            if self.kubernetes_pods:
                self._set_pods(run, held=False)

    # ---- rendering -----------------------------------------------------------------------------

    def render(self, exporter: str, host: str) -> bytes | None:
        """Exposition text of one target (``dcgm`` or ``node``); None while the host is lost."""
        with self._lock:
            target = self.host(host)
            if target.lost:
                return None
            now = self.clock()
            cached = target.cache.get(exporter)
            if cached and cached[1] == target.version and now - cached[0] < self.render_ttl:
                return cached[2]
            if exporter == "dcgm":
                body = dcgm_text(target, now, pods=self._pod_of, xid_count=self.xid_count,
                                 xid_absent_until_first=self.xid_absent_until_first)
            elif exporter == "node":
                body = node_text(target, now)
            else:
                raise SimulatorError(f"unknown exporter {exporter!r}")
            data = body.encode()
            target.cache[exporter] = (now, target.version, data)
            return data

    def set_slurm_state(self, host: str, state: str, reason: str = "") -> None:
        """What ``scontrol show node`` says of a host (``IDLE+DRAIN`` after a drain); "" goes
        back to the default (ALLOCATED under a run, else IDLE)."""
        with self._lock:
            target = self.host(host)
            target.slurm_state, target.slurm_reason = state, reason

    def slurm_state(self, host: str) -> str:
        """The state ``scontrol show node`` prints for a host now."""
        with self._lock:
            target = self.host(host)
            busy = any(host in run.hosts for run in self.runs.values())
            return target.slurm_state or ("ALLOCATED" if busy else "IDLE")

    def render_scontrol_nodes(self) -> str:
        """Every host as one ``scontrol show node -o`` line (NodeName, State, Reason last)."""
        with self._lock:
            lines = [scontrol_line(host, self.slurm_state(name))
                     for name, host in self.hosts.items()]
            return "\n".join(lines) + "\n"

    def render_runs(self) -> bytes:
        """The join metrics (contract 1) for assigned runs."""
        with self._lock:
            if self._runs_cache and self._runs_cache[0] == self._runs_version:
                return self._runs_cache[1]
            data = runs_text(self.runs.values(), self.hosts, self.gpus_per_host,
                             self.kubernetes_pods).encode()
            self._runs_cache = (self._runs_version, data)
            return data
