"""A task that reports step progress and snoozes when its upstream is rate-limited.

    python examples/snooze_and_progress.py

The first run meets a (simulated) HTTP 429 and snoozes for a second without using an attempt;
the second run goes through both steps. The progress a task reports is readable from its handle
and from `taskkit job ID`.
"""

from __future__ import annotations

import json

import anyio

from taskkit import App, JobProgress, Router, Snooze, WorkerSettings, current_job

router = Router()
calls = 0


class RateLimited(Exception):
    retry_after = 1.0


async def call_upstream(place: str) -> dict[str, str]:
    global calls
    calls += 1
    if calls == 1:
        raise RateLimited("429 Too Many Requests")
    return {"place": place, "name": "Cafe"}


@router.task(name="places.sync", keep_result=600, max_attempts=3)
async def sync_place(place: str) -> str:
    progress = JobProgress(["fetch", "store"])
    try:
        async with progress.step("fetch"):
            data = await call_upstream(place)
    except RateLimited as exc:
        raise Snooze(exc.retry_after, "upstream rate limit") from exc
    async with progress.step("store"):
        await anyio.sleep(0.01)
    return f"stored {data['name']} on attempt {current_job().attempt}"


async def main() -> None:
    async with App(router, "sqlite:///progress_example.db") as app:
        handle = await app.enqueue(sync_place, "p-1")
        async with anyio.create_task_group() as tg:
            worker = app.worker(WorkerSettings(poll_wait=0.1))
            tg.start_soon(worker.run)
            print("result:", await handle.result(timeout=30))
            worker.stop()
        info = await handle.info()
        assert info is not None and info.progress is not None
        print("progress:", json.loads(info.progress))


if __name__ == "__main__":
    anyio.run(main)
