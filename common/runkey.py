"""A W&B run's identity: what the exporter publishes on the join metrics (entity, project and run
id labels) and what the bridge reads back from each alert, so both sides hold the same key.

A tuple, so hashing and ordering run in C: the exporter keys every placement by it on each merge,
the bridge groups an alert storm by it. The empty key stands for "unattributed" (an alert no run
could be matched to).
"""

from typing import NamedTuple


class RunKey(NamedTuple):
    """``entity/project/run_id`` of one run; every part "" when unknown."""

    entity: str = ""
    project: str = ""
    run_id: str = ""

    @property
    def attributed(self) -> bool:
        """True when all three parts are known."""
        return bool(self.entity and self.project and self.run_id)

    def path(self) -> str:
        """``entity/project/run_id`` (for logs and URLs)."""
        return f"{self.entity}/{self.project}/{self.run_id}"
