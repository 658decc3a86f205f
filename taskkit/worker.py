"""The worker: claim → run → decide → settle, with heartbeats, recovery and graceful shutdown.

One worker process runs these loops side by side on anyio:

- claim: reserve as many jobs as there are free slots (one broker call for the batch) and hand
  them to ``concurrency`` runner tasks; async tasks run on the event loop, plain functions in
  threads;
- periodic tasks: enqueue each due tick (see taskkit.schedule);
- settle: outcomes queue up and are written in batches, one broker call per batch;
- heartbeat: every ``heartbeat_every`` seconds, extend every running job's lease in one call,
  and cancel any job whose lease was lost (another worker has it now);
- recovery: every ``recovery_every`` seconds (and once at start-up), take over jobs whose lease
  ran out under any worker, dead or alive, and retry or dead-letter them;
- alerts (with ``alert_webhook`` or ``stall_after``): see taskkit.alerts.

A job of a task with a rate or concurrency limit (taskkit.limits) asks the broker before it runs;
over the limit it is snoozed, without using an attempt.

On ``stop()`` (SIGTERM/SIGINT under ``taskkit worker``) it stops claiming, gives running jobs
``grace_period`` seconds, cancels the rest and hands them back without charging an attempt.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import secrets
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import to_jsonable_python

from taskkit.alerts import AlertDispatcher, check_webhook
from taskkit.broker import Broker
from taskkit.clock import Clock, SystemClock
from taskkit.context import JobContext, _current
from taskkit.errors import (
    ArgumentsInvalid,
    JobTimeout,
    PayloadInvalid,
    TaskkitError,
)
from taskkit.job import Alert, Delivery, Job, Lease, decode_job, peek_task, validate_queue_name
from taskkit.limits import Parked, queue_slot_key, rate_key, task_slot_key
from taskkit.middleware import Hooks, JobEvent, LoggingMiddleware
from taskkit.outcome import Complete, DeadLetter, Outcome, Retry
from taskkit.retry import DEFAULT_MAX_ATTEMPTS, RetryPolicy
from taskkit.router import Router
from taskkit.task import Task

log = logging.getLogger("taskkit.worker")
_NO_DEADLINE = contextlib.nullcontext()  # no timeout: no cancel scope on the hot path


def default_worker_id() -> str:
    """``host-pid-random``; ``TASKKIT_WORKER_ID`` overrides it."""
    env = os.environ.get("TASKKIT_WORKER_ID")
    if env:
        return env
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class WorkerSettings(BaseModel):
    """Everything a worker can be told. ``queues=None`` serves every queue the router uses."""

    model_config = ConfigDict(frozen=True)

    queues: list[str] | None = None
    concurrency: int = Field(10, ge=1, le=10_000)
    lease_for: float = Field(30.0, gt=0)
    heartbeat_every: float | None = Field(None, gt=0)
    recovery_every: float | None = Field(None, gt=0)
    poll_wait: float = Field(1.0, gt=0)
    grace_period: float = Field(10.0, ge=0)
    burst: bool = False
    worker_id: str = Field(default_factory=default_worker_id)
    # Alerts (taskkit.alerts): where to POST them, how long one key stays quiet after a delivery,
    # after how long a waiting ready job means its queue is stalled, how often to look.
    alert_webhook: str | None = None
    alert_window: float = Field(3600.0, ge=0)
    stall_after: float | None = Field(None, gt=0)
    alert_every: float = Field(1.0, gt=0)

    @field_validator("alert_webhook")
    @classmethod
    def _webhook(cls, value: str | None) -> str | None:
        return None if value is None else check_webhook(value)

    @field_validator("queues")
    @classmethod
    def _queues(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            if not value:
                raise ValueError("queues must name at least one queue")
            for q in value:
                validate_queue_name(q)
        return value

    @property
    def alerting(self) -> bool:
        return self.alert_webhook is not None or self.stall_after is not None

    @property
    def heartbeat_interval(self) -> float:
        return self.heartbeat_every or self.lease_for / 3

    @property
    def recovery_interval(self) -> float:
        # Recovery runs often enough that an orphan waits about a lease, not an hour.
        return self.recovery_every or min(max(self.lease_for / 2, 0.05), 10.0)


class _Outage:
    """One readable line per broker outage: the first failure of a streak at ERROR, repeats at
    DEBUG, and one INFO line when the broker answers again."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.failures = 0
        self.since = 0.0

    def failed(self, exc: BaseException) -> int:
        self.failures += 1
        if self.failures == 1:
            self.since = time.monotonic()
            log.error("%s failed: %s; retrying with backoff", self.what, exc)
        else:
            log.debug("%s failed again (%d): %s", self.what, self.failures, exc)
        return self.failures

    def ok(self) -> None:
        if self.failures:
            log.info(
                "%s works again after %d failures (%.1fs)",
                self.what,
                self.failures,
                time.monotonic() - self.since,
            )
            self.failures = 0


@dataclass(eq=False)
class _Running:
    lease: Lease
    attempts: int
    task: str | None = None  # known once the payload decodes
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    lost: bool = False
    slots: list[tuple[str, str]] = field(default_factory=list)  # concurrency slots held
    throttled: bool = False  # snoozed by a limit instead of run


class Worker:
    """Runs a router's tasks from a broker. ``await worker.run()`` until ``stop()``."""

    def __init__(
        self,
        router: Router,
        broker: Broker,
        settings: WorkerSettings | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.router = router
        self.broker = broker
        self.settings = settings or WorkerSettings()
        self.clock: Clock = clock or SystemClock()
        self.queues = list(self.settings.queues or router.queues() or ["default"])
        self.id = self.settings.worker_id
        self._running: dict[str, _Running] = {}
        self._slot_freed = anyio.Event()
        self._stop = anyio.Event()
        self._pending_settles: list[tuple[Lease, Outcome]] = []
        self._settle_wanted = anyio.Event()
        self._settle_lock = anyio.Lock()
        self._to_release: list[Lease] = []
        self._threads = anyio.CapacityLimiter(self.settings.concurrency)
        self.hooks = Hooks([LoggingMiddleware(), *router.middleware])
        self.processed = 0
        self._outages = {w: _Outage(w) for w in ("claim", "settle", "heartbeat", "recovery")}
        self._parked = Parked()
        self.last_claim_ok = time.monotonic()

    # -- control -----------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running jobs get the grace period, then go back to the queue."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def busy(self) -> int:
        """Jobs running now."""
        return len(self._running)

    async def run(self, *, handle_signals: bool = False) -> None:
        """Serve until ``stop()`` (or, in burst mode, until nothing is ready or running)."""
        log.info(
            "worker %s starting: queues=%s concurrency=%d lease=%ss broker=%r",
            self.id,
            ",".join(self.queues),
            self.settings.concurrency,
            self.settings.lease_for,
            self.broker,
        )
        async with anyio.create_task_group() as services:
            if handle_signals:
                services.start_soon(self._watch_signals)
            self.hooks.call("on_worker_start", self)
            await self._recover()  # start-up recovery: orphans from before we came up
            services.start_soon(self._heartbeat_loop)
            services.start_soon(self._recovery_loop)
            services.start_soon(self._settle_loop)
            if not self.settings.burst:
                services.start_soon(self._schedule_loop)
                if self.settings.alerting:
                    services.start_soon(self._alert_dispatcher().run)
            # A fixed set of runners takes claimed jobs from an in-memory inbox: no task is
            # spawned per job, which is most of the per-job cost of a no-op task.
            send, inbox = anyio.create_memory_object_stream[tuple[Delivery, _Running]](math.inf)
            async with anyio.create_task_group() as runners:
                for _ in range(self.settings.concurrency):
                    runners.start_soon(self._runner, inbox.clone())
                inbox.close()
                async with send:
                    await self._claim_loop(send)
                    await self._drain()
            await self._flush_settles()
            await self._release_leftovers()
            services.cancel_scope.cancel()
        self.hooks.call("on_worker_stop", self)
        log.info("worker %s stopped after %d jobs", self.id, self.processed)

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if self.stopping:
                    log.warning(
                        "second %s: cancelling running jobs now", signal.Signals(signum).name
                    )
                    self._cancel_running()
                else:
                    log.info(
                        "%s received: finishing running jobs (grace %ss), then exiting",
                        signal.Signals(signum).name,
                        self.settings.grace_period,
                    )
                    self.stop()

    # -- claim ---------------------------------------------------------------------------------

    async def _claim_loop(self, inbox: MemoryObjectSendStream[tuple[Delivery, _Running]]) -> None:
        outage = self._outages["claim"]
        while not self.stopping:
            free = self.settings.concurrency - len(self._running)
            if free <= 0:
                await self._wait_for_slot()
                continue
            try:
                asked = time.monotonic()
                deliveries = await self.broker.reserve(
                    self.queues, free, self.settings.lease_for, self._claim_wait(), self.clock.now()
                )
                self.last_claim_ok = time.monotonic()
                self.hooks.call("after_claim", self, len(deliveries), self.last_claim_ok - asked)
                outage.ok()
            except TaskkitError as exc:
                await self._backoff(outage.failed(exc))
                continue
            for delivery in deliveries:
                running = _Running(delivery.lease, delivery.attempts)
                self._running[delivery.job_id] = running
                inbox.send_nowait((delivery, running))
            if not deliveries:
                # A broker call may finish without ever yielding (an in-process fake): give the
                # other tasks of this loop their turn before asking again.
                await anyio.lowlevel.checkpoint()
                if self.settings.burst and await self._nothing_left():
                    self.stop()

    def _claim_wait(self) -> float:
        # In burst mode keep the wait short: the exit check runs between waits.
        return min(self.settings.poll_wait, 0.2) if self.settings.burst else self.settings.poll_wait

    async def _wait_for_slot(self) -> None:
        with anyio.move_on_after(self.settings.poll_wait):
            await self._slot_freed.wait()
        if self._slot_freed.is_set():
            self._slot_freed = anyio.Event()

    async def _nothing_left(self) -> bool:
        """Burst exit test: nothing ready (in unpaused queues) or running in our queues, here or
        anywhere, and nothing waiting to be settled."""
        if self._running or self._pending_settles:
            return False
        try:
            stats = await self.broker.stats(self.clock.now())
        except TaskkitError as exc:
            log.error("cannot read queue stats (%s); not done yet", exc)
            return False
        for queue in self.queues:
            st = stats.get(queue)
            if st is not None and (st.running or (st.ready and not st.paused)):
                return False
        return True

    async def _backoff(self, failures: int) -> None:
        """Wait 0.2 s doubling up to 10 s after the n-th failure in a row (or until stop)."""
        with anyio.move_on_after(min(10.0, 0.1 * 2 ** min(failures, 7))):
            await self._stop.wait()

    # -- run one job --------------------------------------------------------------------------

    async def _runner(self, inbox: MemoryObjectReceiveStream[tuple[Delivery, _Running]]) -> None:
        async with inbox:
            async for delivery, running in inbox:
                await self._run_job(delivery, running)

    def _emit(self, hook: str, running: _Running, **fields: Any) -> None:
        if self.hooks.wants(hook):  # building the event only when someone listens
            lease = running.lease
            event = JobEvent(
                lease.job_id, running.task, lease.queue, running.attempts, self.id, **fields
            )
            self.hooks.call(hook, event)

    async def _run_job(self, delivery: Delivery, running: _Running) -> None:
        started = time.perf_counter()
        try:
            with running.scope:
                outcome = await self._execute(delivery, running)
            if running.lost:
                self._emit("on_lease_lost", running)
            elif running.scope.cancelled_caught:
                self._to_release.append(delivery.lease)
            else:
                self._queue_settle(delivery.lease, outcome)
                self._report(running, outcome, time.perf_counter() - started)
        finally:
            if running.slots:
                await self._release_slots(running)
            self._running.pop(delivery.job_id, None)
            self.processed += 1
            self._slot_freed.set()

    def _report(self, running: _Running, outcome: Outcome, duration: float) -> None:
        if running.throttled:
            assert isinstance(outcome, Retry)
            self._emit("on_throttled", running, error=outcome.error, run_at=outcome.run_at)
            return
        self._emit("after_run", running, duration=duration)
        if isinstance(outcome, Complete):
            self._emit("on_done", running, duration=duration)
        elif isinstance(outcome, Retry):
            error = (outcome.error or "").split("\n", 1)[0] or None
            self._emit("on_retry", running, duration=duration, error=error, run_at=outcome.run_at)
        else:
            error = outcome.error.split("\n", 1)[0]
            self._emit("on_dead", running, duration=duration, error=error)

    async def _execute(self, delivery: Delivery, running: _Running) -> Outcome:
        """Decode, look up, validate, run: every failure on the way becomes an outcome."""
        try:
            job = decode_job(delivery.payload)
        except PayloadInvalid as exc:
            return DeadLetter(f"PayloadInvalid: {exc}")
        running.task = job.task
        task = self.router.get(job.task)
        if task is None:
            known = ", ".join(self.router.names()[:20]) or "none"
            return DeadLetter(
                f"UnknownTask: no task named {job.task!r} is registered with this worker "
                f"(registered: {known}); deploy the task or requeue the job once it is"
            )
        try:
            args, kwargs = task.check_arguments(job.args, job.kwargs)
        except ArgumentsInvalid as exc:
            return DeadLetter(f"ArgumentsInvalid: {exc}")
        if task.settings.rate_limit or task.settings.concurrency or self.router.queue_limits:
            refused = await self._admit(task, delivery.lease, running)
            if refused is not None:
                return refused
        self._emit("before_run", running)
        context = JobContext(
            id=delivery.job_id,
            task=task.name,
            queue=delivery.lease.queue,
            attempt=delivery.attempts,
            max_attempts=job.max_attempts or task.settings.policy.max_attempts,
            worker_id=self.id,
            write_progress=functools.partial(self._write_progress, delivery.lease),
        )
        token = _current.set(context)
        try:
            return await self._call(task, job, args, kwargs, delivery.attempts)
        finally:
            _current.reset(token)

    # -- fleet-wide limits ---------------------------------------------------------------------

    async def _admit(self, task: Task[Any, Any], lease: Lease, running: _Running) -> Retry | None:
        """Take the job's concurrency slots and a rate grant, or snooze it (no attempt used).
        Slots come first: a rate grant is spent only by a job that will run."""
        slots = []
        if task.settings.concurrency is not None:
            slots.append((task_slot_key(task.name), task.settings.concurrency))
        if (queue_limit := self.router.queue_limits.get(lease.queue)) is not None:
            slots.append((queue_slot_key(lease.queue), queue_limit))
        now = self.clock.now()
        try:
            for key, limit in slots:
                if not await self.broker.acquire_slot(
                    key, lease.job_id, limit, self.settings.lease_for, now
                ):
                    await self._release_slots(running)
                    why = f"{key} already has {limit} jobs running"
                    return self._throttle(task, running, key, 0.25, 0.5, why)
                running.slots.append((key, lease.job_id))
            rate = task.settings.rate_limit
            if rate is not None:
                key = rate_key(task.name)
                wait = await self.broker.acquire_rate(key, rate.interval, now)
                if wait > 0:
                    await self._release_slots(running)
                    why = f"is over its rate limit of {rate.text}"
                    return self._throttle(task, running, key, wait, rate.interval, why)
        except TaskkitError as exc:
            await self._release_slots(running)
            return self._throttle(task, running, "broker", 1.0, 1.0, f"cannot check limits: {exc}")
        return None

    def _throttle(
        self, task: Task[Any, Any], running: _Running, key: str, base: float, step: float, why: str
    ) -> Retry:
        now = self.clock.now()
        delay = self._parked.snooze_for(key, base, step, now)
        running.throttled = True
        error = f"Throttled: {task.name} {why}; runs again in {delay:.2f}s"
        return Retry(now + delay, error, charge_attempt=False)

    async def _release_slots(self, running: _Running) -> None:
        slots, running.slots = running.slots, []
        if not slots:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            try:
                await self.broker.release_slots(slots)
            except TaskkitError as exc:
                log.warning("could not release %s (%s); it frees at lease expiry", slots, exc)

    def _alert_dispatcher(self) -> AlertDispatcher:
        return AlertDispatcher(
            self.broker,
            self.clock,
            self.id,
            webhook=self.settings.alert_webhook,
            window=self.settings.alert_window,
            stall_after=self.settings.stall_after,
            every=self.settings.alert_every,
            on_result=self._alert_result,
        )

    def _alert_result(self, alert: Alert, error: str | None) -> None:
        self.hooks.call("on_alert", alert, error)

    async def _write_progress(self, lease: Lease, progress: str) -> bool:
        return await self.broker.set_progress(lease, progress, self.clock.now())

    async def _call(
        self, task: Task[Any, Any], job: Job, args: list[Any], kwargs: dict[str, Any], attempts: int
    ) -> Outcome:
        timeout = job.timeout or task.settings.timeout
        try:
            with anyio.move_on_after(timeout) if timeout else _NO_DEADLINE as deadline:
                if task.is_async:
                    result = await task.invoke(args, kwargs)
                else:
                    result = await anyio.to_thread.run_sync(
                        lambda: task.fn(*args, **kwargs),
                        abandon_on_cancel=True,
                        limiter=self._threads,
                    )
            if deadline is not None and deadline.cancelled_caught:
                raise JobTimeout(
                    f"{task.name} ran past its timeout of {timeout}s and was cancelled"
                )
        except (Exception, SystemExit) as exc:
            policy = task.settings.policy
            if job.max_attempts is not None:
                policy = dataclasses.replace(policy, max_attempts=job.max_attempts)
            return policy.decide(exc, attempts, self.clock.now())
        return self._completed(task, job, result)

    def _completed(self, task: Task[Any, Any], job: Job, result: Any) -> Outcome:
        keep = job.keep_result if job.keep_result is not None else task.settings.keep_result
        if keep is None:
            return Complete()
        try:
            text = json.dumps(to_jsonable_python(result), allow_nan=False)
        except (TypeError, ValueError) as exc:
            return DeadLetter(f"ResultInvalid: the return value of {task.name} is not JSON: {exc}")
        return Complete(text, keep_until=self.clock.now() + keep)

    # -- settle --------------------------------------------------------------------------------

    def _queue_settle(self, lease: Lease, outcome: Outcome) -> None:
        self._pending_settles.append((lease, outcome))
        self._settle_wanted.set()

    async def _settle_loop(self) -> None:
        while True:
            await self._settle_wanted.wait()
            self._settle_wanted = anyio.Event()
            await self._flush_settles()

    async def _flush_settles(self) -> None:
        """Write every queued outcome in one broker call; on broker trouble keep them and retry
        (a lease that runs out meanwhile is refused and the job reruns: at-least-once).
        One flush at a time, shielded: shutdown waits for the batch in flight."""
        async with self._settle_lock:
            with anyio.CancelScope(shield=True):
                await self._flush_locked()

    async def _flush_locked(self) -> None:
        outage = self._outages["settle"]
        while self._pending_settles:
            batch, self._pending_settles = self._pending_settles, []
            try:
                applied = await self.broker.settle(batch, self.clock.now())
                outage.ok()
            except TaskkitError as exc:
                self._pending_settles[:0] = batch
                if outage.failed(exc) > 20:  # ~90 s: the leases have run out; others rerun them
                    log.error("giving up settling %d jobs; their leases will expire", len(batch))
                    self._pending_settles.clear()
                    return
                await anyio.sleep(min(5.0, 0.05 * 2**outage.failures))
                continue
            settled = self.hooks.wants("on_settled")
            for (lease, outcome), ok in zip(batch, applied, strict=True):
                if settled:
                    self.hooks.call("on_settled", lease.job_id, outcome, ok)
                if not ok:
                    log.warning(
                        "job %s: %s refused: lease lost (another worker owns the job now)",
                        lease.job_id,
                        type(outcome).__name__,
                    )

    # -- heartbeat and recovery ---------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            await anyio.sleep(self.settings.heartbeat_interval)
            await self._heartbeat()

    async def _heartbeat(self) -> None:
        running = [r for r in self._running.values() if not r.lost]
        if not running:
            return
        try:
            now = self.clock.now()
            lost = await self.broker.extend(
                [r.lease for r in running], self.settings.lease_for, now
            )
            if slots := [slot for r in running for slot in r.slots]:
                await self.broker.extend_slots(slots, self.settings.lease_for, now)
            self._outages["heartbeat"].ok()
        except TaskkitError as exc:
            self._outages["heartbeat"].failed(exc)
            return
        lost_ids = {lease.job_id for lease in lost}
        for r in running:
            if r.lease.job_id in lost_ids:
                r.lost = True
                r.scope.cancel()

    async def _recovery_loop(self) -> None:
        while True:
            await anyio.sleep(self.settings.recovery_interval)
            await self._recover()

    async def _recover(self) -> int:
        """Retry or dead-letter jobs whose lease ran out, whoever held them."""
        try:
            found = await self.broker.reclaim_expired(
                self.queues, self.settings.lease_for, 100, self.clock.now()
            )
            self._outages["recovery"].ok()
            if not found:
                return 0
            now = self.clock.now()
            decisions = [(d.lease, self._lost_run_outcome(d, now)) for d in found]
            with anyio.CancelScope(shield=True):  # taken over: decide before shutting down
                await self.broker.settle(decisions, now)
        except TaskkitError as exc:
            self._outages["recovery"].failed(exc)
            return 0
        for delivery, (_, outcome) in zip(found, decisions, strict=True):
            verdict = "dead" if isinstance(outcome, DeadLetter) else "requeued"
            event = JobEvent(
                delivery.job_id,
                peek_task(delivery.payload),
                delivery.lease.queue,
                delivery.attempts,
                self.id,
                error=f"lease ran out; {verdict}",
            )
            self.hooks.call("on_recovered", event)
        return len(found)

    def _lost_run_outcome(self, delivery: Delivery, now: float) -> Outcome:
        max_attempts = DEFAULT_MAX_ATTEMPTS
        try:
            job = decode_job(delivery.payload)
        except PayloadInvalid as exc:
            return DeadLetter(f"PayloadInvalid: {exc}")
        task = self.router.get(job.task)
        if job.max_attempts is not None:
            max_attempts = job.max_attempts
        elif task is not None:
            max_attempts = task.settings.policy.max_attempts
        return RetryPolicy().lost_run(delivery.attempts, max_attempts, now)

    # -- periodic tasks ------------------------------------------------------------------------

    async def _schedule_loop(self) -> None:
        """Enqueue each due tick of the periodic tasks we serve; every worker does this, and
        the tick's job id makes it one job (see taskkit.schedule)."""
        periodic = [
            (t, t.settings.schedule)
            for t in self.router
            if t.settings.schedule is not None and t.settings.queue in self.queues
        ]
        if not periodic:
            return
        done: dict[str, float] = {}
        while True:
            now = self.clock.now()
            due = [(t, s.latest_at_or_before(now)) for t, s in periodic]
            due = [(t, tick) for t, tick in due if done.get(t.name) != tick]
            if due:
                try:
                    await self.broker.enqueue([t.tick_job(tick, now) for t, tick in due], now)
                    done.update((t.name, tick) for t, tick in due)
                except TaskkitError as exc:
                    log.error("enqueueing periodic tasks failed (%s); will retry", exc)
            soonest = min(s.next_after(now) for _, s in periodic)
            await anyio.sleep(min(max(soonest - now, 0.01), self.settings.poll_wait))

    # -- shutdown ------------------------------------------------------------------------------

    async def _drain(self) -> None:
        """After claiming stops: wait out the grace period, then cancel what still runs."""
        with anyio.move_on_after(self.settings.grace_period):
            while self._running:
                await self._wait_for_slot()
        if self._running:
            log.warning(
                "grace period over: handing %d running jobs back to the queue", len(self._running)
            )
            self._cancel_running()

    def _cancel_running(self) -> None:
        for running in self._running.values():
            running.scope.cancel()

    async def _release_leftovers(self) -> None:
        leases, self._to_release = self._to_release, []
        if not leases:
            return
        try:
            await self.broker.release(leases, self.clock.now())
        except TaskkitError as exc:
            log.error(
                "could not hand %d jobs back (%s); they return when their lease runs out",
                len(leases),
                exc,
            )


async def run_worker(
    router: Router,
    broker: Broker,
    settings: WorkerSettings | None = None,
    *,
    clock: Clock | None = None,
    handle_signals: bool = False,
) -> Worker:
    """Connect the broker, run a worker until it stops, close the broker. Returns the worker."""
    worker = Worker(router, broker, settings, clock)
    async with broker:
        await worker.run(handle_signals=handle_signals)
    return worker
