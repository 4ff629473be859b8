"""What one run receives is bounded, however many distinct alerts hit it, and names
with a trailing newline are not names."""

from __future__ import annotations

from datetime import timedelta

from harness.bridge_payloads import T0
from tests.views import view_of
from wandb_infra.bridge.diagnosis.root_cause import AlertFact, diagnose
from wandb_infra.bridge.projection.notes import MAX_GROUPS, MAX_SECTION_CHARS, render_section
from wandb_infra.bridge.projection.plan import MAX_INFRA_TAGS, TAG_PREFIX, infra_tags, merged_tags
from wandb_infra.exporter.sources import valid_run_key


def _facts(n: int) -> list[AlertFact]:
    return [AlertFact(f"fp{i}", f"UserRule{i}", T0 + timedelta(seconds=i), None, "warning",
                      "workload", f"node{i}", "", {}, {"summary": "x."}) for i in range(n)]


def test_thousands_of_alert_names_give_a_bounded_tag_list_with_a_count():
    tags = infra_tags(diagnose(_facts(2000)))
    assert len(tags) == MAX_INFRA_TAGS
    assert tags[-1] == f"{TAG_PREFIX}+{2000 - MAX_INFRA_TAGS + 1} more"
    assert len(set(tags)) == len(tags)


def test_merged_tags_keep_the_users_and_stay_bounded():
    earlier = [f"{TAG_PREFIX}Old{i}" for i in range(50)] + [f"{TAG_PREFIX}+7 more"]
    merged = merged_tags(["baseline", *earlier], diagnose(_facts(5)))
    assert merged[0] == "baseline"
    ours = [t for t in merged if t.startswith(TAG_PREFIX)]
    assert len(ours) == MAX_INFRA_TAGS and f"{TAG_PREFIX}+7 more" not in ours


def test_few_alerts_are_all_tagged():
    assert len(infra_tags(diagnose(_facts(3)))) == 3


def test_run_keys_with_a_trailing_newline_are_refused():
    assert valid_run_key("acme", "llm", "run1") is not None
    assert valid_run_key("acme", "llm", "run1\n") is None
    assert valid_run_key("acme\n", "llm", "run1") is None


def test_notes_stay_bounded_with_a_count_of_what_is_left_out():
    section = render_section(view_of(diagnose(_facts(42_000))), lambda *_: "")
    assert len(section) < MAX_SECTION_CHARS + 10_000
    assert "more alert names" in section or "more issues, listed" in section


def test_one_issue_with_thousands_of_alert_names_lists_twenty_groups():
    root = AlertFact("fp-root", "GpuContainedEccError", T0, None, "critical", "gpu_hardware",
                     "node0", "3", {}, {"summary": "XID 94."})
    consequences = [AlertFact(f"fp{i}", f"UserRule{i}", T0 + timedelta(seconds=5), None,
                              "warning", "workload", "node1", "", {}, {"summary": "x."})
                    for i in range(500)]
    section = render_section(view_of(diagnose([root, *consequences])), lambda *_: "")
    assert section.count("  - **UserRule") == MAX_GROUPS
    assert f"and {500 - MAX_GROUPS} more alert names ({500 - MAX_GROUPS} alerts)" in section
