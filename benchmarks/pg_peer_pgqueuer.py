"""Drain rate of PgQueuer, the peer of ``benchmarks/drain.py`` on PostgreSQL: N no-op jobs
already queued, one consumer process, time from the consumer's start until the queue is empty.

    python benchmarks/pg_peer_pgqueuer.py postgresql://postgres@127.0.0.1:5432/pgq_bench 20000

PgQueuer is not a taskkit dependency: run this with a separate virtualenv, never the project's::

    python3 -m venv /tmp/pgq-venv && /tmp/pgq-venv/bin/pip install pgqueuer asyncpg
    createdb -h 127.0.0.1 -U postgres pgq_bench
    /tmp/pgq-venv/bin/python benchmarks/pg_peer_pgqueuer.py DSN 20000 [--batch-size 10]
                                                                      [--managers 1]

Give it a database (or a ``PGQUEUER_PREFIX``) of its own: the first run installs PgQueuer's
tables there, and every run empties its queue and statistics first.

Settings, as PgQueuer's documentation recommends them (guides/performance-tuning.md, and the
drain strategy of its own tools/benchmark.py):

- schema: ``Queries.install()`` then ``Queries.optimize_autovacuum()`` (= ``pgq install`` and
  ``pgq autovac``); durability left at the default ``durable`` (logged tables, as taskkit's).
- consumer: ``PgQueuer`` on a dedicated asyncpg connection (``AsyncpgDriver``), "not a pool",
  per the docs; ``run(mode=drain, batch_size=10)``: 10 is the default and the value its own
  benchmark uses (the docs suggest raising it for short jobs: try ``--batch-size 25``); no
  ``max_concurrent_tasks`` cap; heartbeat and log aggregation at their defaults.
- ``--managers N`` runs N QueueManagers, each on its own connection, in this one process (its
  benchmark's default is 5); the default 1 is the setup the quick start shows.
- the job: one async no-op entrypoint; jobs are enqueued before timing, 1000 per statement
  (as benchmarks/drain.py does).

Prints the enqueue rate, then the drain rate in jobs/s.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

ENTRYPOINT = "bench_noop"
ENQUEUE_BATCH = 1000


async def prepare(dsn: str, jobs: int) -> None:
    """Install PgQueuer if needed, empty it, and queue ``jobs`` no-op jobs."""
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        if not await queries.schema_is_installed():
            await queries.install()
            await queries.optimize_autovacuum()
        await queries.clear_queue()
        await queries.clear_statistics_log()
        await queries.clear_queue_log()
        t0 = time.perf_counter()
        for start in range(0, jobs, ENQUEUE_BATCH):
            n = min(ENQUEUE_BATCH, jobs - start)
            await queries.enqueue([ENTRYPOINT] * n, [None] * n, [0] * n)
        took = time.perf_counter() - t0
        print(f"enqueued {jobs} jobs in {took:.2f}s ({jobs / took:,.0f} jobs/s, "
              f"batches of {ENQUEUE_BATCH})")
    finally:
        await conn.close()


async def drain(dsn: str, jobs: int, batch_size: int, managers: int) -> float:
    """Run ``managers`` QueueManagers in drain mode until the queue is empty; jobs/s."""
    done = 0
    conns = [await asyncpg.connect(dsn) for _ in range(managers)]
    consumers = [PgQueuer(AsyncpgDriver(conn)) for conn in conns]
    for pgq in consumers:

        @pgq.entrypoint(ENTRYPOINT)
        async def noop(job: Job) -> None:
            nonlocal done
            done += 1

    try:
        t0 = time.perf_counter()
        await asyncio.gather(
            *(pgq.run(batch_size=batch_size, mode=QueueExecutionMode.drain) for pgq in consumers)
        )
        elapsed = time.perf_counter() - t0
    finally:
        for conn in conns:
            await conn.close()
    assert done == jobs, (done, jobs)
    return jobs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("dsn", help="PostgreSQL DSN of a database PgQueuer may own")
    parser.add_argument("jobs", type=int, nargs="?", default=20_000)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--managers", type=int, default=1)
    args = parser.parse_args()
    asyncio.run(prepare(args.dsn, args.jobs))
    rate = asyncio.run(drain(args.dsn, args.jobs, args.batch_size, args.managers))
    print(f"drained {args.jobs} no-op jobs at {rate:,.0f} jobs/s (PgQueuer, batch_size="
          f"{args.batch_size}, {args.managers} QueueManager(s), one process)")


if __name__ == "__main__":
    main()
