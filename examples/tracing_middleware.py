"""Middleware: wrap every job run in a tracing span (a stand-in for OpenTelemetry).

    python examples/tracing_middleware.py

Hooks are plain, quick functions; keep per-job state keyed by job id.
"""

from __future__ import annotations

import time

import anyio

from taskkit import App, Router, WorkerSettings
from taskkit.middleware import JobEvent, Middleware


class TracingMiddleware(Middleware):
    def __init__(self) -> None:
        self.open: dict[str, float] = {}

    def before_run(self, event: JobEvent) -> None:
        self.open[event.job_id] = time.perf_counter()
        print(f"span start  task={event.task} job={event.job_id} attempt={event.attempt}")

    def after_run(self, event: JobEvent) -> None:
        started = self.open.pop(event.job_id, None)
        elapsed = (time.perf_counter() - started) * 1000 if started else float("nan")
        print(f"span end    task={event.task} job={event.job_id} {elapsed:.2f} ms")

    def on_dead(self, event: JobEvent) -> None:
        print(f"span error  task={event.task} job={event.job_id}: {event.error}")


router = Router()
router.use(TracingMiddleware())


@router.task(name="demo.ok")
async def ok() -> None:
    await anyio.sleep(0.01)


@router.task(name="demo.broken", max_attempts=1)
async def broken() -> None:
    raise RuntimeError("this one fails")


async def main() -> None:
    async with App(router, "sqlite:///tracing_example.db") as app:
        await app.enqueue(ok)
        await app.enqueue(broken)
        await app.worker(WorkerSettings(burst=True, poll_wait=0.1)).run()


if __name__ == "__main__":
    anyio.run(main)
