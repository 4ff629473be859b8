"""README.md as a new user reads it: at most 20 KB, a quick start of exactly ``make demo`` and
``make test``, and a sample that is what the demo printed: scenario 1's run as the bridge
rendered it to text in a run of ``make demo``, which saved it (tests/data/demo/scenario1.view.txt,
see tests/data/README.md). Every relative link in the README and docs/ resolves to a
file in the repository, and no page uses development-log wording."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
VIEW = ROOT / "tests" / "data" / "demo" / "scenario1.view.txt"
BEGIN, END = "<!-- demo-sample: begin -->", "<!-- demo-sample: end -->"
MAX_BYTES = 20 * 1024


def sample_block() -> str:
    """The README's sample block: the saved text of the run."""
    return f"{BEGIN}\n```\n{VIEW.read_text().rstrip()}\n```\n{END}"


def test_the_readme_is_at_most_20_kb():
    assert len(README.read_bytes()) <= MAX_BYTES, len(README.read_bytes())


def test_the_quick_start_is_make_demo_and_make_test():
    text = README.read_text()
    quick = text[text.index("## Quick start"):]
    block = re.search(r"```\n(.*?)```", quick, re.S)
    assert block and block.group(1).split("\n") == ["make demo", "make test", ""]


def test_the_sample_is_what_the_demo_printed():
    text = README.read_text()
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:stop] == sample_block(), "run: python -m tests.test_readme"
    view = VIEW.read_text()
    assert view.startswith("Run demo/llm-pretrain/cascade64: ") and \
        "ROOT CAUSE  GpuContainedEccError on gpu-node-017 GPU 3" in view


def _pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_resolves_inside_the_repository():
    broken = []
    for page in _pages():
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


@pytest.mark.integration
def test_no_development_log_wording_in_the_project():
    found = subprocess.run(["git", "grep", "-nIE", r"[Ii]ssues? #?[0-9]{2,}\b|\bround (one|two|"
                            r"three|four|five)\b", "--", ".", ":!tests/data"],
                           cwd=ROOT, capture_output=True, text=True, check=False).stdout
    assert found == ""


def main() -> None:
    """Rewrite the README's sample block from the saved text."""
    text = README.read_text()
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    README.write_text(text[:start] + sample_block() + text[stop:])


if __name__ == "__main__":
    main()
