"""What a running task can see and say: its job's context, ``Snooze`` and ``Retry``.

from taskkit import Retry, Snooze, current_job

@router.task
async def sync_listing(place_id: str) -> None:
    job = current_job()                     # id, task, queue, attempt, max_attempts
    try:
        await call_upstream(place_id)
    except RateLimited as exc:              # HTTP 429: come back later, attempts untouched
        raise Snooze(exc.retry_after) from exc
    except Flaky as exc:                    # fail this attempt, retry in 30 s
        raise Retry(30) from exc
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from taskkit.errors import TaskkitError


@dataclass(frozen=True, slots=True)
class JobContext:
    """The job a task is running for."""

    id: str
    task: str
    queue: str
    attempt: int  # 1 on the first run
    max_attempts: int
    worker_id: str


_current: ContextVar[JobContext | None] = ContextVar("taskkit_current_job", default=None)


def current_job() -> JobContext:
    """The running job's context. Raises outside a task run by a worker."""
    ctx = _current.get()
    if ctx is None:
        raise TaskkitError("current_job() is only available inside a task run by a worker")
    return ctx


class Snooze(Exception):
    """Run the job again in ``seconds`` without using an attempt (an upstream said 429)."""

    def __init__(self, seconds: float, reason: str | None = None) -> None:
        super().__init__(reason or f"snoozed for {seconds}s")
        self.seconds = max(0.0, float(seconds))
        self.reason = reason


class Retry(Exception):
    """Fail this attempt and retry in ``seconds`` instead of the backoff. The attempt counts;
    when none are left the job goes dead like any failure."""

    def __init__(self, seconds: float, reason: str | None = None) -> None:
        super().__init__(reason or f"retry requested in {seconds}s")
        self.seconds = max(0.0, float(seconds))
        self.reason = reason
