"""App: a router plus a broker, and the producer API (enqueue, job status, results).

    app = App(router, "sqlite:///taskkit.db")
    async with app:
        handle = await app.enqueue(add, 2, 3)          # type-checked against add(a, b)
        print(await handle.result(timeout=10))

``SyncApp`` offers the same calls to code without an event loop.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Generic, ParamSpec, Self, TypeVar, cast

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal

from taskkit.broker import Broker, broker_from_url
from taskkit.clock import Clock, SystemClock
from taskkit.errors import ConfigurationError, JobDead, ResultTimeout
from taskkit.job import Job, JobInfo, JobState
from taskkit.middleware import Hooks
from taskkit.router import Router
from taskkit.task import Task, TaskCall
from taskkit.worker import Worker, WorkerSettings

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

CANCELLED_RETENTION = 86_400.0  # seconds a cancelled job stays readable


class App:
    """The producer's entry point. ``broker`` is a Broker or a URL (``None``: resolved from
    ``TASKKIT_BROKER_URL``, else ``sqlite:///taskkit.db``). Use as ``async with app:``."""

    def __init__(
        self,
        router: Router | None = None,
        broker: Broker | str | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.router = router or Router()
        self.broker = broker if isinstance(broker, Broker) else broker_from_url(broker)
        self.clock: Clock = clock or SystemClock()

    def __repr__(self) -> str:
        return f"<App {self.broker!r} tasks={len(self.router)}>"

    async def __aenter__(self) -> Self:
        await self.broker.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.broker.close()

    # -- producing -----------------------------------------------------------------------------

    async def enqueue(self, task: Task[P, R], /, *args: P.args, **kwargs: P.kwargs) -> JobHandle[R]:
        """Enqueue one call of ``task``. Arguments are validated against its signature first
        (ArgumentsInvalid, nothing stored). Per-call options: ``task.options(delay=...)``."""
        job = task.build_job(args, kwargs, self.clock.now())
        [job_id] = await self._store([job])
        return JobHandle(self, job_id)

    async def enqueue_many(self, calls: Sequence[TaskCall[R]]) -> list[JobHandle[R]]:
        """Enqueue many calls in one broker round trip: ``[add.call(1, 2), add.call(3, 4)]``.
        Every call is validated first; if one is refused, nothing is stored."""
        now = self.clock.now()
        jobs = [c.build_job(now) for c in calls]
        return [JobHandle(self, i) for i in await self._store(jobs)]

    async def enqueue_jobs(self, jobs: Sequence[Job]) -> list[JobHandle[Any]]:
        """Store prepared jobs in one broker round trip."""
        return [JobHandle(self, i) for i in await self._store(jobs)]

    async def _store(self, jobs: Sequence[Job]) -> list[str]:
        hooks = Hooks(self.router.middleware)
        hooks.call("before_enqueue", jobs)
        ids = await self.broker.enqueue(jobs, self.clock.now())
        hooks.call("after_enqueue", jobs, ids)
        return ids

    # -- reading ---------------------------------------------------------------------------------

    async def job(self, job_id: str) -> JobInfo | None:
        """The job's state, or None when the broker keeps nothing of it (done, result not kept)."""
        return await self.broker.get_job(job_id, self.clock.now())

    async def cancel(self, job_id: str) -> JobState | None:
        """Cancel a pending or scheduled job. Returns CANCELLED when it is cancelled; RUNNING,
        DONE or DEAD when it could not be (a running job is not interrupted); None when no such
        job is known. A cancelled job stays readable for a day."""
        now = self.clock.now()
        return await self.broker.cancel(job_id, now + CANCELLED_RETENTION, now)

    # -- consuming -------------------------------------------------------------------------------

    def worker(self, settings: WorkerSettings | None = None) -> Worker:
        """A worker for this app's router and broker (connect the broker first)."""
        return Worker(self.router, self.broker, settings, self.clock)


class JobHandle(Generic[R]):
    """A reference to an enqueued job: its id, its state, and its result when kept."""

    def __init__(self, app: App, job_id: str) -> None:
        self.app = app
        self.id = job_id

    def __repr__(self) -> str:
        return f"<JobHandle {self.id}>"

    async def info(self) -> JobInfo | None:
        return await self.app.job(self.id)

    async def cancel(self) -> JobState | None:
        """See ``App.cancel``: CANCELLED, or the state that kept the job from being cancelled."""
        return await self.app.cancel(self.id)

    async def result(self, timeout: float | None = None) -> R:
        """Wait for the job's kept return value. Raises JobDead if it went dead, ResultTimeout
        if it is not done within ``timeout`` seconds. Polls with a growing pause (10 ms to
        0.5 s), or sooner when the broker signals a change."""
        pause = 0.01
        with anyio.move_on_after(timeout if timeout is not None else float("inf")):
            while True:
                info = await self.info()
                if info is None:
                    raise ConfigurationError(
                        f"job {self.id} is unknown or its result was not kept: give the task "
                        "keep_result=SECONDS to read results"
                    )
                if info.state is JobState.DONE:
                    return cast(R, None if info.result is None else json.loads(info.result))
                if info.state is JobState.DEAD:
                    raise JobDead(self.id, info.last_error)
                if info.state is JobState.CANCELLED:
                    raise JobDead(self.id, "cancelled before it ran")
                await self.app.broker.wait_for_change(self.id, pause)
                pause = min(pause * 2, 0.5)
        raise ResultTimeout(f"job {self.id} did not finish within {timeout}s")


class SyncApp:
    """The producer API for code without an event loop: scripts, Django and Flask views.

        app = SyncApp(router, "redis://127.0.0.1:6379/0")
        handle = app.enqueue(add, 2, 3)          # type-checked like App.enqueue
        print(handle.get(timeout=10))

    It drives an ``App`` on an event loop in a background thread (an anyio blocking portal),
    started on first use and shared by every thread that calls it; ``close()`` or a ``with``
    block stops it. The async and sync APIs are one implementation.
    """

    def __init__(
        self,
        router: Router | None = None,
        broker: Broker | str | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.app = App(router, broker, clock=clock)
        self._portal: BlockingPortal | None = None
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<SyncApp {self.app.broker!r}>"

    def __enter__(self) -> Self:
        self._ensure_portal()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ensure_portal(self) -> BlockingPortal:
        with self._lock:
            if self._portal is None:
                cm = start_blocking_portal()
                portal = cm.__enter__()
                try:
                    portal.call(self.app.broker.connect)
                except BaseException:
                    cm.__exit__(None, None, None)
                    raise
                self._portal_cm, self._portal = cm, portal
            return self._portal

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run one coroutine function of the async API and wait for its result."""
        return self._ensure_portal().call(fn, *args)

    def close(self) -> None:
        """Close the broker connection and stop the background event loop."""
        with self._lock:
            portal, cm = self._portal, self._portal_cm
            self._portal = self._portal_cm = None
        if portal is not None and cm is not None:
            try:
                portal.call(self.app.broker.close)
            finally:
                cm.__exit__(None, None, None)

    def enqueue(self, task: Task[P, R], /, *args: P.args, **kwargs: P.kwargs) -> SyncJobHandle[R]:
        """Enqueue one call of ``task`` (see ``App.enqueue``)."""
        handle = self.call(functools.partial(self.app.enqueue, task, *args, **kwargs))
        return SyncJobHandle(self, handle)

    def enqueue_many(self, calls: Sequence[TaskCall[R]]) -> list[SyncJobHandle[R]]:
        """Enqueue many calls in one broker round trip (see ``App.enqueue_many``)."""
        handles = self.call(self.app.enqueue_many, calls)
        return [SyncJobHandle(self, h) for h in handles]

    def job(self, job_id: str) -> JobInfo | None:
        return self.call(self.app.job, job_id)


class SyncJobHandle(Generic[R]):
    """A ``JobHandle`` for synchronous code."""

    def __init__(self, app: SyncApp, handle: JobHandle[R]) -> None:
        self._app = app
        self.handle = handle
        self.id = handle.id

    def __repr__(self) -> str:
        return f"<SyncJobHandle {self.id}>"

    def info(self) -> JobInfo | None:
        return self._app.call(self.handle.info)

    def cancel(self) -> JobState | None:
        return self._app.call(self.handle.cancel)

    def get(self, timeout: float | None = None) -> R:
        """Block until the kept result is there (see ``JobHandle.result``)."""
        return self._app.call(self.handle.result, timeout)
