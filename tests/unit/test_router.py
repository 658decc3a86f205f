from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from taskkit import Router, task
from taskkit.errors import ArgumentsInvalid, ConfigurationError, DuplicateTaskName, EnqueueError


async def fetch(url: str, retries: int = 3) -> str:
    return url


def test_names_default_to_module_and_function_and_can_be_overridden() -> None:
    router = Router()
    t = router.task(fetch)
    named = router.task(name="net.fetch")(fetch)
    assert t.name == f"{__name__}.fetch" and named.name == "net.fetch"
    assert router.names() == sorted([t.name, "net.fetch"])


def test_a_duplicate_name_is_refused_naming_both_definitions() -> None:
    router = Router()
    router.task(name="dup")(fetch)

    def other() -> None: ...

    with pytest.raises(DuplicateTaskName) as err:
        router.task(name="dup")(other)
    assert "fetch" in str(err.value) and "other" in str(err.value) and __file__ in str(err.value)


def test_bare_task_is_registered_later_and_include_merges_routers() -> None:
    bare = task(name="later", queue="mail", max_attempts=7)(fetch)
    sub = Router()
    sub.register(bare)
    main = Router()
    main.include(sub)
    assert main.get("later") is bare and main.queues() == ["mail"]
    assert bare.settings.policy.max_attempts == 7


def test_plain_and_async_functions_are_both_tasks() -> None:
    router = Router()

    @router.task
    def plain(x: int) -> int:
        return x

    assert plain(3) == 3 and not plain.is_async and router.task(fetch).is_async


def test_arguments_are_checked_at_enqueue_naming_the_argument() -> None:
    t = Router().task(fetch)
    with pytest.raises(ArgumentsInvalid, match="retries"):
        t.build_job(("u",), {"retries": "many"}, 0.0)
    with pytest.raises(ArgumentsInvalid, match="unexpected keyword argument 'nope'"):
        t.build_job(("u",), {"nope": 1}, 0.0)
    with pytest.raises(ArgumentsInvalid, match="missing a required argument: 'url'"):
        t.build_job((), {}, 0.0)


def test_arguments_that_are_not_json_are_refused() -> None:
    @Router().task
    def takes(x: object) -> None: ...

    with pytest.raises(EnqueueError, match="JSON"):
        takes.build_job((object(),), {}, 0.0)


class Point(BaseModel):
    x: int
    y: int


def test_pydantic_models_travel_as_json_and_come_back_as_models() -> None:
    @Router().task
    def area(p: Point) -> int:
        return p.x * p.y

    job = area.build_job((Point(x=2, y=3),), {}, 0.0)
    assert json.loads(job.to_wire())["args"] == [{"x": 2, "y": 3}]
    args, _ = area.check_arguments(job.args, job.kwargs)
    assert args == [Point(x=2, y=3)]


def test_options_override_per_call_and_keep_the_task() -> None:
    t = Router().task(queue="a", priority=1)(fetch)
    job = t.options(queue="b", delay=10, dedupe_key="k", max_attempts=2).build_job(
        ("u",), {}, 100.0
    )
    assert (job.queue, job.run_at, job.dedupe_key, job.max_attempts, job.priority) == (
        "b",
        110.0,
        "k",
        2,
        1,
    )
    assert t.build_job(("u",), {}, 0.0).queue == "a"


def test_a_bad_task_name_is_refused_when_the_task_is_made() -> None:
    with pytest.raises(ConfigurationError, match="invalid task name 'two words'"):

        @Router().task(name="two words")
        def f() -> None: ...


def test_enqueue_options_are_checked_when_set() -> None:
    @Router().task(name="t.opt")
    def f() -> None: ...

    with pytest.raises(ConfigurationError, match="dedupe_key"):
        f.options(dedupe_key="x" * 513)
    with pytest.raises(ConfigurationError, match="priority"):
        f.options(priority="high")  # type: ignore[arg-type]
