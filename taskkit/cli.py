"""The ``taskkit`` command.

    taskkit worker APP [--broker URL] [--queues a,b] [--concurrency N] [--lease S] [--burst]
                       [--grace S] [--worker-id ID] [--metrics-port N]
                       [--alert-webhook URL] [--alert-window S] [--stall-after S]
    taskkit enqueue APP TASK [--args JSON] [--kwargs JSON] [--delay S] [--queue Q]
                             [--dedupe-key K] [--broker URL]
    taskkit job ID [--json]            taskkit cancel ID
    taskkit info [--broker URL] [--json]
    taskkit dead list|requeue|purge [--broker URL] [--queue Q] [--id ID] [--all] [--json]
    taskkit pause|resume QUEUE [--broker URL]
    taskkit schedule list APP [--json]
    taskkit alerts list [--all] [--limit N] [--json]
    taskkit migrate [--broker URL]

Every command also takes ``--log-level`` and ``--log-format text|json``.

APP is ``module:attribute`` naming a Router or an App. The broker URL comes from ``--broker``,
else ``TASKKIT_BROKER_URL``, else ``sqlite:///taskkit.db``. Every failure is one line on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import anyio
from pydantic import ValidationError

from taskkit.app import App
from taskkit.broker import Broker, broker_from_url, redact_url
from taskkit.errors import (
    AppImportError,
    BrokerUnavailable,
    ConfigurationError,
    JobNotFound,
    TaskkitError,
)
from taskkit.job import JobState, validate_queue_name
from taskkit.logformat import configure_logging
from taskkit.router import Router
from taskkit.worker import Worker, WorkerSettings

EXIT_USAGE, EXIT_FAILURE = 2, 1


def load_router(target: str) -> Router:
    """Import ``module:attribute`` and return the Router it names (or an App's router)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise AppImportError(
            f"APP must look like module:attribute (for example tasks:router), got {target!r}"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules in the current directory
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AppImportError(f"cannot import {module_name!r}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppImportError(f"module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, App):
        return obj.router
    if not isinstance(obj, Router):
        raise AppImportError(f"{target} is a {type(obj).__name__}, not a taskkit Router or App")
    return obj


def _json_arg(text: str | None, kind: type, flag: str) -> Any:
    if text is None:
        return kind()
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"{flag} is not valid JSON: {exc}") from None
    if not isinstance(value, kind):
        raise ConfigurationError(f"{flag} must be a JSON {'list' if kind is list else 'object'}")
    return value


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


async def _with_broker(url: str | None, action: Callable[[Broker], Awaitable[int]]) -> int:
    broker = broker_from_url(url)
    async with broker:
        return await action(broker)


# -- commands ------------------------------------------------------------------------------------


def cmd_worker(args: argparse.Namespace) -> int:
    router = load_router(args.app)
    queues = [q.strip() for q in args.queues.split(",") if q.strip()] if args.queues else None
    fields: dict[str, Any] = {
        "queues": queues,
        "concurrency": args.concurrency,
        "lease_for": args.lease,
        "burst": args.burst,
        "grace_period": args.grace,
        "alert_webhook": args.alert_webhook,
        "alert_window": args.alert_window,
        "stall_after": args.stall_after,
    }
    if args.worker_id:
        fields["worker_id"] = args.worker_id
    try:
        settings = WorkerSettings(**fields)
    except ValidationError as exc:
        raise ConfigurationError(_first_error(exc)) from None

    async def run(broker: Broker) -> int:
        worker = Worker(router, broker, settings)
        if args.metrics_port is None:
            await worker.run(handle_signals=True)
            return 0
        from taskkit.metrics import attach

        server = attach(worker, args.metrics_port, args.metrics_host)
        async with anyio.create_task_group() as tg:
            port = await tg.start(server.serve)
            logging.getLogger("taskkit.worker").info(
                "serving /metrics, /healthz and /readyz on %s:%d", args.metrics_host, port
            )
            await worker.run(handle_signals=True)
            tg.cancel_scope.cancel()
        return 0

    async def connect_then_run() -> int:
        broker = broker_from_url(args.broker)
        await _connect_patiently(broker, give_up=settings.burst)
        try:
            return await run(broker)
        finally:
            await broker.close()

    return anyio.run(connect_then_run)


async def _connect_patiently(broker: Broker, *, give_up: bool) -> None:
    """A worker that starts before its broker waits for it (one log line, then backoff up to
    10 s) instead of exiting; ``give_up`` (burst mode) fails at once."""
    log = logging.getLogger("taskkit.worker")
    failures = 0
    while True:
        try:
            await broker.connect()
        except BrokerUnavailable as exc:
            if give_up:
                raise
            failures += 1
            if failures == 1:
                log.error("%s; waiting for the broker (retrying with backoff)", exc)
            await anyio.sleep(min(10.0, 0.2 * 2 ** min(failures, 6)))
            continue
        if failures:
            log.info("connected to %s after %d tries", redact_url(broker.url), failures + 1)
        return


def cmd_enqueue(args: argparse.Namespace) -> int:
    router = load_router(args.app)
    task = router.get(args.task)
    if task is None:
        known = ", ".join(router.names()) or "none"
        raise ConfigurationError(f"no task named {args.task!r} in {args.app} (known: {known})")
    task = task.options(queue=args.queue, delay=args.delay, dedupe_key=args.dedupe_key)
    call_args = _json_arg(args.args, list, "--args")
    call_kwargs = _json_arg(args.kwargs, dict, "--kwargs")

    async def run(broker: Broker) -> int:
        app = App(router, broker)
        job = task.build_job(tuple(call_args), call_kwargs, app.clock.now())
        [handle] = await app.enqueue_jobs([job])
        print(handle.id)
        return 0

    return anyio.run(_with_broker, args.broker, run)


def cmd_info(args: argparse.Namespace) -> int:
    async def run(broker: Broker) -> int:
        app = App(None, broker)
        stats = await broker.stats(app.clock.now())
        queues = {name: st.to_dict() for name, st in sorted(stats.items())}
        if args.json:
            _print_json({"broker": redact_url(broker.url), "queues": queues})
            return 0
        print(f"broker: {redact_url(broker.url)}")
        if not queues:
            print("no queues yet")
        for name, st in queues.items():
            state = " (paused)" if st["paused"] else ""
            print(
                f"{name}{state}: ready={st['ready']} scheduled={st['scheduled']} "
                f"running={st['running']} dead={st['dead']}"
            )
        return 0

    return anyio.run(_with_broker, args.broker, run)


def cmd_dead(args: argparse.Namespace) -> int:
    if args.queue:
        validate_queue_name(args.queue)
    ids: list[str] | None = args.id or None
    if args.action in ("requeue", "purge") and ids is None and not args.all:
        raise ConfigurationError(f"dead {args.action} needs --id ID (repeatable) or --all")

    async def run(broker: Broker) -> int:
        now = App(None, broker).clock.now()
        if args.action == "list":
            dead = await broker.list_dead(args.queue, args.limit)
            if ids is not None:
                dead = [d for d in dead if d.id in ids]
            if args.json:
                _print_json([d.to_dict() for d in dead])
            else:
                for d in dead:
                    first = (d.last_error or "").splitlines()[0] if d.last_error else ""
                    print(f"{d.id}  {d.queue}  {d.task}  attempts={d.attempts}  {first}")
                print(f"{len(dead)} dead job(s)")
            return 0
        if args.action == "requeue":
            done = await broker.requeue_dead(ids, args.queue, now)
            _report(args.json, "requeued", done)
        else:
            count = await broker.purge_dead(ids, args.queue)
            if args.json:
                _print_json({"purged": count})
            else:
                print(f"purged {count} dead job(s)")
        return 0

    return anyio.run(_with_broker, args.broker, run)


def cmd_alerts(args: argparse.Namespace) -> int:
    async def run(broker: Broker) -> int:
        alerts = await broker.list_alerts(pending_only=not args.all, limit=args.limit)
        if args.json:
            _print_json([a.to_dict() for a in alerts])
            return 0
        for a in alerts:
            state = f"pending x{a.count}" if a.count else "sent"
            tries = f"  failed {a.attempts}x: {a.last_error}" if a.attempts else ""
            first = a.detail.split("\n", 1)[0]
            print(f"{a.key}  {state}  last {_when(a.last_at)}  job={a.job_id}  {first}{tries}")
        print(f"{len(alerts)} {'alert(s)' if args.all else 'pending alert(s)'}")
        return 0

    return anyio.run(_with_broker, args.broker, run)


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _report(as_json: bool, verb: str, ids: Sequence[str]) -> None:
    if as_json:
        _print_json({verb: list(ids)})
    else:
        for job_id in ids:
            print(job_id)
        print(f"{verb} {len(ids)} job(s)")


def cmd_job(args: argparse.Namespace) -> int:
    async def run(broker: Broker) -> int:
        info = await App(None, broker).job(args.id)
        if info is None:
            raise JobNotFound(
                f"no job {args.id} (a job that completed without keep_result leaves no trace)"
            )
        data = info.to_dict()
        if args.json:
            _print_json(data)
            return 0
        for key in (
            "id",
            "task",
            "queue",
            "state",
            "attempts",
            "max_attempts",
            "run_at",
            "enqueued_at",
            "started_at",
            "finished_at",
            "dedupe_key",
            "progress",
            "result",
            "error",
        ):
            value = data[key]
            if value is not None:
                text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
                print(f"{key + ':':14}{text}")
        return 0

    return anyio.run(_with_broker, args.broker, run)


def cmd_cancel(args: argparse.Namespace) -> int:
    async def run(broker: Broker) -> int:
        state = await App(None, broker).cancel(args.id)
        if state is JobState.CANCELLED:
            print(f"{args.id}: cancelled")
            return 0
        if state is None:
            raise JobNotFound(f"no job {args.id}")
        note = (
            " (it was not interrupted and will finish on its own)"
            if state is JobState.RUNNING
            else ""
        )
        print(f"{args.id}: not cancelled, it is {state.value}{note}")
        return EXIT_FAILURE

    return anyio.run(_with_broker, args.broker, run)


def cmd_schedule(args: argparse.Namespace) -> int:
    router = load_router(args.app)
    now = time.time()
    rows = []
    for t in router:
        if t.settings.schedule is not None:
            nxt = t.settings.schedule.next_after(now)
            rows.append(
                {
                    "task": t.name,
                    "queue": t.settings.queue,
                    "schedule": str(t.settings.schedule),
                    "next_run": datetime.fromtimestamp(nxt, UTC).isoformat(),
                    "next_run_epoch": nxt,
                }
            )
    if args.json:
        _print_json(rows)
    elif not rows:
        print(f"no periodic tasks in {args.app}")
    for row in [] if args.json else rows:
        print(f"{row['task']}  {row['schedule']}  queue={row['queue']}  next={row['next_run']}")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    queue = validate_queue_name(args.queue)
    paused = args.command == "pause"

    async def run(broker: Broker) -> int:
        await broker.set_paused(queue, paused)
        print(f"{queue}: {'paused' if paused else 'resumed'}")
        return 0

    return anyio.run(_with_broker, args.broker, run)


def cmd_migrate(args: argparse.Namespace) -> int:
    broker = broker_from_url(args.broker)
    migrate = getattr(broker, "migrate", None)

    async def run() -> int:
        if migrate is None:
            print(f"{redact_url(broker.url)}: nothing to migrate (this broker sets itself up)")
            return 0
        applied = await migrate()
        print(
            f"{redact_url(broker.url)}: "
            + (f"applied {', '.join(applied)}" if applied else "up to date")
        )
        return 0

    return anyio.run(run)


# -- parsing -------------------------------------------------------------------------------------


def _broker_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--broker",
        metavar="URL",
        help="broker URL (default: $TASKKIT_BROKER_URL, else sqlite:///taskkit.db)",
    )


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default=os.environ.get("TASKKIT_LOG_LEVEL", "INFO"))
    common.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=os.environ.get("TASKKIT_LOG_FORMAT", "text"),
        help="json: one JSON object per line",
    )
    parser = argparse.ArgumentParser(prog="taskkit", description="Background tasks for Python.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("worker", parents=[common], help="run a worker")
    p.add_argument("app", metavar="APP", help="module:attribute of a Router or App")
    _broker_flag(p)
    p.add_argument("--queues", help="comma-separated queues (default: every queue the tasks use)")
    p.add_argument("--concurrency", type=int, default=10, help="jobs run at once (default 10)")
    p.add_argument(
        "--lease",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="lease per job, renewed by heartbeats (default 30)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM, how long running jobs may finish (default 10)",
    )
    p.add_argument(
        "--burst", action="store_true", help="exit 0 once nothing in the queues is ready or running"
    )
    p.add_argument("--worker-id", help="default: $TASKKIT_WORKER_ID, else host-pid-random")
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="N",
        help="serve /metrics, /healthz and /readyz on this port (0: any free port)",
    )
    p.add_argument("--metrics-host", default="0.0.0.0", metavar="HOST")
    p.add_argument(
        "--alert-webhook",
        metavar="URL",
        default=os.environ.get("TASKKIT_ALERT_WEBHOOK"),
        help="POST dead-letter and stall alerts here as JSON (default: $TASKKIT_ALERT_WEBHOOK)",
    )
    p.add_argument(
        "--alert-window",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="after an alert is sent, its key stays quiet this long (default 3600)",
    )
    p.add_argument(
        "--stall-after",
        type=float,
        metavar="SECONDS",
        help="alert when a queue's oldest ready job has waited longer than this",
    )
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("alerts", parents=[common], help="the alert outbox")
    p.add_argument("action", choices=["list"])
    _broker_flag(p)
    p.add_argument("--all", action="store_true", help="also alerts already delivered")
    p.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_alerts)

    p = sub.add_parser("enqueue", parents=[common], help="enqueue one job and print its id")
    p.add_argument("app", metavar="APP")
    p.add_argument("task", metavar="TASK_NAME")
    p.add_argument("--args", metavar="JSON_LIST")
    p.add_argument("--kwargs", metavar="JSON_OBJECT")
    p.add_argument("--delay", type=float, metavar="SECONDS")
    p.add_argument("--queue", metavar="Q")
    p.add_argument("--dedupe-key", metavar="K")
    _broker_flag(p)
    p.set_defaults(func=cmd_enqueue)

    p = sub.add_parser("job", parents=[common], help="show one job's state")
    p.add_argument("id", metavar="ID")
    _broker_flag(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_job)

    p = sub.add_parser("cancel", parents=[common], help="cancel a pending or scheduled job")
    p.add_argument("id", metavar="ID")
    _broker_flag(p)
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("schedule", parents=[common], help="periodic tasks and their next run")
    p.add_argument("action", choices=["list"])
    p.add_argument("app", metavar="APP")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_schedule)

    p = sub.add_parser("info", parents=[common], help="jobs per queue and state")
    _broker_flag(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("dead", parents=[common], help="list, requeue or purge dead letters")
    p.add_argument("action", choices=["list", "requeue", "purge"])
    _broker_flag(p)
    p.add_argument("--queue", metavar="Q")
    p.add_argument("--id", action="append", metavar="ID", help="a job id (repeatable)")
    p.add_argument("--all", action="store_true", help="every dead job (of --queue, if given)")
    p.add_argument("--limit", type=int, default=100, help="list at most this many (default 100)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_dead)

    for name, text in (("pause", "stop workers claiming from a queue"), ("resume", "undo pause")):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("queue", metavar="QUEUE")
        _broker_flag(p)
        p.set_defaults(func=cmd_pause)

    p = sub.add_parser("migrate", parents=[common], help="create or upgrade the broker's tables")
    _broker_flag(p)
    p.set_defaults(func=cmd_migrate)
    return parser


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    message = err["msg"].removeprefix("Value error, ")  # our validators' messages stand alone
    return f"{'.'.join(str(p) for p in err['loc'])}: {message}"


def _unwrap_groups(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    # Task groups wrap errors in ExceptionGroups; a user should see the one line inside.
    try:
        return func(args)
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        first = next((e for e in leaves if isinstance(e, TaskkitError)), None)
        if first is not None:
            raise first from None
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        code: int = _unwrap_groups(args.func, args)
    except ConfigurationError as exc:
        print(f"taskkit: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TaskkitError as exc:
        print(f"taskkit: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    raise SystemExit(main())
