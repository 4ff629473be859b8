"""The mutation checks of ``tests/mutants.py`` stay current: each still applies to the code."""

from __future__ import annotations

import pytest

from tests.mutants import MUTANTS, ROOT, apply


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_every_mutant_applies_once_and_names_existing_tests(mutant):
    assert apply(mutant) != (ROOT / mutant.path).read_text()
    assert mutant.tests and all((ROOT / t.split("::")[0]).is_file() for t in mutant.tests)


def test_mutant_names_are_unique():
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
