"""NVIDIA XID codes as data: what each means, how bad it is, what to do, whether a job survives.

The alert rules select XIDs by class from here (one regex per alert), the runbook prints this table,
and the bridge can explain a code it receives. Codes not listed are "unclassified" and still alert.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class XidClass(StrEnum):
    """Which alert an XID belongs to; each code raises exactly one alert."""

    HARDWARE = "hardware"
    CONTAINED_ECC = "contained_ecc"
    UNCONTAINED_ECC = "uncontained_ecc"
    FALLEN_OFF_BUS = "fallen_off_bus"
    APPLICATION = "application"
    INFORMATIONAL = "informational"


@dataclass(frozen=True)
class Xid:
    """One XID: ``job_survives`` is about a synchronous multi-GPU training job."""

    code: int
    meaning: str
    cls: XidClass
    action: str
    job_survives: str


_H = XidClass.HARDWARE
XIDS: dict[int, Xid] = {
    x.code: x
    for x in (
        Xid(13, "Graphics engine exception", XidClass.APPLICATION, "restart the application",
            "no"),
        Xid(31, "GPU memory page fault", XidClass.APPLICATION, "restart the application", "no"),
        Xid(43, "GPU stopped processing", XidClass.APPLICATION,
            "none (the process was killed)", "no"),
        Xid(45, "Preemptive cleanup after another error", XidClass.INFORMATIONAL,
            "follow the root XID", "depends"),
        Xid(48, "Double-bit ECC error", _H, "reset the GPU, drain if it repeats", "no"),
        Xid(62, "Internal micro-controller halt", _H, "reset the GPU", "no"),
        Xid(63, "Row remap or page retirement recorded", XidClass.INFORMATIONAL,
            "none now; reset the GPU later to apply", "yes"),
        Xid(64, "Row remap or page retirement recording failed", _H, "reset the GPU", "no"),
        Xid(68, "NVDEC0 exception", XidClass.APPLICATION, "restart the application", "no"),
        Xid(69, "Graphics engine class error", XidClass.APPLICATION, "restart the application",
            "no"),
        Xid(74, "NVLink error", _H, "run the NVLink diagnosis; contact support", "no"),
        Xid(79, "GPU has fallen off the bus", XidClass.FALLEN_OFF_BUS,
            "reboot the node; contact support", "no (node level)"),
        Xid(92, "High single-bit ECC error rate", XidClass.INFORMATIONAL, "none", "yes"),
        Xid(94, "Contained ECC error", XidClass.CONTAINED_ECC,
            "restart the application; the GPU stays usable", "no (the process dies)"),
        Xid(95, "Uncontained ECC error", XidClass.UNCONTAINED_ECC, "reset the GPU", "no"),
        Xid(109, "Context-switch timeout", _H, "reset the GPU", "no"),
        Xid(119, "GSP RPC timeout", _H, "reset the GPU", "no"),
        Xid(120, "GSP error", _H, "reset the GPU", "no"),
        Xid(121, "C2C link error", XidClass.INFORMATIONAL, "none", "yes"),
        Xid(136, "Link training failed", _H, "reset the GPU", "no"),
        Xid(140, "Unrecovered ECC error", _H, "reset the GPU", "no"),
        Xid(143, "GPU initialisation failure", _H, "reset the GPU", "no (GPU unusable)"),
        *(Xid(c, "NVLink5 error", _H, "run the NVLink5 diagnosis", "no")
          for c in range(144, 151)),
        Xid(154, "Recovery action changed", XidClass.INFORMATIONAL,
            "follow the recovery action it carries", "-"),
        Xid(155, "NVLink software-defined error", _H, "reset the GPU", "no"),
        Xid(156, "Recovery action required", _H, "reset the GPU", "no"),
        Xid(158, "GPU fatal error", _H, "reset the GPU", "no"),
        Xid(167, "PCIe fatal timeout", _H, "reboot the node", "no"),
    )
}


def codes(cls: XidClass) -> tuple[int, ...]:
    """The XID codes of one class, ascending."""
    return tuple(sorted(c for c, x in XIDS.items() if x.cls is cls))


def regex(cls: XidClass) -> str:
    """A PromQL label regex matching exactly the codes of ``cls``."""
    return "|".join(str(c) for c in codes(cls))


def known_regex() -> str:
    """A PromQL label regex matching every catalogued code (to find unclassified ones)."""
    return "|".join(str(c) for c in sorted(XIDS))
