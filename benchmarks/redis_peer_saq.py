"""Peer benchmark: one SAQ worker draining N no-op jobs already queued in Redis.

Standalone: SAQ is not a taskkit dependency. Run it from a separate virtualenv::

    python3 -m venv /tmp/peers-venv && /tmp/peers-venv/bin/pip install saq arq
    /tmp/peers-venv/bin/python benchmarks/redis_peer_saq.py \\
        --url redis://127.0.0.1:6379/15 --jobs 20000 --concurrency 10

Settings: SAQ's defaults (``Worker(concurrency=10)`` is its documented default; ``--concurrency``
changes it), one ``RedisQueue`` named ``bench`` on the given db, burst mode with
``dequeue_timeout=0.05`` (burst requires a positive one; it only matters once the queue is empty).
SAQ dequeues one job per BLMOVE and writes its status before and after the run, each job on its
own. The db of ``--url`` is FLUSHDB'ed first: give it a db nothing else uses.

Timed: from ``worker.start()`` until the after-process hook has seen the N-th job (its completion
already written), which is what ``benchmarks.drain`` times for taskkit (worker start to the last
acknowledgement); the burst exit that follows is printed separately.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from redis.asyncio import Redis
from saq import Queue, Worker
from saq.types import Context


async def noop(ctx: Context) -> None:
    return None


async def drain(url: str, jobs: int, concurrency: int, batch: int = 500) -> None:
    flush: Redis = Redis.from_url(url)
    await flush.flushdb()
    await flush.aclose()
    queue = Queue.from_url(url, name="bench")
    await queue.connect()
    t0 = time.perf_counter()
    for start in range(0, jobs, batch):
        await asyncio.gather(*(queue.enqueue("noop") for _ in range(min(batch, jobs - start))))
    enqueue_s = time.perf_counter() - t0
    print(f"enqueued {jobs} jobs in {enqueue_s:.2f}s ({jobs / enqueue_s:,.0f} jobs/s)")

    seen: set[str] = set()
    runs = 0
    finished = asyncio.Event()

    async def after_process(ctx: Context) -> None:
        nonlocal runs
        runs += 1
        seen.add(ctx["job"].id)
        if len(seen) == jobs:
            finished.set()

    worker = Worker(
        queue,
        functions=[noop],
        concurrency=concurrency,
        after_process=after_process,
        burst=True,
        dequeue_timeout=0.05,
    )
    t0 = time.perf_counter()
    run = asyncio.create_task(worker.start())
    await finished.wait()
    elapsed = time.perf_counter() - t0
    await run
    exit_s = time.perf_counter() - t0
    await worker.stop()
    left = await queue.count("queued")
    await queue.disconnect()
    assert len(seen) == jobs and left == 0, (len(seen), left)
    print(
        f"saq drained {jobs} no-op jobs at {jobs / elapsed:,.0f} jobs/s "
        f"(concurrency {concurrency}; {elapsed:.2f}s, burst exit at {exit_s:.2f}s; "
        f"{runs - jobs} extra runs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(drain(args.url, args.jobs, args.concurrency))


if __name__ == "__main__":
    main()
