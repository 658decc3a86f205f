"""The decisions the core hands to a broker when it settles a job.

The worker and ``taskkit.retry`` decide; a broker only applies the frozen value it is given,
and only while the lease token still owns the job.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Complete:
    """The handler returned. ``result`` is JSON text to keep until ``keep_until``, or None."""

    result: str | None = None
    keep_until: float | None = None


@dataclass(frozen=True, slots=True)
class Retry:
    """Put the job back, runnable at ``run_at``, recording ``error``.

    ``charge_attempt=False`` gives back the attempt the claim charged (a snooze, or a reclaim
    decision that must not count twice).
    """

    run_at: float
    error: str | None
    charge_attempt: bool = True


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Move the job to the dead letters with ``error`` (type, message and traceback)."""

    error: str


Outcome = Complete | Retry | DeadLetter
