"""Drain rate: N no-op jobs already queued, one worker, time from worker start to the last ack.

    python -m benchmarks.drain --broker sqlite:///bench.db --jobs 20000 [--concurrency 50]

The queue is emptied first. The worker runs in burst mode in this process; the time covers claim,
run and settle of every job (the burst exit check is one extra stats call at the end).
"""

from __future__ import annotations

import argparse
import time

import anyio

from taskkit import App, Job, Router, WorkerSettings

router = Router()


@router.task(name="bench.noop")
async def noop() -> None:
    return None


async def drain(url: str, jobs: int, concurrency: int, batch: int = 1000) -> float:
    async with App(router, url) as app:
        await app.broker.purge_dead(None, None)
        t0 = time.perf_counter()
        for start in range(0, jobs, batch):
            await app.enqueue_jobs(
                [Job(task="bench.noop") for _ in range(min(batch, jobs - start))]
            )
        enqueue_s = time.perf_counter() - t0
        rate = jobs / enqueue_s
        print(f"enqueued {jobs} jobs in {enqueue_s:.2f}s ({rate:,.0f} jobs/s, batches of {batch})")
        worker = app.worker(WorkerSettings(burst=True, concurrency=concurrency, poll_wait=0.05))
        t0 = time.perf_counter()
        await worker.run()
        elapsed = time.perf_counter() - t0
        assert worker.processed == jobs, (worker.processed, jobs)
        return jobs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="sqlite:///bench.db")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    rate = anyio.run(drain, args.broker, args.jobs, args.concurrency)
    print(f"drained {args.jobs} no-op jobs at {rate:,.0f} jobs/s ({args.broker})")


if __name__ == "__main__":
    main()
