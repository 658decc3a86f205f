"""What a running task can see and say: its job's context, progress, ``Snooze`` and ``Retry``.

    from taskkit import JobProgress, Retry, Snooze, current_job

    @router.task
    async def sync_listing(place_id: str) -> None:
        job = current_job()                     # id, task, queue, attempt, max_attempts
        progress = JobProgress(["fetch", "store"])
        try:
            async with progress.step("fetch"):
                data = await call_upstream(place_id)
        except RateLimited as exc:              # HTTP 429: come back later, attempts untouched
            raise Snooze(exc.retry_after) from exc
        except Flaky as exc:                    # fail this attempt, retry in 30 s
            raise Retry(30) from exc
        async with progress.step("store"):
            await save(data)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import anyio.from_thread

from taskkit.errors import LeaseLost, TaskkitError


@dataclass(frozen=True, slots=True)
class JobContext:
    """The job a task is running for."""

    id: str
    task: str
    queue: str
    attempt: int  # 1 on the first run
    max_attempts: int
    worker_id: str
    write_progress: Callable[[str], Awaitable[bool]] | None = field(
        default=None, repr=False, compare=False
    )


_current: ContextVar[JobContext | None] = ContextVar("taskkit_current_job", default=None)


def current_job() -> JobContext:
    """The running job's context. Raises outside a task run by a worker."""
    ctx = _current.get()
    if ctx is None:
        raise TaskkitError("current_job() is only available inside a task run by a worker")
    return ctx


async def report_progress(data: Any) -> bool:
    """Store ``data`` (JSON-serialisable) as the running job's progress, readable from its
    handle and ``taskkit job ID``. Returns False when this worker no longer owns the job."""
    ctx = current_job()
    if ctx.write_progress is None:
        return False
    return await ctx.write_progress(json.dumps(data))


class JobProgress:
    """Seed 003's step tracker: named steps that are pending, running, done or failed, written
    as the job's progress. A new attempt starts from all pending. When this worker has lost the
    job, the next write raises LeaseLost so the stale run stops.

    Use ``async with progress.step(name)`` in async tasks, ``with progress.step_sync(name)`` in
    plain ones (which run in worker threads)."""

    def __init__(self, steps: Sequence[str]) -> None:
        self.steps = {name: "pending" for name in steps}

    def snapshot(self) -> dict[str, Any]:
        return {
            "attempt": current_job().attempt,
            "steps": [{"name": n, "status": s} for n, s in self.steps.items()],
        }

    async def _write(self) -> None:
        if not await report_progress(self.snapshot()):
            raise LeaseLost(f"job {current_job().id}: another worker owns it now")

    @asynccontextmanager
    async def step(self, name: str) -> AsyncIterator[None]:
        self.steps[name] = "running"
        await self._write()
        try:
            yield
        except BaseException:
            self.steps[name] = "failed"
            with anyio.CancelScope(shield=True):
                await self._write()
            raise
        self.steps[name] = "done"
        await self._write()

    @contextmanager
    def step_sync(self, name: str) -> Iterator[None]:
        self.steps[name] = "running"
        anyio.from_thread.run(self._write)
        try:
            yield
        except BaseException:
            self.steps[name] = "failed"
            anyio.from_thread.run(self._write)
            raise
        self.steps[name] = "done"
        anyio.from_thread.run(self._write)


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
