"""What the runners need from a measured system (taskkit or a peer), in one interface.

A system lives in the benchmark process (its producer client, used to enqueue and to look at the
queue) and in worker subprocesses it describes with ``worker_argv``. Every method is async; the
peers whose client is synchronous (Huey, Dramatiq, Celery) block the loop, which is what a
sequential producer does anyway.
"""

from __future__ import annotations

import importlib.metadata
from abc import ABC, abstractmethod
from collections.abc import Mapping
from urllib.parse import urlsplit


class Unavailable(Exception):
    """The system cannot run here (package not installed, wrong broker): skip it, say why."""


class System(ABC):
    name: str  # as in the table: "taskkit", "celery", ...
    package: str  # the distribution whose version is reported
    kind: str  # "redis", "postgresql" or "sqlite": the server it runs on
    has_batch_enqueue = False
    # Settings per measurement, shown next to each figure.
    enqueue_settings = ""
    batch_settings = ""
    worker_settings = ""  # one worker process serving jobs as they come
    drain_settings = ""  # the same worker in the drain, when it differs (a burst flag)

    def __init__(self, url: str) -> None:
        self.url = url

    @property
    def version(self) -> str:
        try:
            return importlib.metadata.version(self.package)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    # -- lifecycle ---------------------------------------------------------------------------

    @abstractmethod
    async def setup(self) -> None:
        """Connect, create this system's own space (db number, schema, database), empty it."""

    @abstractmethod
    async def clear(self) -> None:
        """Drop every job, so the next run starts from an empty queue."""

    @abstractmethod
    async def teardown(self) -> None:
        """Remove what setup created and disconnect."""

    # -- producing ---------------------------------------------------------------------------

    @abstractmethod
    async def enqueue_one(self) -> None:
        """Enqueue one no-op job with one call of the system's ordinary API."""

    async def enqueue_batch(self, n: int) -> None:
        """Enqueue ``n`` no-op jobs with the system's bulk API (one call)."""
        raise Unavailable(f"{self.name} has no bulk enqueue API")

    async def prefill(self, n: int, batch: int) -> None:
        """Queue ``n`` no-op jobs as fast as the system allows (not timed)."""
        if self.has_batch_enqueue:
            for start in range(0, n, batch):
                await self.enqueue_batch(min(batch, n - start))
        else:
            for _ in range(n):
                await self.enqueue_one()

    @abstractmethod
    async def enqueue_stamped(self, enqueued: float) -> None:
        """Enqueue one job of the latency task, carrying its enqueue time."""

    # -- observing ---------------------------------------------------------------------------

    @abstractmethod
    async def pending(self) -> int:
        """Jobs not yet acknowledged (queued, reserved or running): one cheap query."""

    # -- the worker --------------------------------------------------------------------------

    @abstractmethod
    def worker_argv(self, python: str, burst: bool = False) -> list[str]:
        """The command of one worker process (``python``: this interpreter). ``burst``: the
        drain asks a system that can exit once the queue is empty to do so."""

    def worker_env(self) -> Mapping[str, str]:
        return {}


def with_db(url: str, db: int) -> str:
    """The Redis URL of the same server with another db number."""
    parts = urlsplit(url)
    return parts._replace(path=f"/{db}", query="").geturl()


def with_database(url: str, database: str) -> str:
    """The PostgreSQL URL of the same server with another database."""
    parts = urlsplit(url)
    return parts._replace(path=f"/{database}", query="").geturl()


def kind_of(url: str) -> str:
    scheme = urlsplit(url).scheme
    if scheme in ("postgres", "postgresql"):
        return "postgresql"
    if scheme in ("redis", "rediss"):
        return "redis"
    return scheme
