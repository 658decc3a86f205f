"""Each module here knows how to give a test an isolated space on one broker.

A backend module exposes ``NAME`` and ``space(test_id, tmp_path)``: an async context manager
yielding a ``BrokerSpace``. ``url`` must reach the same isolated space from any process (tests
start worker subprocesses with it), or be None when the backend lives only in this process
(fakeredis). ``make()`` builds another, not yet connected, broker on the same space: several
instances stand for several workers. The space is removed when the context exits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from taskkit.broker import Broker


@dataclass
class BrokerSpace:
    name: str
    url: str | None
    make: Callable[[], Broker]
