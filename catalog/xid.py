"""NVIDIA XID codes as data: every code NVIDIA lists for current data-centre GPUs, what it means,
NVIDIA's immediate action, and the alert it raises.

Source: NVIDIA's XID catalog, "Analyzing Xid Errors with the Xid Catalog" (Ampere and newer,
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, transcribed 2026-12-01):
the codes that apply to A100, H100, B100 or GB200 and their *immediate action* bucket. Mnemonics
as in NVIDIA/NVSentinel's ``xiderrorsmapping.csv``. Both are kept under ``tests/data/nvidia/``
(provenance in ``tests/data/README.md``) and ``tests/test_verdict.py`` checks this table against
them. Where NVSentinel's copy differs (108, 154, 160, 162) the catalog is followed.

The alert rules select XIDs by class (one regex per alert), the runbook prints this table, and
the bridge turns a code's bucket into the recovery action its verdict follows
(``catalog/recovery.py``). A code not listed here raises ``GpuXidUnclassified``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from wandb_infra.catalog.recovery import BUCKETS, Action

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


class XidClass(StrEnum):
    """Which alert an XID raises; each code raises exactly one alert."""

    HARDWARE = "hardware"
    CONTAINED_ECC = "contained_ecc"
    UNCONTAINED_ECC = "uncontained_ecc"
    FALLEN_OFF_BUS = "fallen_off_bus"
    DECODE = "decode"
    APPLICATION = "application"
    INFORMATIONAL = "informational"


# The three codes with an alert of their own; the rest are classed by their bucket's action.
_OWN_ALERT = {94: XidClass.CONTAINED_ECC, 95: XidClass.UNCONTAINED_ECC,
              79: XidClass.FALLEN_OFF_BUS}
_BY_ACTION = {Action.RESTART_APP: XidClass.APPLICATION, Action.NONE: XidClass.INFORMATIONAL,
              Action.DECODE: XidClass.DECODE}


@dataclass(frozen=True, kw_only=True)
class Xid:
    """One XID: ``bucket`` is NVIDIA's immediate-action bucket ("" where none is published)."""

    code: int
    meaning: str
    bucket: str

    @property
    def action(self) -> Action:
        """What the code needs by NVIDIA's catalog (before any site policy)."""
        return BUCKETS[self.bucket]

    @property
    def cls(self) -> XidClass:
        """The alert class: own alert, else application, informational, decode or hardware."""
        return _OWN_ALERT.get(self.code) or _BY_ACTION.get(self.action, XidClass.HARDWARE)


def _engines(name: str, codes: tuple[int, ...], start: int = 0) -> tuple[Xid, ...]:
    """Engine exceptions numbered in order (copy engines CE0.., decoders NVDEC0..)."""
    return tuple(Xid(code=c, meaning=f"{name}{start + i} exception", bucket="RESTART_APP")
                 for i, c in enumerate(codes))


_ROWS: tuple[Xid, ...] = (
    Xid(code=8, meaning="GPU stopped processing (channel idle timeout)", bucket="RESTART_APP"),
    Xid(code=11, meaning="Graphics engine: invalid or missing hardware method",
        bucket="RESTART_APP"),
    Xid(code=13, meaning="Graphics engine exception", bucket="RESTART_APP"),
    Xid(code=14, meaning="Injected test error", bucket="IGNORE"),
    Xid(code=25, meaning="Graphics engine illegal notify", bucket="RESTART_APP"),
    Xid(code=31, meaning="GPU memory page fault (MMU fault)", bucket="RESTART_APP"),
    Xid(code=32, meaning="Invalid or corrupted push buffer stream (PBDMA)",
        bucket="RESTART_APP"),
    Xid(code=37, meaning="Context-switch firmware: unimplemented method", bucket="IGNORE"),
    Xid(code=38, meaning="Context-switch firmware: watchdog timeout", bucket="IGNORE"),
    *_engines("Copy engine CE", (39, 40, 41)),
    Xid(code=43, meaning="GPU stopped processing (the channel was reset)", bucket="IGNORE"),
    Xid(code=44, meaning="Graphics engine fault during a context switch", bucket="IGNORE"),
    Xid(code=45, meaning="Preemptive cleanup after a previous error", bucket="WORKFLOW_XID_45"),
    Xid(code=46, meaning="GPU stopped processing (GPU timeout)", bucket="RESET_GPU"),
    Xid(code=48, meaning="Double-bit ECC error", bucket="WORKFLOW_XID_48"),
    Xid(code=54, meaning="Clocks reduced for power (auxiliary power connection)",
        bucket="CHECK_MECHANICALS"),
    Xid(code=60, meaning="SEC2 engine exception", bucket="RESTART_APP"),
    Xid(code=62, meaning="Internal micro-controller halt", bucket="RESET_GPU"),
    Xid(code=63, meaning="Row remap or page retirement recorded", bucket="IGNORE"),
    Xid(code=64, meaning="Row remap or page retirement recording failed", bucket="RESET_GPU"),
    Xid(code=66, meaning="Context-switch firmware: register access violation", bucket="IGNORE"),
    Xid(code=67, meaning="Context-switch firmware: verification violation", bucket="IGNORE"),
    *_engines("Video decoder NVDEC", (68,)),
    Xid(code=69, meaning="Graphics engine class error", bucket="RESTART_APP"),
    *_engines("Copy engine CE", (70, 71, 72), 3),
    Xid(code=74, meaning="NVLink error", bucket="WORKFLOW_NVLINK_ERR"),
    *_engines("Copy engine CE", (75, 76, 77), 6),
    Xid(code=78, meaning="vGPU start error", bucket="UPDATE_SWFW"),
    Xid(code=79, meaning="GPU has fallen off the bus", bucket="RESTART_BM"),
    Xid(code=80, meaning="Push buffer CRC mismatch (data corrupted on the bus)",
        bucket="RESTART_APP"),
    *_engines("JPEG decoder NVJPG", (82,)),
    *_engines("Video decoder NVDEC", (83, 84), 1),
    *_engines("Copy engine CE", (85,), 9),
    *_engines("Optical flow engine OFA", (86,)),
    *_engines("Video decoder NVDEC", (88, 89), 3),
    Xid(code=92, meaning="High single-bit ECC error rate", bucket="IGNORE"),
    Xid(code=93, meaning="InfoROM erase limit exceeded", bucket="IGNORE"),
    Xid(code=94, meaning="Contained ECC error", bucket="RESTART_APP"),
    Xid(code=95, meaning="Uncontained ECC error", bucket="RESET_GPU"),
    *_engines("Video decoder NVDEC", (96, 97, 98), 5),
    *_engines("JPEG decoder NVJPG", (99, 100, 101, 102, 103, 104, 105), 1),
    Xid(code=106, meaning="SMBPBI test message", bucket="IGNORE"),
    Xid(code=107, meaning="SMBPBI test message (silent)", bucket="IGNORE"),
    Xid(code=108, meaning="Destination FLA translation error", bucket="IGNORE"),
    Xid(code=109, meaning="Context-switch timeout", bucket="RESET_GPU"),
    Xid(code=110, meaning="Security fault", bucket="RESET_GPU"),
    Xid(code=119, meaning="GSP RPC timeout", bucket="RESET_GPU"),
    Xid(code=120, meaning="GSP error", bucket="RESET_GPU"),
    Xid(code=121, meaning="C2C link error", bucket="IGNORE"),
    *_engines("Copy engine CE", tuple(range(126, 136)), 10),
    Xid(code=136, meaning="Link training failed", bucket="RESET_GPU"),
    Xid(code=137, meaning="NVLink FLA privilege error", bucket="IGNORE"),
    *_engines("Optical flow engine OFA", (139,), 1),
    Xid(code=140, meaning="Unrecovered ECC error", bucket="RESET_GPU"),
    Xid(code=141, meaning="Fast-path error", bucket="IGNORE"),
    Xid(code=142, meaning="NVENC3 engine exception", bucket="CONTACT_SUPPORT"),
    Xid(code=143, meaning="GPU initialisation failure", bucket="RESET_GPU"),
    *(Xid(code=c, meaning=f"NVLink5 {unit} error (decode the sub-code)",
          bucket="WORKFLOW_NVLINK5_ERR")
      for c, unit in zip(range(144, 151),
                         ("SAW", "RLW", "TLW", "TREX", "NVLPW control", "NETIR", "MSE"),
                         strict=True)),
    Xid(code=151, meaning="Key rotation error (confidential computing)", bucket="RESTART_VM"),
    Xid(code=154, meaning="GPU recovery action changed (carries the action the GPU needs)",
        bucket="XID_154"),
    Xid(code=155, meaning="NVLink software-defined error", bucket="RESET_GPU"),
    Xid(code=156, meaning="Resource retirement event", bucket="RESET_GPU"),
    Xid(code=157, meaning="Resource retirement failure", bucket="IGNORE"),
    Xid(code=158, meaning="GPU fatal timeout", bucket="RESET_GPU"),
    Xid(code=159, meaning="CHI non-data error", bucket="CHECK_UVM"),
    Xid(code=160, meaning="Channel retirement event", bucket="IGNORE"),
    Xid(code=161, meaning="Channel retirement failure", bucket="IGNORE"),
    *(Xid(code=c, meaning="Listed by NVIDIA without a published action", bucket="")
      for c in (162, 163, 164, 165, 166, 168, 169, 170)),
    Xid(code=167, meaning="PCIe fatal timeout", bucket=""),
    Xid(code=171, meaning="DRAM error detail of an XID 48", bucket=""),
    Xid(code=172, meaning="SRAM error detail of an XID 48", bucket=""),
)
XIDS: dict[int, Xid] = {x.code: x for x in sorted(_ROWS, key=lambda x: x.code)}


def codes(cls: XidClass) -> tuple[int, ...]:
    """The XID codes of one class, ascending."""
    return tuple(c for c, x in XIDS.items() if x.cls is cls)


def _ranges(numbers: tuple[int, ...]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for n in numbers:
        if out and out[-1][1] == n - 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return out


def regex(cls: XidClass) -> str:
    """A PromQL label regex matching exactly the codes of ``cls``."""
    return "|".join(str(c) for c in codes(cls))


def known_regex() -> str:
    """A PromQL label regex matching every catalogued code (to find unclassified ones)."""
    return "|".join(str(c) for c in XIDS)


def prose(numbers: tuple[int, ...]) -> str:
    """Codes as readable ranges: ``8, 11, 13, 39-41 and 126-135``."""
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in _ranges(numbers)]
    return f"{', '.join(parts[:-1])} and {parts[-1]}" if len(parts) > 1 else "".join(parts)
