"""PgQueuer on PostgreSQL.

Settings, as its docs recommend them (guides/performance-tuning, and the drain strategy of its
own benchmark): schema by ``Queries.install()`` then ``Queries.optimize_autovacuum()``
(= ``pgq install`` and ``pgq autovac``), logged tables; the consumer gets one dedicated asyncpg
connection ("not a pool", per the docs), ``batch_size=10`` (the default, and what its benchmark
uses), no ``max_concurrent_tasks`` cap, heartbeat at its default. ``pgq run`` itself crashes in
pgqueuer 1.6 with this env's typer (its log level reaches the logger as a string), so the worker
process calls ``pgqueuer.run(factory, batch_size=10)``, the documented programmatic ``pgq run``.

Enqueue: ``queries.enqueue(entrypoint, None)``; batch: the list form of the same call (one
INSERT for the batch). Not acknowledged: the rows of the ``pgqueuer`` table (a finished job
moves to ``pgqueuer_log``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pgqueuer
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries

from benchmarks.peers._postgres import PostgresPeer
from benchmarks.workload import URL_ENV, mark_started, record_latency

NOOP, STAMP = "bench_noop", "bench_stamp"


@asynccontextmanager
async def create() -> AsyncIterator[PgQueuer]:
    """The factory the worker runs (``pgq run benchmarks.peers.pgqueuer_peer:create``)."""
    conn = await asyncpg.connect(os.environ[URL_ENV])
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint(NOOP)
    async def noop(job: Job) -> None:
        mark_started()

    @pgq.entrypoint(STAMP)
    async def stamp(job: Job) -> None:
        record_latency(float(job.payload or b"0"))

    try:
        yield pgq
    finally:
        await conn.close()


class PgQueuerPeer(PostgresPeer):
    name = "pgqueuer"
    package = "pgqueuer"
    has_batch_enqueue = True
    enqueue_settings = "await queries.enqueue(entrypoint, None), sequential; one connection"
    batch_settings = "await queries.enqueue([entrypoint] x batch, [None] x batch)"
    worker_settings = (
        "pgqueuer.run(factory, batch_size=10) (= pgq run, defaults); one asyncpg connection; "
        "schema: pgq install + pgq autovac"
    )

    async def setup(self) -> None:
        await super().setup()
        self.queries = Queries(AsyncpgDriver(self.conn))
        await self.queries.install()
        await self.queries.optimize_autovacuum()

    async def clear(self) -> None:
        await self.queries.clear_queue()
        await self.queries.clear_statistics_log()
        await self.queries.clear_queue_log()

    async def enqueue_one(self) -> None:
        await self.queries.enqueue(NOOP, None)

    async def enqueue_batch(self, n: int) -> None:
        await self.queries.enqueue([NOOP] * n, [None] * n, [0] * n)

    async def enqueue_stamped(self, enqueued: float) -> None:
        await self.queries.enqueue(STAMP, repr(enqueued).encode())

    async def pending(self) -> int:
        return int(await self.conn.fetchval("SELECT count(*) FROM pgqueuer"))

    def worker_argv(self, python: str, burst: bool = False) -> list[str]:
        return [python, "-m", "benchmarks.peers.pgqueuer_peer"]


def main() -> None:
    """The worker: what ``pgq run`` does (its documented programmatic twin), at its defaults."""
    asyncio.run(pgqueuer.run("benchmarks.peers.pgqueuer_peer:create", batch_size=10))


if __name__ == "__main__":
    main()
