"""The notes section: user's notes preserved byte for byte, idempotent, injection-proof."""

from __future__ import annotations

import re
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.bridge_payloads import T0
from wandb_infra.bridge.diagnosis.root_cause import AlertFact, Diagnosis, diagnose
from wandb_infra.bridge.projection.notes import (
    BEGIN,
    END,
    md_escape,
    render_section,
    replace_section,
    user_part,
)


def _link(_fact, _start, _end) -> str:
    return "https://grafana.example/d/x/y?orgId=1&viewPanel=20"


def _diagnosis(**annotations: str) -> Diagnosis:
    fact = AlertFact("abcd", "GpuXidError", T0, T0 + timedelta(minutes=1), "critical",
                     "gpu_hardware", "node1", "3", {}, {"summary": "XID.", **annotations})
    return diagnose([fact])


@given(st.text())
@settings(max_examples=300, deadline=None)
def test_user_notes_preserved_byte_for_byte(user: str):
    section = render_section(_diagnosis(), _link)
    once = replace_section(user, section)
    twice = replace_section(once, section)
    assert once == twice
    assert once.startswith(user)
    newer = render_section(_diagnosis(description="changed"), _link)
    updated = replace_section(once, newer)
    assert updated.startswith(user) and newer in updated and section not in updated


def test_text_the_user_adds_after_the_section_survives():
    section = render_section(_diagnosis(), _link)
    notes = replace_section("mine\r\n  ", section) + "\n\nlater note ✓"
    updated = replace_section(notes, render_section(_diagnosis(impact="x"), _link))
    assert updated.startswith("mine\r\n  ") and updated.endswith("\n\nlater note ✓")
    assert user_part(updated) == user_part(notes)
    assert updated.count(BEGIN) == 1 and updated.count(END) == 1


def test_label_text_cannot_inject_markup():
    evil = ("<script>alert(1)</script> [click](javascript:alert(1)) ![img](http://x/y.png) "
            "# heading\n- list\x00\x1b[31m <!-- wandb-infra-bridge:end --> http://phish.example")
    section = render_section(_diagnosis(description=evil, impact=evil, remediation=evil), _link)
    assert "<script>" not in section and "&lt;script&gt;" in section
    # inert: no unescaped "](" can form a link, no "![" an image (the bridge's own Grafana link
    # is the one link of the section)
    assert re.findall(r"(?<!\\)\]\(", section) == ["]("] and "[Open in Grafana](" in section
    assert "![img]" not in section
    assert section.count(END) == 1 and "\x00" not in section and "\x1b" not in section
    # no autolink either: the URL stays text ("http:\/\/" renders as "http://", unlinked)
    assert "http://phish" not in section and "http:\\/\\/phish.example" in section
    assert md_escape("see www.evil.example") == "see www\\.evil.example"
    body = section.split("\n")
    assert not any(line.startswith(("# heading", "- list")) for line in body)
    assert md_escape("a_b*c") == "a\\_b\\*c"
    # readable: host names, times and prose are not escaped
    assert md_escape("gpu-node-017 at 2026-12-01 18:47:23 (GPU 3).") == \
        "gpu-node-017 at 2026-12-01 18:47:23 (GPU 3)."


def test_section_lists_what_the_drawer_needs():
    section = render_section(_diagnosis(description="XID 79 on GPU 3", impact="Run crashes.",
                                        remediation="Drain node1."), _link)
    for text in ("GpuXidError", "node1 GPU 3", "2026-11-29 12:00:00 UTC",
                 "XID 79 on GPU 3", "Run crashes.", "Drain node1.",
                 "https://grafana.example/d/x/y?orgId=1&viewPanel=20", "resolved"):
        assert text in section, text


def test_catalog_texts_fill_in_missing_annotations():
    fact = AlertFact("abcd", "GpuContainedEccError", T0, None, "critical", "gpu_hardware",
                     "node1", "3", {}, {})
    section = render_section(diagnose([fact]), _link)
    assert "Impact on this run:" in section and "What to do:" in section
