"""Router: the registry of tasks by name that a worker serves and a producer enqueues from."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator
from typing import Any, ParamSpec, TypeVar, overload

from typing_extensions import Unpack

from taskkit.errors import ConfigurationError, DuplicateTaskName
from taskkit.job import validate_queue_name
from taskkit.middleware import Middleware
from taskkit.task import Task, TaskArgs, TaskDecorator, decorate

P = ParamSpec("P")
R = TypeVar("R")


class Router:
    """Tasks by name. ``@router.task`` registers a function; ``include`` merges another router."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task[Any, Any]] = {}
        self.middleware: list[Middleware] = []
        self.queue_limits: dict[str, int] = {}  # queue -> jobs running at once, fleet-wide

    def __repr__(self) -> str:
        return f"<Router tasks={sorted(self._tasks)}>"

    def __iter__(self) -> Iterator[Task[Any, Any]]:
        return iter(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    @overload
    def task(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Task[P, R]: ...
    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...
    @overload
    def task(self, /, **options: Unpack[TaskArgs]) -> TaskDecorator: ...
    def task(
        self, fn: Callable[..., Any] | None = None, /, **options: Unpack[TaskArgs]
    ) -> Task[Any, Any] | TaskDecorator:
        """Register a function as a task: ``@router.task`` or ``@router.task(queue="mail")``.

        Options: ``name`` (default ``module.function``), ``queue``, ``priority`` (higher runs
        first), ``max_attempts`` (executions, default 3), ``backoff`` (default 5 s doubling,
        capped at 600 s), ``retry_on`` / ``dead_on`` (exception types that retry / go straight to
        the dead letters), ``timeout`` (seconds), ``keep_result`` (seconds to keep the result),
        ``cron`` or ``every`` (seconds) with ``timezone`` for periodic tasks (taskkit.schedule),
        ``rate_limit`` (``"60/m"``) and ``concurrency`` (jobs running at once), both shared by
        every worker of the broker (taskkit.limits).
        """
        return decorate(fn, options, self.register)

    def register(self, task: Task[P, R]) -> Task[P, R]:
        """Add a task made with the bare ``@task``. Refuses a second definition of a name."""
        existing = self._tasks.get(task.name)
        if existing is not None and not _same_definition(existing, task):
            raise DuplicateTaskName(
                f"task name {task.name!r} is defined twice: {existing.definition} and "
                f"{task.definition}; give one of them another name with name=..."
            )
        self._tasks[task.name] = task
        return task

    def limit_queue(self, queue: str, *, concurrency: int) -> None:
        """Let at most ``concurrency`` jobs of ``queue`` run at once across every worker."""
        validate_queue_name(queue)
        if concurrency < 1:
            raise ConfigurationError(f"concurrency must be at least 1, got {concurrency}")
        self.queue_limits[queue] = concurrency

    def include(self, other: Router) -> None:
        """Register every task of ``other`` here (names must not clash), its middleware and its
        queue limits."""
        for t in other:
            self.register(t)
        self.queue_limits.update(other.queue_limits)
        self.middleware.extend(m for m in other.middleware if m not in self.middleware)

    def use(self, middleware: Middleware) -> None:
        """Add hooks that producers and workers of this router call (see taskkit.middleware)."""
        self.middleware.append(middleware)

    def get(self, name: str) -> Task[Any, Any] | None:
        return self._tasks.get(name)

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def queues(self) -> list[str]:
        """Every queue the registered tasks use, in a stable order."""
        return sorted({t.settings.queue for t in self._tasks.values()})


def _same_definition(a: Task[Any, Any], b: Task[Any, Any]) -> bool:
    # The same function seen twice (a module imported under two names) is not a clash.
    return a.fn is b.fn or a.definition == b.definition
