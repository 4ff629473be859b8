"""A clock the test moves by hand, for the components that take a ``clock`` callable (the
delivery worker, placements, page sessions): time-dependent behaviour without sleeping."""

from __future__ import annotations


class ManualClock:
    """Returns ``now``; the test sets or advances it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
