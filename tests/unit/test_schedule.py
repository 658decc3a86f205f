from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from taskkit import Router
from taskkit.errors import ConfigurationError
from taskkit.schedule import Schedule, tick_job_id

SEOUL = ZoneInfo("Asia/Seoul")


def ts(*args: int, tz: ZoneInfo = SEOUL) -> float:
    return datetime(*args, tzinfo=tz).timestamp()


def test_intervals_tick_on_multiples_of_the_period() -> None:
    s = Schedule(every=30)
    assert s.latest_at_or_before(1000.0) == 990.0
    assert s.latest_at_or_before(990.0) == 990.0
    assert s.next_after(990.0) == 1020.0
    assert s.retention() == 2 * 30 + 600


def test_cron_ticks_in_the_tasks_time_zone() -> None:
    s = Schedule(cron="0 9 * * *", timezone="Asia/Seoul")
    assert s.latest_at_or_before(ts(2026, 11, 29, 10, 0)) == ts(2026, 11, 29, 9, 0)
    assert s.latest_at_or_before(ts(2026, 11, 29, 9, 0)) == ts(2026, 11, 29, 9, 0)
    assert s.next_after(ts(2026, 11, 29, 9, 0)) == ts(2026, 11, 30, 9, 0)
    assert s.period == 86_400


def test_cron_across_a_daylight_saving_change() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    s = Schedule(cron="30 2 * * *", timezone="Europe/Berlin")
    # 2026-03-29 02:30 does not exist in Berlin; cronsim runs it when the clock jumps.
    before = ts(2026, 3, 28, 12, 0, tz=berlin)
    after = s.next_after(before)
    assert ts(2026, 3, 29, 1, 0, tz=berlin) < after <= ts(2026, 3, 29, 4, 0, tz=berlin)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "61 * * * *"}, "bad cron expression"),
        ({"cron": "* * *"}, "bad cron expression"),
        ({"cron": "* * * * *", "every": 5}, "not both"),
        ({"every": 0}, "positive"),
        ({"every": 5, "timezone": "Mars/Olympus"}, "unknown time zone"),
    ],
)
def test_bad_schedules_are_refused_at_declaration(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Router().task(name="p", **kwargs)(lambda: None)  # type: ignore[call-overload]


def test_a_periodic_task_must_take_no_arguments() -> None:
    def needs(x: int) -> None: ...

    with pytest.raises(ConfigurationError, match="without arguments"):
        Router().task(every=5)(needs)


def test_a_ticks_job_id_is_the_same_everywhere_and_differs_per_tick() -> None:
    assert tick_job_id("a", 60.0) == tick_job_id("a", 60.0)
    assert len({tick_job_id("a", 60.0), tick_job_id("a", 120.0), tick_job_id("b", 60.0)}) == 3
