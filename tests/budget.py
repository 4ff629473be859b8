"""How hard the property-based tests search.

``make test`` runs every search in full. ``make test-fast``, the developer's loop, sets
``WANDB_INFRA_TEST_FAST=1`` and runs a tenth of each: the same properties, checked on fewer
generated inputs, so a change that breaks one is still likely to be caught before the full run.
"""

from __future__ import annotations

import os

FAST = os.environ.get("WANDB_INFRA_TEST_FAST") == "1"


def examples(full: int) -> int:
    """Hypothesis' ``max_examples`` for a search worth ``full`` examples in the full run."""
    return max(20, full // 10) if FAST else full
