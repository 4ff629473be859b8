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


@dataclass(frozen=True, kw_only=True)
class Xid:
    """One XID, stated with keywords: ``job_survives`` is about a synchronous multi-GPU training
    job."""

    code: int
    meaning: str
    cls: XidClass
    action: str
    job_survives: str


XIDS: dict[int, Xid] = {
    x.code: x
    for x in (
        Xid(code=13, meaning="Graphics engine exception", cls=XidClass.APPLICATION,
            action="restart the application", job_survives="no"),
        Xid(code=31, meaning="GPU memory page fault", cls=XidClass.APPLICATION,
            action="restart the application", job_survives="no"),
        Xid(code=43, meaning="GPU stopped processing", cls=XidClass.APPLICATION,
            action="none (the process was killed)", job_survives="no"),
        Xid(code=45, meaning="Preemptive cleanup after another error",
            cls=XidClass.INFORMATIONAL, action="follow the root XID", job_survives="depends"),
        Xid(code=48, meaning="Double-bit ECC error", cls=XidClass.HARDWARE,
            action="reset the GPU, drain if it repeats", job_survives="no"),
        Xid(code=62, meaning="Internal micro-controller halt", cls=XidClass.HARDWARE,
            action="reset the GPU", job_survives="no"),
        Xid(code=63, meaning="Row remap or page retirement recorded",
            cls=XidClass.INFORMATIONAL, action="none now; reset the GPU later to apply",
            job_survives="yes"),
        Xid(code=64, meaning="Row remap or page retirement recording failed",
            cls=XidClass.HARDWARE, action="reset the GPU", job_survives="no"),
        Xid(code=68, meaning="NVDEC0 exception", cls=XidClass.APPLICATION,
            action="restart the application", job_survives="no"),
        Xid(code=69, meaning="Graphics engine class error", cls=XidClass.APPLICATION,
            action="restart the application", job_survives="no"),
        Xid(code=74, meaning="NVLink error", cls=XidClass.HARDWARE,
            action="run the NVLink diagnosis; contact support", job_survives="no"),
        Xid(code=79, meaning="GPU has fallen off the bus", cls=XidClass.FALLEN_OFF_BUS,
            action="reboot the node; contact support", job_survives="no (node level)"),
        Xid(code=92, meaning="High single-bit ECC error rate", cls=XidClass.INFORMATIONAL,
            action="none", job_survives="yes"),
        Xid(code=94, meaning="Contained ECC error", cls=XidClass.CONTAINED_ECC,
            action="restart the application; the GPU stays usable",
            job_survives="no (the process dies)"),
        Xid(code=95, meaning="Uncontained ECC error", cls=XidClass.UNCONTAINED_ECC,
            action="reset the GPU", job_survives="no"),
        Xid(code=109, meaning="Context-switch timeout", cls=XidClass.HARDWARE,
            action="reset the GPU", job_survives="no"),
        Xid(code=119, meaning="GSP RPC timeout", cls=XidClass.HARDWARE,
            action="reset the GPU", job_survives="no"),
        Xid(code=120, meaning="GSP error", cls=XidClass.HARDWARE,
            action="reset the GPU", job_survives="no"),
        Xid(code=121, meaning="C2C link error", cls=XidClass.INFORMATIONAL,
            action="none", job_survives="yes"),
        Xid(code=136, meaning="Link training failed", cls=XidClass.HARDWARE,
            action="reset the GPU", job_survives="no"),
        Xid(code=140, meaning="Unrecovered ECC error", cls=XidClass.HARDWARE,
            action="reset the GPU", job_survives="no"),
        Xid(code=143, meaning="GPU initialisation failure", cls=XidClass.HARDWARE,
            action="reset the GPU", job_survives="no (GPU unusable)"),
        *(Xid(code=c, meaning="NVLink5 error", cls=XidClass.HARDWARE,
              action="run the NVLink5 diagnosis", job_survives="no")
          for c in range(144, 151)),
        Xid(code=154, meaning="Recovery action changed", cls=XidClass.INFORMATIONAL,
            action="follow the recovery action it carries", job_survives="-"),
        Xid(code=155, meaning="NVLink software-defined error", cls=XidClass.HARDWARE,
            action="reset the GPU", job_survives="no"),
        Xid(code=156, meaning="Recovery action required", cls=XidClass.HARDWARE,
            action="reset the GPU", job_survives="no"),
        Xid(code=158, meaning="GPU fatal error", cls=XidClass.HARDWARE,
            action="reset the GPU", job_survives="no"),
        Xid(code=167, meaning="PCIe fatal timeout", cls=XidClass.HARDWARE,
            action="reboot the node", job_survives="no"),
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
