"""Hooks around enqueue and execution fire in order on every broker; a failing hook changes
nothing; job events reach the log as structured fields."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import pytest

from taskkit import App, Job, Router
from taskkit.broker import Broker
from taskkit.logformat import JsonFormatter
from taskkit.middleware import JobEvent, Middleware
from taskkit.testing import FakeClock
from taskkit.worker import Worker

from .test_worker import drain

pytestmark = pytest.mark.anyio


class Recorder(Middleware):
    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []

    def after_enqueue(self, jobs: Sequence[Job], ids: Sequence[str]) -> None:
        self.calls += [("enqueued", j.task) for j in jobs]

    def on_worker_start(self, worker: Worker) -> None:
        self.calls.append(("start", None))

    def on_worker_stop(self, worker: Worker) -> None:
        self.calls.append(("stop", None))

    def before_run(self, event: JobEvent) -> None:
        self.calls.append(("before", event.task))

    def on_done(self, event: JobEvent) -> None:
        assert event.duration is not None and event.duration >= 0
        self.calls.append(("done", event.task))

    def on_retry(self, event: JobEvent) -> None:
        self.calls.append(("retry", event.error))

    def on_dead(self, event: JobEvent) -> None:
        self.calls.append(("dead", event.error))


class Broken(Middleware):
    def before_run(self, event: JobEvent) -> None:
        raise RuntimeError("hook bug")


async def test_hooks_see_every_step_and_a_broken_hook_changes_nothing(
    broker: Broker, clock: FakeClock
) -> None:
    router = Router()
    recorder = Recorder()
    router.use(Broken())
    router.use(recorder)

    @router.task(name="ok")
    async def ok() -> None: ...

    @router.task(name="bad", max_attempts=2)
    async def bad() -> None:
        raise ValueError("nope")

    app = App(router, broker, clock=clock)
    await app.enqueue(ok)
    await app.enqueue(bad)
    await drain(router, broker, clock, concurrency=1)
    clock.advance(5)
    await drain(router, broker, clock)
    assert recorder.calls == [
        ("enqueued", "ok"),
        ("enqueued", "bad"),
        ("start", None),
        ("before", "ok"),
        ("done", "ok"),
        ("before", "bad"),
        ("retry", "ValueError: nope"),
        ("stop", None),
        ("start", None),
        ("before", "bad"),
        ("dead", "ValueError: nope"),
        ("stop", None),
    ]


async def test_job_events_are_logged_as_json_fields(
    broker: Broker, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    router = Router()

    @router.task(name="logged")
    async def logged() -> None: ...

    handle = await App(router, broker, clock=clock).enqueue(logged)
    with caplog.at_level(logging.INFO, logger="taskkit.jobs"):
        await drain(router, broker, clock)
    [record] = [r for r in caplog.records if r.name == "taskkit.jobs"]
    entry = json.loads(JsonFormatter().format(record))
    assert entry["event"] == "done" and entry["job_id"] == handle.id
    assert (entry["task"], entry["queue"], entry["attempt"]) == ("logged", "default", 1)
    assert entry["duration"] >= 0 and entry["level"] == "INFO"
