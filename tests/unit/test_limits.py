"""Declaring limits: rate strings and concurrency values are checked when the task is made."""

from __future__ import annotations

import pytest

from taskkit import Router
from taskkit.errors import ConfigurationError
from taskkit.limits import Parked, RateLimit


def test_rate_limits_parse_or_say_how_to_write_them() -> None:
    assert RateLimit.parse("60/m").interval == 1.0
    assert RateLimit.parse("10/s").interval == 0.1
    assert RateLimit.parse("3/10s").interval == pytest.approx(10 / 3)
    assert RateLimit.parse("1000/h").interval == 3.6
    for bad in ("60", "0/s", "ten/s", "5/w", "5/0s"):
        with pytest.raises(ConfigurationError, match="COUNT/PERIOD"):
            RateLimit.parse(bad)
    with pytest.raises(ConfigurationError, match="concurrency must be at least 1"):
        Router().task(concurrency=0)


def test_parked_jobs_spread_over_a_wait_that_grows_with_the_backlog() -> None:
    parked = Parked()
    delays = [parked.snooze_for("k", 1.0, 0.5, now=100.0) for _ in range(20)]
    assert 1.0 <= delays[0] <= 1.05  # the first in line waits only for the free time
    assert all(1.0 + 0.5 * i <= d <= 1.0 + 0.5 * (i + 1) for i, d in enumerate(delays) if i)
    assert parked.waiting("k", 100.0) == 20
    assert parked.waiting("k", 100.0 + 1.0 + 0.5 * 21) == 0  # all back by then
