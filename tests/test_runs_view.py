"""The run view after a repair: once the GPU reset or the node reboot the fault needed is seen
done, no line of the issue on any surface (W&B notes, run page HTML and JSON, ``explain``'s
text) tells the user to reset, reboot, exclude or drain what was repaired."""

from __future__ import annotations

import json
import re

import pytest

from tests.test_verdict import _done_evidence, fact, healthy, in_pool, run
from tests.views import view_of
from wandb_infra.bridge.diagnosis.report import render_run
from wandb_infra.bridge.diagnosis.root_cause import diagnose
from wandb_infra.bridge.diagnosis.verdict import SAFE, Policy
from wandb_infra.bridge.projection.notes import render_section
from wandb_infra.bridge.prometheus.remediation import remediations_for
from wandb_infra.bridge.web.pages import run_html
from wandb_infra.catalog.recovery import Action

# An instruction to repair the host again: the imperative, or an exclusion to use.
REPAIR_AGAIN = re.compile(r"\b(Reset|Reboot|Drain|Exclude|exclude|drain)\b|--exclude|without gpu")
REPAIRS = {"xid95-gpu-reset": (fact("GpuUncontainedEccError", xid=95), Action.RESET_GPU),
           "xid79-node-reboot": (fact("GpuFallenOffBus", xid=79), Action.REBOOT_NODE),
           "gpu-count-node-reboot": (fact("NodeGpuCountDropped"), Action.REBOOT_NODE)}


def _lines(text: str) -> list[str]:
    """A surface's lines (an HTML page's cells and line breaks count as lines)."""
    return [line for line in re.split(r"\n|<d[td]>|<br>|</b>", text) if line.strip()]


@pytest.mark.parametrize("name", REPAIRS)
def test_no_line_says_to_repair_what_was_repaired(name):
    f, action = REPAIRS[name]
    assert run(f, in_pool(), healthy()).need.action is action
    done, pool, evidence, now = _done_evidence(action, f)
    diagnosis = diagnose([done])
    view = view_of(diagnosis, remediations_for(diagnosis, Policy(), (pool, evidence), now))
    head = view.head
    assert head is not None and head.remediation is not None
    assert head.remediation.verdict == SAFE and not head.remediation.exclusion
    assert head.advice.startswith("Done: ")
    page = view.as_dict(lambda *_: "")
    surfaces = {"notes": render_section(view, lambda *_: ""),
                "page": run_html(view, "t", lambda *_: ""),
                "explain": render_run(page),
                "json": json.dumps(page, indent=0)}
    said = [(where, line) for where, text in surfaces.items() for line in _lines(text)
            if REPAIR_AGAIN.search(line.split("Done: ", 1)[-1])]
    assert said == [], said
