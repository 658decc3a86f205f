"""``@task``: a function (async or plain) with a name and the options the worker runs it under.

A ``Task`` keeps the function's signature in its type (``Task[P, R]``), so producer calls such as
``await app.enqueue(send_email, "a@example.com", retries=3)`` are checked by mypy against the
function's parameters. Arguments are checked again with pydantic at enqueue time and at run time.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import typing
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypedDict, TypeVar, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from pydantic_core import to_jsonable_python
from typing_extensions import Unpack

from taskkit.errors import ArgumentsInvalid, ConfigurationError, EnqueueError, PayloadInvalid
from taskkit.job import (
    DEFAULT_QUEUE,
    Job,
    check_payload_size,
    new_job_id,
    validate_queue_name,
    validate_task_name,
)
from taskkit.limits import RateLimit
from taskkit.retry import DEFAULT_MAX_ATTEMPTS, Backoff, RetryPolicy
from taskkit.schedule import Schedule, tick_job_id

P = ParamSpec("P")
R = TypeVar("R")
# json.dumps with options builds an encoder per call; one shared encoder costs a third as much.
_STRICT_JSON = json.JSONEncoder(allow_nan=False)


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """How the worker runs a task, and the defaults its jobs are enqueued with."""

    queue: str = DEFAULT_QUEUE
    priority: int = 0
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    timeout: float | None = None
    keep_result: float | None = None  # seconds to keep the return value; None keeps nothing
    schedule: Schedule | None = None  # periodic tasks: when the workers enqueue them
    rate_limit: RateLimit | None = None  # runs per period across every worker (taskkit.limits)
    concurrency: int | None = None  # jobs of this task running at once across every worker


@dataclass(frozen=True, slots=True)
class EnqueueOptions:
    """Per-call overrides set with ``task.options(...)``."""

    queue: str | None = None
    priority: int | None = None
    delay: float | None = None
    run_at: float | None = None
    dedupe_key: str | None = None
    max_attempts: int | None = None


class Task(Generic[P, R]):
    """A registered unit of work. Calling it runs the function directly, in this process."""

    def __init__(
        self,
        fn: Callable[P, Awaitable[R]] | Callable[P, R],
        name: str,
        options: TaskOptions,
        enqueue_options: EnqueueOptions | None = None,
    ) -> None:
        self.fn = fn
        self.name = validate_task_name(name)
        self.settings = options
        self.enqueue_options = enqueue_options or EnqueueOptions()
        self.is_async = inspect.iscoroutinefunction(fn)
        self._signature = inspect.signature(fn)
        self._model = _arguments_model(fn, self._signature, name)
        if options.schedule is not None:
            try:
                self._signature.bind()
            except TypeError:
                raise ConfigurationError(
                    f"periodic task {name} must be callable without arguments"
                ) from None

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.settings.queue}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R] | R:
        return self.fn(*args, **kwargs)

    @property
    def definition(self) -> str:
        """Where the function is defined, for error messages: ``module.qualname (file:line)``."""
        code = getattr(self.fn, "__code__", None)
        where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
        return f"{self.fn.__module__}.{self.fn.__qualname__}{where}"

    def options(
        self,
        *,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
        run_at: float | None = None,
        dedupe_key: str | None = None,
        max_attempts: int | None = None,
    ) -> Task[P, R]:
        """A copy of this task whose next enqueue uses these options; the signature is kept, so
        ``app.enqueue(send.options(delay=60), "a@example.com")`` is still type-checked."""
        if queue is not None:
            validate_queue_name(queue)
        if max_attempts is not None and max_attempts < 1:
            raise ConfigurationError("max_attempts must be at least 1")
        if priority is not None and not isinstance(priority, int):
            raise ConfigurationError(f"priority must be an int, got {priority!r}")
        if dedupe_key is not None and not (
            isinstance(dedupe_key, str) and 0 < len(dedupe_key) <= 512
        ):
            raise ConfigurationError("dedupe_key must be a string of 1-512 characters")
        overrides = EnqueueOptions(queue, priority, delay, run_at, dedupe_key, max_attempts)
        merged = dataclasses.replace(
            self.enqueue_options,
            **{k: v for k, v in dataclasses.asdict(overrides).items() if v is not None},
        )
        return Task(self.fn, self.name, self.settings, merged)

    # -- the producer side -------------------------------------------------------------------

    def tick_job(self, tick: float, now: float) -> Job:
        """The job for one tick of a periodic task (see taskkit.schedule)."""
        assert self.settings.schedule is not None
        keep = max(self.settings.keep_result or 0.0, self.settings.schedule.retention())
        return Job(
            id=tick_job_id(self.name, tick),
            task=self.name,
            queue=self.settings.queue,
            priority=self.settings.priority,
            run_at=tick,
            enqueued_at=now,
            keep_result=keep,
        )

    def call(self, *args: P.args, **kwargs: P.kwargs) -> TaskCall[R]:
        """One call of this task, checked by mypy, for ``app.enqueue_many([...])``."""
        return TaskCall(self, args, kwargs)

    def build_job(self, args: tuple[Any, ...], kwargs: dict[str, Any], now: float) -> Job:
        """The job for a call with these arguments. Raises ArgumentsInvalid when they do not fit
        the signature, EnqueueError when they cannot be sent as JSON. Nothing is stored."""
        self.check_arguments(args, kwargs)
        wire_args: list[Any] = []
        wire_kwargs: dict[str, Any] = {}
        if args or kwargs:  # a call without arguments has nothing to convert or measure
            try:
                wire_args = to_jsonable_python(list(args))
                wire_kwargs = to_jsonable_python(kwargs)
                encoded = _STRICT_JSON.encode([wire_args, wire_kwargs])
            except (TypeError, ValueError, RecursionError) as exc:
                raise EnqueueError(
                    f"arguments of {self.name} cannot be sent as JSON: {exc}; pass plain data "
                    "(str, int, float, bool, None, lists, dicts) or pydantic models"
                ) from None
            try:
                check_payload_size(len(encoded))
            except PayloadInvalid as exc:
                raise EnqueueError(f"{self.name}: {exc}") from None
        opts = self.enqueue_options
        run_at = opts.run_at
        if opts.delay is not None:
            run_at = now + opts.delay
        # Every field was checked when the task and its options were made, and the arguments
        # just now: skip a second validation of the envelope (a third of an enqueue's CPU).
        return Job.trusted(
            id=new_job_id(),
            task=self.name,
            args=wire_args,
            kwargs=wire_kwargs,
            queue=opts.queue or self.settings.queue,
            priority=self.settings.priority if opts.priority is None else opts.priority,
            max_attempts=opts.max_attempts,
            dedupe_key=opts.dedupe_key,
            run_at=run_at,
            enqueued_at=now,
        )

    def check_arguments(
        self, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        """Bind and validate arguments; returns them coerced to the annotated types.
        Raises ArgumentsInvalid naming the argument at fault."""
        if not args and not kwargs and not self._signature.parameters:
            return [], {}  # the common no-argument task skips binding
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise ArgumentsInvalid(f"{self.name}: {exc}") from None
        if self._model is None:
            return list(bound.args), dict(bound.kwargs)
        named = {
            k: v
            for k, v in bound.arguments.items()
            if self._signature.parameters[k].kind
            not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        }
        try:
            checked = self._model.model_validate(named)
        except ValidationError as exc:
            problems = "; ".join(
                f"argument {'.'.join(str(p) for p in e['loc'])!r}: {e['msg']}"
                for e in exc.errors()[:5]
            )
            raise ArgumentsInvalid(f"{self.name}: {problems}") from None
        for k in named:
            bound.arguments[k] = getattr(checked, k)
        return list(bound.args), dict(bound.kwargs)

    # -- the worker side ---------------------------------------------------------------------

    async def invoke(self, args: list[Any], kwargs: dict[str, Any]) -> R:
        """Run an async function on the event loop. Plain functions go through the worker's
        thread pool instead (see taskkit.worker)."""
        result = self.fn(*args, **kwargs)
        return await typing.cast(Awaitable[R], result)


@dataclass(frozen=True, slots=True)
class TaskCall(Generic[R]):
    """A task with its arguments, not yet enqueued (see ``Task.call``)."""

    task: Task[Any, R]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def build_job(self, now: float) -> Job:
        return self.task.build_job(self.args, self.kwargs, now)


def _arguments_model(
    fn: Callable[..., Any], signature: inspect.Signature, name: str
) -> type[BaseModel] | None:
    """A pydantic model of the function's named parameters, or None when there are none."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: fall back to no type checking
        hints = {}
    fields: dict[str, Any] = {}
    for pname, param in signature.parameters.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        annotation = hints.get(pname, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (annotation, default)
    if not fields:
        return None
    safe = "".join(c if c.isalnum() else "_" for c in name)
    try:
        return create_model(
            f"Args_{safe}", __config__=ConfigDict(arbitrary_types_allowed=True), **fields
        )
    except Exception as exc:
        raise ConfigurationError(f"task {name}: cannot build an argument validator: {exc}") from exc


def default_task_name(fn: Callable[..., Any]) -> str:
    """``module.function``, the name a task gets unless ``name=`` is given."""
    return f"{fn.__module__}.{fn.__qualname__}"


class TaskArgs(TypedDict, total=False):
    """The keyword options of ``@task(...)`` and ``@router.task(...)``."""

    name: str | None
    queue: str
    priority: int
    max_attempts: int
    backoff: Backoff | None
    retry_on: tuple[type[BaseException], ...]
    dead_on: tuple[type[BaseException], ...]
    timeout: float | None
    keep_result: float | None
    cron: str | None
    every: float | None
    timezone: str
    rate_limit: str | None
    concurrency: int | None


def make_options(
    *,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    backoff: Backoff | None = None,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    dead_on: tuple[type[BaseException], ...] = (),
    timeout: float | None = None,
    keep_result: float | None = None,
    cron: str | None = None,
    every: float | None = None,
    timezone: str = "UTC",
    rate_limit: str | None = None,
    concurrency: int | None = None,
) -> TaskOptions:
    """Validate decorator arguments (``TaskArgs`` less the name) into TaskOptions."""
    validate_queue_name(queue)
    if max_attempts < 1:
        raise ConfigurationError(f"max_attempts must be at least 1, got {max_attempts}")
    if timeout is not None and timeout <= 0:
        raise ConfigurationError(f"timeout must be positive, got {timeout}")
    policy = RetryPolicy(max_attempts, backoff or Backoff(), tuple(retry_on), tuple(dead_on))
    if concurrency is not None and concurrency < 1:
        raise ConfigurationError(f"concurrency must be at least 1, got {concurrency}")
    schedule = None if cron is None and every is None else Schedule(cron, every, timezone)
    rate = None if rate_limit is None else RateLimit.parse(rate_limit)
    return TaskOptions(queue, priority, policy, timeout, keep_result, schedule, rate, concurrency)


class TaskDecorator:
    """What ``@task(...)`` returns before it sees the function."""

    def __init__(
        self,
        name: str | None,
        options: TaskOptions,
        register: Callable[[Task[Any, Any]], object] | None,
    ) -> None:
        self._name = name
        self._options = options
        self._register = register

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]]) -> Task[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R]) -> Task[P, R]: ...
    def __call__(self, fn: Callable[P, Any]) -> Task[P, Any]:
        t: Task[P, Any] = Task(fn, self._name or default_task_name(fn), self._options)
        if self._register is not None:
            self._register(t)
        return t


@overload
def task(fn: Callable[P, Coroutine[Any, Any, R]], /) -> Task[P, R]: ...
@overload
def task(fn: Callable[P, R], /) -> Task[P, R]: ...
@overload
def task(**options: Unpack[TaskArgs]) -> TaskDecorator: ...
def task(
    fn: Callable[..., Any] | None = None, /, **options: Unpack[TaskArgs]
) -> Task[Any, Any] | TaskDecorator:
    """Make a task that a router can register later (``router.register(t)``).

    Use bare (``@task``) or with options (``@task(queue="mail", max_attempts=5)``).
    """
    return decorate(fn, options, None)


def decorate(
    fn: Callable[..., Any] | None,
    options: TaskArgs,
    register: Callable[[Task[Any, Any]], object] | None,
) -> Task[Any, Any] | TaskDecorator:
    """The body of every task decorator: bare use gets the function, use with options not."""
    settings = dict(options)
    name = settings.pop("name", None)
    decorator = TaskDecorator(name, make_options(**settings), register)  # type: ignore[arg-type]
    return decorator(fn) if fn is not None else decorator
