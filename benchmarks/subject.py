"""taskkit as a measured system, on any of its brokers.

Isolation: SQLite gets the file named in the URL (removed before and after); Redis gets the key
prefix ``tkbench`` unless the URL names one (its keys are deleted, nothing else in that db is
touched); PostgreSQL gets the schema ``taskkit_bench`` unless the URL names one (dropped and
migrated afresh before each run, dropped at the end).

The worker is the real CLI, ``taskkit worker benchmarks.taskkit_tasks:router``, one process, at
its default concurrency (10) unless ``--concurrency`` says otherwise, logging at WARNING (at
INFO it writes a line per job, which no peer does by default either).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

from benchmarks.system import System, kind_of
from benchmarks.taskkit_tasks import noop, stamp
from taskkit import App, broker_from_url

REDIS_PREFIX = "tkbench"
PG_SCHEMA = "taskkit_bench"


def normalise_url(url: str) -> str:
    """Give the URL its isolation (prefix, schema) and make a SQLite path absolute, so the
    worker subprocesses, started in the repo root, open the same file."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    kind = kind_of(url)
    if kind == "sqlite":
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        return f"sqlite:///{Path(path).resolve()}" + (f"?{parts.query}" if parts.query else "")
    if kind == "redis":
        query.setdefault("prefix", REDIS_PREFIX)
    elif kind == "postgresql":
        query.setdefault("schema", PG_SCHEMA)
    return parts._replace(query=urlencode(query)).geturl()


class Taskkit(System):
    name = "taskkit"
    package = "taskkit"
    has_batch_enqueue = True
    enqueue_settings = "await app.enqueue(noop), sequential"
    batch_settings = "await app.enqueue_many([noop.call() x batch])"

    def __init__(self, url: str, concurrency: int = 10) -> None:
        super().__init__(normalise_url(url))
        self.kind = kind_of(url)
        self.concurrency = concurrency
        self.worker_settings = (
            f"taskkit worker --concurrency {concurrency} (CLI default 10) --log-level WARNING"
        )
        self.drain_settings = f"{self.worker_settings} --burst"
        self.app: App | None = None

    async def setup(self) -> None:
        await self.clear()

    async def clear(self) -> None:
        # Reconnect around the wipe: a dropped PG schema invalidates the pool's prepared
        # statements, and a removed SQLite file must be reopened.
        await self._disconnect()
        await self._wipe()
        self.app = App(None, self.url)
        if self.kind == "postgresql":
            await self.app.broker.migrate()  # type: ignore[attr-defined]
        await self.app.__aenter__()

    async def teardown(self) -> None:
        await self._disconnect()
        await self._wipe()

    async def _disconnect(self) -> None:
        if self.app is not None:
            app, self.app = self.app, None
            await app.__aexit__(None, None, None)

    async def _wipe(self) -> None:
        parts = urlsplit(self.url)
        query = dict(parse_qsl(parts.query))
        if self.kind == "sqlite":
            path = Path(parts.path[1:])
            for suffix in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(FileNotFoundError):
                    Path(f"{path}{suffix}").unlink()
        elif self.kind == "redis":
            from redis.asyncio import Redis

            client = Redis.from_url(parts._replace(query="").geturl())
            try:
                keys = [k async for k in client.scan_iter(match=f"{query['prefix']}:*", count=1000)]
                for start in range(0, len(keys), 1000):
                    await client.delete(*keys[start : start + 1000])
            finally:
                await client.aclose()
        elif self.kind == "postgresql":
            import asyncpg

            conn = await asyncpg.connect(parts._replace(query="").geturl())
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{query["schema"]}" CASCADE')
            finally:
                await conn.close()

    @property
    def _app(self) -> App:
        assert self.app is not None, "setup() first"
        return self.app

    async def enqueue_one(self) -> None:
        await self._app.enqueue(noop)

    async def enqueue_batch(self, n: int) -> None:
        await self._app.enqueue_many([noop.call() for _ in range(n)])

    async def enqueue_stamped(self, enqueued: float) -> None:
        await self._app.enqueue(stamp, enqueued)

    async def pending(self) -> int:
        stats = await self._app.broker.stats(time.time())
        return sum(s.ready + s.scheduled + s.running for s in stats.values())

    def worker_argv(self, python: str, burst: bool = False) -> list[str]:
        argv = [python, "-m", "taskkit.cli", "worker", "benchmarks.taskkit_tasks:router"]
        argv += ["--broker", self.url, "--concurrency", str(self.concurrency)]
        argv += ["--log-level", "WARNING"]
        return [*argv, "--burst"] if burst else argv


def check_broker(url: str) -> str | None:
    """None if taskkit can open this broker here, else why not (a broker class under change
    may not instantiate)."""
    try:
        broker_from_url(normalise_url(url))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
