"""Prometheus metrics and health endpoints for a worker (``taskkit worker --metrics-port N``).

One small HTTP server on the worker's event loop serves:

- ``/metrics``: Prometheus text format (prometheus-client, ``pip install 'taskkit[metrics]'``);
- ``/healthz``: 200 while the process runs;
- ``/readyz``: 200 while the broker answers and the worker is claiming, else 503.

The job counters come from middleware hooks; queue depths are sampled from ``broker.stats``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import SocketStream

from taskkit.errors import ConfigurationError, TaskkitError
from taskkit.job import Alert
from taskkit.middleware import JobEvent, Middleware

if TYPE_CHECKING:
    from taskkit.worker import Worker

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    HAVE_PROMETHEUS = True
except ImportError:  # pragma: no cover - exercised only without the extra
    HAVE_PROMETHEUS = False

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class MetricsMiddleware(Middleware):
    """Counts job events by task and queue into its own registry."""

    def __init__(self) -> None:
        if not HAVE_PROMETHEUS:
            raise ConfigurationError(
                "metrics need prometheus-client: pip install 'taskkit[metrics]'"
            )
        self.registry = CollectorRegistry()
        labels = ["task", "queue"]
        r = self.registry
        self.started = Counter("taskkit_jobs_started", "Job runs started", labels, registry=r)
        self.succeeded = Counter("taskkit_jobs_succeeded", "Jobs completed", labels, registry=r)
        self.failed = Counter("taskkit_jobs_failed", "Job runs that raised", labels, registry=r)
        self.retried = Counter(
            "taskkit_jobs_retried", "Jobs scheduled to run again", labels, registry=r
        )
        self.dead = Counter(
            "taskkit_jobs_dead", "Jobs moved to the dead letters", labels, registry=r
        )
        self.lease_lost = Counter(
            "taskkit_leases_lost", "Runs whose lease another worker took", labels, registry=r
        )
        self.recovered = Counter(
            "taskkit_jobs_recovered", "Expired leases taken back", ["queue"], registry=r
        )
        self.duration = Histogram(
            "taskkit_job_duration_seconds", "Handler run time", labels, buckets=_BUCKETS, registry=r
        )
        self.claim_latency = Histogram(
            "taskkit_claim_seconds", "Broker claim round trip", buckets=_BUCKETS, registry=r
        )
        self.in_use = Gauge("taskkit_worker_busy_slots", "Jobs running in this worker", registry=r)
        self.concurrency = Gauge("taskkit_worker_concurrency", "Slots in this worker", registry=r)
        self.depth = Gauge(
            "taskkit_queue_jobs", "Jobs per queue and state", ["queue", "state"], registry=r
        )
        self.paused = Gauge(
            "taskkit_queue_paused", "1 when the queue is paused", ["queue"], registry=r
        )
        self.oldest_ready = Gauge(
            "taskkit_queue_oldest_ready_seconds",
            "How long the oldest ready job of the queue has waited (0 when none is ready)",
            ["queue"],
            registry=r,
        )
        self.throttled = Counter(
            "taskkit_jobs_throttled",
            "Jobs snoozed by a rate or concurrency limit",
            labels,
            registry=r,
        )
        self.alerts = Counter(
            "taskkit_alerts",
            "Alert deliveries by kind and result (sent, failed)",
            ["kind", "result"],
            registry=r,
        )

    def _labels(self, event: JobEvent) -> dict[str, str]:
        return {"task": event.task or "?", "queue": event.queue}

    def on_worker_start(self, worker: Worker) -> None:
        self.concurrency.set(worker.settings.concurrency)
        self.in_use.set_function(lambda: float(worker.busy))

    def before_run(self, event: JobEvent) -> None:
        self.started.labels(**self._labels(event)).inc()

    def after_run(self, event: JobEvent) -> None:
        if event.duration is not None:
            self.duration.labels(**self._labels(event)).observe(event.duration)

    def on_done(self, event: JobEvent) -> None:
        self.succeeded.labels(**self._labels(event)).inc()

    def on_retry(self, event: JobEvent) -> None:
        self.failed.labels(**self._labels(event)).inc()
        self.retried.labels(**self._labels(event)).inc()

    def on_dead(self, event: JobEvent) -> None:
        self.failed.labels(**self._labels(event)).inc()
        self.dead.labels(**self._labels(event)).inc()

    def on_lease_lost(self, event: JobEvent) -> None:
        self.lease_lost.labels(**self._labels(event)).inc()

    def on_recovered(self, event: JobEvent) -> None:
        self.recovered.labels(queue=event.queue).inc()

    def on_throttled(self, event: JobEvent) -> None:
        self.throttled.labels(**self._labels(event)).inc()

    def on_alert(self, alert: Alert, error: str | None) -> None:
        self.alerts.labels(kind=alert.kind, result="sent" if error is None else "failed").inc()

    def after_claim(self, worker: Worker, count: int, seconds: float) -> None:
        if count:  # an empty claim measures the idle wait, not the broker
            self.claim_latency.observe(seconds)

    async def sample_queues(self, worker: Worker) -> None:
        now = worker.clock.now()
        stats = await worker.broker.stats(now)
        for queue, st in stats.items():
            waited = 0.0 if st.oldest_ready_at is None else max(0.0, now - st.oldest_ready_at)
            self.oldest_ready.labels(queue=queue).set(waited)
            for state in ("ready", "scheduled", "running", "dead"):
                self.depth.labels(queue=queue, state=state).set(getattr(st, state))
            self.paused.labels(queue=queue).set(1 if st.paused else 0)


class HealthServer:
    """Serves /metrics, /healthz and /readyz for one worker."""

    def __init__(
        self,
        worker: Worker,
        metrics: MetricsMiddleware,
        port: int,
        host: str = "0.0.0.0",
        sample_every: float = 5.0,
    ) -> None:
        self.worker = worker
        self.metrics = metrics
        self.port = port
        self.host = host
        self.sample_every = sample_every
        self.broker_ok = False

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen until cancelled; reports the bound port through ``task_status``."""
        listener = await anyio.create_tcp_listener(local_host=self.host, local_port=self.port)
        port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(self._sample_loop)
            task_status.started(port)
            await listener.serve(self._handle)

    async def _sample_loop(self) -> None:
        while True:
            try:
                await self.metrics.sample_queues(self.worker)
                self.broker_ok = True
            except TaskkitError:
                self.broker_ok = False
            await anyio.sleep(self.sample_every)

    def ready(self) -> tuple[bool, str]:
        """Ready when the broker answered the last sample and the claim loop is alive."""
        if not self.broker_ok:
            return False, "broker unreachable"
        age = time.monotonic() - self.worker.last_claim_ok
        limit = max(10.0, 3 * self.worker.settings.poll_wait)
        if age > limit and self.worker.busy < self.worker.settings.concurrency:
            return False, f"no successful claim for {age:.0f}s"
        if self.worker.stopping:
            return False, "shutting down"
        return True, "ready"

    async def _handle(self, stream: SocketStream) -> None:
        async with stream:
            try:
                with anyio.fail_after(5):
                    request = await stream.receive(65536)
            except (TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError):
                return
            parts = request.split(b" ", 2)
            path = parts[1].split(b"?")[0].decode("latin-1") if len(parts) > 1 else ""
            status, ctype, body = self._respond(path)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            try:
                await stream.send(head.encode() + body)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return

    def _respond(self, path: str) -> tuple[str, str, bytes]:
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry)
        if path == "/healthz":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/readyz":
            ok, why = self.ready()
            return (
                ("200 OK" if ok else "503 Service Unavailable"),
                "text/plain",
                why.encode() + b"\n",
            )
        return "404 Not Found", "text/plain", b"try /metrics, /healthz or /readyz\n"


def attach(worker: Worker, port: int, host: str = "0.0.0.0", **kw: Any) -> HealthServer:
    """Add metrics to a worker and return the server to run beside it."""
    metrics = MetricsMiddleware()
    worker.hooks.add(metrics)
    return HealthServer(worker, metrics, port, host, **kw)
