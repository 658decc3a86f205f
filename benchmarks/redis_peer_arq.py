"""Peer benchmark: one arq worker draining N no-op jobs already queued in Redis.

Standalone: arq is not a taskkit dependency. Run it from a separate virtualenv::

    python3 -m venv /tmp/peers-venv && /tmp/peers-venv/bin/pip install saq arq
    /tmp/peers-venv/bin/python benchmarks/redis_peer_arq.py \\
        --url redis://127.0.0.1:6379/15 --jobs 20000 --max-jobs 10 --poll-delay 0.5

Settings: arq's defaults (``max_jobs=10``, ``poll_delay=0.5`` s, ``queue_read_limit`` =
max(5 x max_jobs, 100), results kept 3600 s, pickle), burst mode, no signal handlers. arq reads
up to ``queue_read_limit`` ids per poll, takes each job with its own WATCH/MULTI transaction and
writes its result, each job on its own; between polls it sleeps what is left of ``poll_delay``.
``--poll-delay 0.01`` shows it tuned. The db of ``--url`` is FLUSHDB'ed first: give it a db
nothing else uses.

Timed: from the worker's start until ``after_job_end`` (called once the result is recorded) has
seen the N-th job, which is what ``benchmarks.drain`` times for taskkit (worker start to the last
acknowledgement); the burst exit that follows is printed separately.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import Worker


async def noop(ctx: dict[str, Any]) -> None:
    return None


async def drain(url: str, jobs: int, max_jobs: int, poll_delay: float, batch: int = 500) -> None:
    settings = RedisSettings.from_dsn(url)
    pool = await create_pool(settings)
    await pool.flushdb()
    t0 = time.perf_counter()
    for start in range(0, jobs, batch):
        await asyncio.gather(*(pool.enqueue_job("noop") for _ in range(min(batch, jobs - start))))
    enqueue_s = time.perf_counter() - t0
    print(f"enqueued {jobs} jobs in {enqueue_s:.2f}s ({jobs / enqueue_s:,.0f} jobs/s)")

    seen: set[str] = set()
    runs = 0
    finished = asyncio.Event()

    async def after_job_end(ctx: dict[str, Any]) -> None:
        nonlocal runs
        runs += 1
        seen.add(ctx["job_id"])
        if len(seen) == jobs:
            finished.set()

    worker = Worker(
        functions=[noop],
        redis_pool=pool,
        burst=True,
        handle_signals=False,
        max_jobs=max_jobs,
        poll_delay=poll_delay,
        after_job_end=after_job_end,
    )
    t0 = time.perf_counter()
    run = asyncio.create_task(worker.async_run())
    await finished.wait()
    elapsed = time.perf_counter() - t0
    await run
    exit_s = time.perf_counter() - t0
    left = await pool.zcard("arq:queue")
    await worker.close()
    assert len(seen) == jobs and left == 0, (len(seen), left)
    print(
        f"arq drained {jobs} no-op jobs at {jobs / elapsed:,.0f} jobs/s (max_jobs {max_jobs}, "
        f"poll_delay {poll_delay}; {elapsed:.2f}s, burst exit at {exit_s:.2f}s; "
        f"{runs - jobs} extra runs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--max-jobs", type=int, default=10)
    parser.add_argument("--poll-delay", type=float, default=0.5)
    args = parser.parse_args()
    asyncio.run(drain(args.url, args.jobs, args.max_jobs, args.poll_delay))


if __name__ == "__main__":
    main()
