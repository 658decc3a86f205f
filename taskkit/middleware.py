"""Hooks around enqueue and execution.

Subclass ``Middleware``, override the hooks you need, and register it with ``router.use(mw)``;
producers (``App``) and workers of that router call it. Hooks are plain functions called on the
worker's event loop, so they must be quick and must not block: record, count, start a span. An
exception in a hook is logged and swallowed; it never changes a job's outcome.

The worker's own logging (``taskkit.middleware.LoggingMiddleware``) is built on these hooks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from taskkit.job import Alert, Job
from taskkit.outcome import Outcome

if TYPE_CHECKING:
    from taskkit.worker import Worker

log = logging.getLogger("taskkit.middleware")


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One thing that happened to a job in a worker. ``task`` is None when the payload did not
    decode; ``duration`` is the run time in seconds (None before or without a run)."""

    job_id: str
    task: str | None
    queue: str
    attempt: int
    worker_id: str
    duration: float | None = None
    error: str | None = None  # for retries and dead letters: the first line of the error
    run_at: float | None = None  # for retries: when the job runs again


class Middleware:
    """Override any of these; the defaults do nothing."""

    def enabled(self, hook: str) -> bool:
        """Whether this middleware wants ``hook`` at all; asked once per hook and worker."""
        return True

    def before_enqueue(self, jobs: Sequence[Job]) -> None:
        """Jobs about to be stored (after argument validation)."""

    def after_enqueue(self, jobs: Sequence[Job], ids: Sequence[str]) -> None:
        """Jobs stored; ``ids[i]`` differs from ``jobs[i].id`` when a dedupe key matched."""

    def on_worker_start(self, worker: Worker) -> None:
        """The worker is about to claim its first jobs."""

    def on_worker_stop(self, worker: Worker) -> None:
        """The worker has settled or handed back every job and is exiting."""

    def after_claim(self, worker: Worker, count: int, seconds: float) -> None:
        """A claim round trip took ``seconds`` and brought ``count`` jobs (maybe 0)."""

    def before_run(self, event: JobEvent) -> None:
        """A claimed job is about to run."""

    def after_run(self, event: JobEvent) -> None:
        """A job's handler finished (any outcome); ``event.duration`` is set."""

    def on_done(self, event: JobEvent) -> None:
        """The job completed."""

    def on_retry(self, event: JobEvent) -> None:
        """The job failed and will run again at ``event.run_at`` (snoozes included)."""

    def on_dead(self, event: JobEvent) -> None:
        """The job went to the dead letters; ``event.error`` says why."""

    def on_lease_lost(self, event: JobEvent) -> None:
        """Another worker took the job over (our lease ran out); our result was discarded."""

    def on_settled(self, job_id: str, outcome: Outcome, applied: bool) -> None:
        """The broker answered a settle: ``applied`` is False when the lease had been lost.
        This is where a job's completion becomes durable."""

    def on_recovered(self, event: JobEvent) -> None:
        """This worker took back a job whose lease ran out under some worker."""

    def on_throttled(self, event: JobEvent) -> None:
        """A claimed job was over a rate or concurrency limit and was snoozed without running
        (no attempt used); ``event.run_at`` says when it comes back."""

    def on_alert(self, alert: Alert, error: str | None) -> None:
        """This worker tried to deliver ``alert``: ``error`` is None when the webhook took it."""


class Hooks:
    """Calls every registered middleware, isolating failures. Only middleware that override a
    hook (and say it is ``enabled``) are called, so an unused hook costs the hot path nothing."""

    def __init__(self, middleware: Sequence[Middleware] = ()) -> None:
        self.middleware = list(middleware)
        self._active: dict[str, list[Any]] = {}

    def add(self, middleware: Middleware) -> None:
        self.middleware.append(middleware)
        self._active.clear()

    def _methods(self, hook: str) -> list[Any]:
        methods = self._active.get(hook)
        if methods is None:
            methods = [
                getattr(mw, hook)
                for mw in self.middleware
                if getattr(type(mw), hook) is not getattr(Middleware, hook) and mw.enabled(hook)
            ]
            self._active[hook] = methods
        return methods

    def wants(self, hook: str) -> bool:
        """Whether calling ``hook`` would reach any middleware (skip building its event)."""
        return bool(self._methods(hook))

    def call(self, hook: str, *args: Any) -> None:
        for method in self._methods(hook):
            try:
                method(*args)
            except Exception:
                log.exception("middleware %s failed; ignored", method.__qualname__)


class LoggingMiddleware(Middleware):
    """One log line per job event, with the job's id, task, queue, attempt and duration as
    ``extra`` fields (the JSON log format prints them as keys)."""

    LEVELS = {
        "before_run": logging.DEBUG,
        "on_done": logging.INFO,
        "on_retry": logging.WARNING,
        "on_dead": logging.ERROR,
        "on_lease_lost": logging.WARNING,
        "on_recovered": logging.WARNING,
        "on_throttled": logging.DEBUG,
    }

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or logging.getLogger("taskkit.jobs")

    def enabled(self, hook: str) -> bool:
        return self.log.isEnabledFor(self.LEVELS.get(hook, logging.CRITICAL))

    def _emit(self, level: int, what: str, event: JobEvent) -> None:
        fields: dict[str, object] = {
            "event": what,
            "job_id": event.job_id,
            "task": event.task,
            "queue": event.queue,
            "attempt": event.attempt,
            "worker_id": event.worker_id,
        }
        if event.duration is not None:
            fields["duration"] = round(event.duration, 6)
        if event.error is not None:
            fields["error"] = event.error
        if event.run_at is not None:
            fields["run_at"] = event.run_at
        detail = f" in {event.duration * 1000:.1f} ms" if event.duration is not None else ""
        reason = f": {event.error}" if event.error else ""
        self.log.log(
            level,
            "job %s %s (%s, queue %s, attempt %d)%s%s",
            event.job_id,
            what,
            event.task,
            event.queue,
            event.attempt,
            detail,
            reason,
            extra={"taskkit": fields},
        )

    def before_run(self, event: JobEvent) -> None:
        self._emit(logging.DEBUG, "claimed", event)  # levels here match LEVELS

    def on_done(self, event: JobEvent) -> None:
        self._emit(logging.INFO, "done", event)

    def on_retry(self, event: JobEvent) -> None:
        self._emit(logging.WARNING, "retry scheduled", event)

    def on_dead(self, event: JobEvent) -> None:
        self._emit(logging.ERROR, "dead", event)

    def on_lease_lost(self, event: JobEvent) -> None:
        self._emit(logging.WARNING, "lease lost", event)

    def on_recovered(self, event: JobEvent) -> None:
        self._emit(logging.WARNING, "recovered", event)

    def on_throttled(self, event: JobEvent) -> None:
        self._emit(logging.DEBUG, "throttled", event)
