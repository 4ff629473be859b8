"""What a fault needs before a job may run on its hardware again: the recovery-action model.

One ``Action`` per fault, decided once (``bridge/diagnosis/verdict.py``) and read by everything that
advises or acts: the "what to do" text, the restart verdict and the optional quarantine. Sources:

* NVIDIA's XID catalog ("Analyzing Xid Errors with the Xid Catalog",
  https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, and its spreadsheet
  ``Xid-Catalog.xlsx``): the *immediate action* bucket of every XID; ``BUCKETS`` maps each bucket
  to an ``Action``.
* NVML's ``nvmlDeviceGpuRecoveryAction_t``, exported by DCGM as field 1523
  (``DCGM_FI_DEV_GPU_RECOVERY_ACTION``, legacy ``DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION``; NVIDIA's
  cuda-python docs, ``cuda.bindings.nvml.DeviceGpuRecoveryAction``): the driver's own statement
  of what the GPU needs; ``DRIVER_ACTIONS`` maps its values.
* DCGM's health-watch advice as NVIDIA/NVSentinel maps it (``dcgmerrorsmapping.csv`` in
  ``distros/kubernetes/nvsentinel/charts/gpu-health-monitor/``) for the non-XID alerts.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Action(StrEnum):
    """What must happen before the faulty hardware takes a job again."""

    NONE = "none"  # nothing: the driver handled it (NVIDIA: IGNORE)
    RESTART_APP = "restart_app"  # restart the application; the GPU stays usable
    RESET_GPU = "reset_gpu"
    DRAIN_P2P = "drain_p2p"  # stop all work (peer-to-peer traffic) on the GPU, then reuse
    REBOOT_NODE = "reboot_node"
    RESTORE_LINK = "restore_link"  # the link is up again and stays up
    SERVICE = "service"  # an operator inspects and fixes the node (cooling, power, cabling)
    REPLACE = "replace"  # field diagnosis and likely replacement (NVIDIA: contact support)
    DECODE = "decode"  # decode the XID's fields: the need depends on the sub-code
    FOLLOW_DRIVER = "follow_driver"  # XID 154: the driver's recovery action says
    UNKNOWN = "unknown"  # nobody publishes an action for this fault


@dataclass(frozen=True, kw_only=True)
class ActionSpec:
    """How the action reads and whether the node must leave the pool for it.

    ``out_of_service`` is None where the action is not known until resolved (decode, follow the
    driver, unknown): nothing acts on such a fault, and the verdict says what is missing."""

    needs: str  # completes "<fault> needs ..."
    out_of_service: bool | None
    observed_by: str  # what telemetry shows when it happened (the runbook prints it)


SPECS: dict[Action, ActionSpec] = {
    Action.NONE: ActionSpec(
        needs="no action", out_of_service=False,
        observed_by="nothing to observe"),
    Action.RESTART_APP: ActionSpec(
        needs="only an application restart", out_of_service=False,
        observed_by="nothing to observe: the GPU stays usable"),
    Action.RESET_GPU: ActionSpec(
        needs="a GPU reset", out_of_service=True,
        observed_by="the driver's recovery action (DCGM field 1523) back to none after the "
                    "fault, a reboot of the node, or a new GPU (new UUID)"),
    Action.DRAIN_P2P: ActionSpec(
        needs="all work on the GPU stopped (the driver asks to drain peer-to-peer traffic)",
        out_of_service=True,
        observed_by="the driver's recovery action back to none, or a reboot of the node"),
    Action.REBOOT_NODE: ActionSpec(
        needs="a reboot of the node", out_of_service=True,
        observed_by="node_boot_time_seconds later than the fault and the node's GPUs back"),
    Action.RESTORE_LINK: ActionSpec(
        needs="the link back up and stable", out_of_service=True,
        observed_by="the alert resolved (port active again) and quiet for the settle time"),
    Action.SERVICE: ActionSpec(
        needs="an operator's inspection of the node", out_of_service=True,
        observed_by="the alert's condition cleared and quiet for the settle time, or the node "
                    "taken out of the pool and returned by an operator"),
    Action.REPLACE: ActionSpec(
        needs="field diagnosis and likely a replacement GPU", out_of_service=True,
        observed_by="a new GPU (new UUID) at that index, or the node returned by an operator "
                    "after leaving the pool"),
    Action.DECODE: ActionSpec(
        needs="its fields decoded (the need depends on the sub-code)", out_of_service=None,
        observed_by="the driver's recovery action, when exported, says what the sub-code "
                    "needs"),
    Action.FOLLOW_DRIVER: ActionSpec(
        needs="what the driver's recovery action says", out_of_service=None,
        observed_by="the driver's recovery action (DCGM field 1523)"),
    Action.UNKNOWN: ActionSpec(
        needs="an action nobody publishes", out_of_service=None,
        observed_by="nothing: look the fault up in NVIDIA's XID catalog"),
}

# NVIDIA's immediate-action buckets. The workflows: XID 45 alone is cleanup after another error
# (follow that one); XID 48 alone needs a GPU reset; 13/31 are application faults unless they
# repeat on one GPU; 74 and 144-150 are decoded from their fields; 154 carries the driver's action.
BUCKETS: dict[str, Action] = {
    "RESTART_APP": Action.RESTART_APP,
    "IGNORE": Action.NONE,
    "RESET_GPU": Action.RESET_GPU,
    "RESTART_BM": Action.REBOOT_NODE,
    "RESTART_VM": Action.REBOOT_NODE,
    "CONTACT_SUPPORT": Action.REPLACE,
    "CHECK_MECHANICALS": Action.SERVICE,
    "UPDATE_SWFW": Action.SERVICE,
    "CHECK_UVM": Action.SERVICE,
    "WORKFLOW_XID_45": Action.NONE,
    "WORKFLOW_XID_48": Action.RESET_GPU,
    "WORKFLOW_NVLINK_ERR": Action.DECODE,
    "WORKFLOW_NVLINK5_ERR": Action.DECODE,
    "XID_154": Action.FOLLOW_DRIVER,
    "": Action.UNKNOWN,  # in use, no bucket published
}

# nvmlDeviceGpuRecoveryAction_t as DCGM field 1523 reports it.
DRIVER_ACTIONS: dict[int, tuple[str, Action]] = {
    0: ("none", Action.NONE),
    1: ("gpu_reset", Action.RESET_GPU),
    2: ("node_reboot", Action.REBOOT_NODE),
    3: ("drain_p2p", Action.DRAIN_P2P),
    4: ("drain_and_reset", Action.RESET_GPU),
}
DRIVER_ACTION_WORDS: dict[str, str] = {
    "gpu_reset": "GPU reset", "node_reboot": "node reboot", "drain_p2p": "drain P2P",
    "drain_and_reset": "drain P2P and reset", "other": "a recovery action newer than this "
                                                      "catalog",
}


def driver_action(value: int) -> Action:
    """The action of a field-1523 value; a value newer than this table is unknown."""
    return DRIVER_ACTIONS.get(value, ("other", Action.UNKNOWN))[1]


def from_driver_label(label: str) -> Action:
    """The action of a ``recovery_action`` label value (as the rules write it)."""
    for name, action in DRIVER_ACTIONS.values():
        if name == label:
            return action
    return Action.UNKNOWN


# Stronger first: when the catalog and the driver disagree, the stronger need wins (a reset is
# never "no action" because the catalog said restart the application).
STRENGTH: tuple[Action, ...] = (
    Action.REPLACE, Action.REBOOT_NODE, Action.RESET_GPU, Action.DRAIN_P2P, Action.SERVICE,
    Action.RESTORE_LINK, Action.RESTART_APP, Action.NONE,
)


def stronger(a: Action, b: Action) -> Action:
    """The stronger of two resolved actions (one unresolved: the resolved one)."""
    if a not in STRENGTH:
        return b
    if b not in STRENGTH:
        return a
    return a if STRENGTH.index(a) <= STRENGTH.index(b) else b
