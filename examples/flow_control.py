"""Flow control: a rate limit, a fleet-wide concurrency limit and priorities.

    python examples/flow_control.py

`geo.lookup` may run 5 times a second across every worker, `render.video` at most twice at once
across every worker, and in the `render` queue a priority-9 job is claimed before priority-0 ones.
Jobs over a limit wait (snoozed, no attempt used); two workers share the limits through the
SQLite file, as worker processes on one machine would.
"""

from __future__ import annotations

import time

import anyio

from taskkit import App, Router, WorkerSettings

router = Router()
started: dict[str, float] = {}
running = peak = 0


@router.task(name="geo.lookup", rate_limit="5/s")
async def lookup(n: int) -> None:
    started[f"lookup {n}"] = time.monotonic()


@router.task(name="render.video", queue="render", concurrency=2)
async def render(name: str) -> None:
    global running, peak
    started[f"render {name}"] = time.monotonic()
    running += 1
    peak = max(peak, running)
    await anyio.sleep(0.3)
    running -= 1


async def main() -> None:
    async with App(router, "sqlite:///flow_example.db") as app:
        await app.enqueue_many([lookup.call(n) for n in range(10)])
        await app.enqueue_many([render.call(f"clip-{n}") for n in range(4)])
        await app.enqueue(render.options(priority=9), "urgent")
        t0 = time.monotonic()
        async with anyio.create_task_group() as tg:
            workers = [app.worker(WorkerSettings(poll_wait=0.05)) for _ in range(2)]
            for worker in workers:
                tg.start_soon(worker.run)
            while len(started) < 15:
                await anyio.sleep(0.05)
            await anyio.sleep(0.4)  # let the last renders finish
            for worker in workers:
                worker.stop()
    lookups = sorted(t for name, t in started.items() if name.startswith("lookup"))
    print(f"10 lookups took {lookups[-1] - lookups[0]:.2f}s (5/s: at least 1.8s)")
    print(f"renders running at once, at most: {peak} (limit 2)")
    first = min((t, name) for name, t in started.items() if name.startswith("render"))[1]
    print(f"first render: {first} (priority 9)")
    print(f"all done in {time.monotonic() - t0:.2f}s")


if __name__ == "__main__":
    anyio.run(main)
