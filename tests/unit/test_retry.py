from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskkit.errors import JobTimeout
from taskkit.outcome import DeadLetter, Retry
from taskkit.retry import Backoff, RetryPolicy, describe_error


def test_backoff_is_exponential_and_capped() -> None:
    b = Backoff()
    assert [b.delay(n) for n in (1, 2, 3, 4)] == [5, 10, 20, 40]
    assert b.delay(99) == 600
    assert b.delay(10**9) == 600


@given(st.integers(min_value=1, max_value=10**6))
def test_jittered_backoff_stays_within_half_and_full_delay(attempts: int) -> None:
    plain, jittered = Backoff().delay(attempts), Backoff(jitter=True).delay(attempts)
    assert plain / 2 <= jittered <= plain <= 600


@given(st.integers(min_value=1, max_value=10**6), st.integers(min_value=1, max_value=50))
def test_decide_retries_exactly_while_attempts_remain(attempts: int, max_attempts: int) -> None:
    outcome = RetryPolicy(max_attempts=max_attempts).decide(ValueError("x"), attempts, 100.0)
    if attempts < max_attempts:
        assert isinstance(outcome, Retry) and outcome.run_at == 100.0 + Backoff().delay(attempts)
    else:
        assert isinstance(outcome, DeadLetter)


def test_retry_on_and_dead_on_choose_the_path() -> None:
    policy = RetryPolicy(max_attempts=5, retry_on=(ConnectionError,), dead_on=(PermissionError,))
    assert isinstance(policy.decide(ConnectionError("x"), 1, 0), Retry)
    assert isinstance(policy.decide(ValueError("x"), 1, 0), DeadLetter)
    assert isinstance(policy.decide(PermissionError("x"), 1, 0), DeadLetter)
    assert isinstance(policy.decide(JobTimeout("slow"), 1, 0), Retry), "timeouts always retry"


def test_describe_error_survives_a_raising_str() -> None:
    class Nasty(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert describe_error(Nasty()).startswith("Nasty: <str() of the exception raised RuntimeError>")


def test_describe_error_keeps_the_users_frames() -> None:
    def user_code() -> None:
        raise KeyError("k")

    try:
        user_code()
    except KeyError as exc:
        text = describe_error(exc)
    assert text.startswith("KeyError: 'k'") and "user_code" in text


@pytest.mark.parametrize("attempts", [1, 2])
def test_lost_run_retries_now_until_attempts_are_used(attempts: int) -> None:
    outcome = RetryPolicy().lost_run(attempts, 2, 50.0)
    assert isinstance(outcome, Retry if attempts < 2 else DeadLetter)
