"""Procrastinate on PostgreSQL (psycopg 3).

Settings: ``App(connector=PsycopgConnector(conninfo=url))``, schema by
``schema_manager.apply_schema_async()`` (= ``procrastinate schema --apply``); ``procrastinate
worker`` at its defaults (``--concurrency 1``, LISTEN/NOTIFY on, finished jobs kept:
``--delete-jobs never``) with ``--log-level warning`` (INFO logs every job). Enqueue:
``await noop.defer_async()``; batch: ``await noop.batch_defer_async(*[{}] x batch)`` (one
statement). Not acknowledged: jobs in state ``todo`` or ``doing``.
"""

from __future__ import annotations

import os

from procrastinate import App, PsycopgConnector

from benchmarks.peers._postgres import PostgresPeer
from benchmarks.workload import URL_ENV, mark_started, record_latency


def build(url: str) -> App:
    app = App(connector=PsycopgConnector(conninfo=url))

    @app.task(name="bench.noop")
    async def noop() -> None:
        mark_started()

    @app.task(name="bench.stamp")
    async def stamp(enqueued: float) -> None:
        record_latency(enqueued)

    return app


# What `procrastinate --app benchmarks.peers.procrastinate_peer.app worker` serves.
app = build(os.environ.get(URL_ENV, "postgresql://postgres@127.0.0.1:5432/postgres"))


class ProcrastinatePeer(PostgresPeer):
    name = "procrastinate"
    package = "procrastinate"
    has_batch_enqueue = True
    enqueue_settings = "await noop.defer_async(), sequential; PsycopgConnector pool"
    batch_settings = "await noop.batch_defer_async(*[{}] x batch)"
    worker_settings = (
        "procrastinate worker, defaults: --concurrency 1, listen-notify on, jobs kept; "
        "--log-level warning"
    )

    async def setup(self) -> None:
        await super().setup()
        self.app = build(self.url)
        await self.app.open_async()
        await self.app.schema_manager.apply_schema_async()
        self.noop = self.app.tasks["bench.noop"]
        self.stamp = self.app.tasks["bench.stamp"]

    async def clear(self) -> None:
        await self.conn.execute("TRUNCATE procrastinate_jobs CASCADE")

    async def teardown(self) -> None:
        await self.app.close_async()
        await super().teardown()

    async def enqueue_one(self) -> None:
        await self.noop.defer_async()

    async def enqueue_batch(self, n: int) -> None:
        await self.noop.batch_defer_async(*({} for _ in range(n)))

    async def enqueue_stamped(self, enqueued: float) -> None:
        await self.stamp.defer_async(enqueued=enqueued)

    async def pending(self) -> int:
        return int(
            await self.conn.fetchval(
                "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
            )
        )

    def worker_argv(self, python: str, burst: bool = False) -> list[str]:
        return [
            python,
            "-m",
            "procrastinate",
            "--app",
            "benchmarks.peers.procrastinate_peer.app",
            "--log-level",
            "warning",
            "worker",
        ]
