"""The one place that decides what a failure means: retry later, or dead letter.

Brokers never compare attempts with max_attempts; they apply the frozen ``Outcome`` decided here.
"""

from __future__ import annotations

import os
import random
import traceback
from dataclasses import dataclass, field

import anyio

from taskkit.context import Retry as RetryRequest
from taskkit.context import Snooze
from taskkit.errors import JobTimeout
from taskkit.outcome import DeadLetter, Outcome, Retry

DEFAULT_MAX_ATTEMPTS = 3
_MAX_ERROR_CHARS = 8_000
# Frames of the worker and of anyio say nothing about why a task failed; tracebacks skip them.
_PLUMBING = (os.path.dirname(__file__), os.path.dirname(anyio.__file__))


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff: ``base * factor ** (attempts - 1)``, capped at ``cap`` seconds.

    The default is seed 003's schedule: 5 s, 10 s, 20 s, ... up to 600 s. With ``jitter`` the
    delay is drawn uniformly from [delay/2, delay] so a burst of failures does not return at once.
    """

    base: float = 5.0
    factor: float = 2.0
    cap: float = 600.0
    jitter: bool = False

    def delay(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th failed execution (1-based)."""
        exponent = max(0, attempts - 1)
        # Far past the cap: skip the power so a huge attempt count cannot overflow a float.
        if exponent > 64:
            raw = self.cap
        else:
            raw = min(self.cap, self.base * self.factor**exponent)
        if self.jitter:
            return random.uniform(raw / 2, raw)
        return raw


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a task's failures are handled.

    ``max_attempts`` counts executions (3 means at most 3 runs). An exception that is an instance
    of ``dead_on`` goes to the dead letters at once; otherwise one that is an instance of
    ``retry_on`` is retried while attempts remain; anything else is dead at once.
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff: Backoff = field(default_factory=Backoff)
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    dead_on: tuple[type[BaseException], ...] = ()

    def decide(self, exc: BaseException, attempts: int, now: float) -> Outcome:
        """The outcome for a run that raised ``exc`` after ``attempts`` executions.

        ``Snooze`` puts the job back without using the attempt; ``Retry`` (the exception) uses
        the attempt but picks its own delay; anything else follows retry_on/dead_on/backoff.
        """
        if isinstance(exc, Snooze):
            return Retry(now + exc.seconds, f"Snooze: {exc}", charge_attempt=False)
        requested = isinstance(exc, RetryRequest)
        error = describe_error(exc.__cause__ if requested and exc.__cause__ else exc)
        if not requested and not self.is_retryable(exc):
            return DeadLetter(error)
        if attempts >= self.max_attempts:
            return DeadLetter(
                f"{error}\n(gave up after {attempts} of {self.max_attempts} attempts)"
            )
        delay = exc.seconds if isinstance(exc, RetryRequest) else self.backoff.delay(attempts)
        return Retry(now + delay, error)

    def is_retryable(self, exc: BaseException) -> bool:
        if isinstance(exc, JobTimeout):
            return not isinstance(exc, self.dead_on)
        return isinstance(exc, self.retry_on) and not isinstance(exc, self.dead_on)

    def lost_run(self, attempts: int, max_attempts: int, now: float) -> Outcome:
        """The outcome for a job whose worker vanished mid-run (its lease ran out)."""
        error = "LeaseExpired: the worker running this job stopped heartbeating (crashed or killed)"
        if attempts >= max_attempts:
            return DeadLetter(f"{error}\n(gave up after {attempts} of {max_attempts} attempts)")
        return Retry(now, error)


def describe_error(exc: BaseException) -> str:
    """``Type: message`` plus the traceback, safe even when the exception's ``__str__`` raises."""
    try:
        message = str(exc)
    except Exception as inner:  # a broken __str__ must not take the worker down
        message = f"<str() of the exception raised {type(inner).__name__}>"
    head = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    try:
        frames = [
            f
            for f in traceback.extract_tb(exc.__traceback__)
            if not f.filename.startswith(_PLUMBING)
        ]
        tb = "".join(traceback.format_list(frames))
    except Exception:
        tb = ""
    text = f"{head}\n{tb}".rstrip() if tb else head
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 3] + "..."
