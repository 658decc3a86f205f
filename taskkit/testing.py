"""Helpers for testing code that uses taskkit: a clock you move by hand.

Pass ``FakeClock`` to a ``Worker`` or ``App`` and call ``advance`` instead of sleeping.
"""

from __future__ import annotations


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` and return the new time."""
        self._now += seconds
        return self._now

    def set(self, when: float) -> None:
        self._now = when
