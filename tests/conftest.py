"""Fixtures shared by every test: the broker matrix and a fake clock.

``space`` is parametrized over every backend in tests/backends/ (memory, sqlite, redis,
fakeredis, postgres, ...). Pick a subset with TASKKIT_TEST_BROKERS=memory,sqlite. A backend whose
server is unreachable fails its tests: it is never skipped.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from taskkit.broker import Broker
from taskkit.testing import FakeClock
from tests import backends, servers
from tests.backends import BrokerSpace


def _backend_names() -> list[str]:
    found: list[str] = []
    for info in pkgutil.iter_modules(backends.__path__):
        module = importlib.import_module(f"tests.backends.{info.name}")
        names = getattr(module, "NAMES", None) or [module.NAME]
        found.extend(names)
    wanted = os.environ.get("TASKKIT_TEST_BROKERS")
    if wanted:
        chosen = [n.strip() for n in wanted.split(",") if n.strip()]
        unknown = set(chosen) - set(found)
        if unknown:
            raise pytest.UsageError(f"TASKKIT_TEST_BROKERS names unknown backends: {unknown}")
        return chosen
    return sorted(found)


BACKENDS = _backend_names()
# Backends a separate process can reach by URL (worker subprocesses, the CLI).
SERVER_BACKENDS = [name for name in BACKENDS if name in ("sqlite", "redis", "postgres")]


def _backend_module(name: str) -> Any:
    for info in pkgutil.iter_modules(backends.__path__):
        module = importlib.import_module(f"tests.backends.{info.name}")
        if name in (getattr(module, "NAMES", None) or [module.NAME]):
            return module
    raise LookupError(name)


def pytest_configure(config: pytest.Config) -> None:
    # Before any test connects: use the servers at the test URLs, or start throwaway ones.
    if "redis" in BACKENDS:
        servers.ensure_redis()
    if "postgres" in BACKENDS:
        servers.ensure_postgres()


@pytest.fixture
def anyio_backend() -> str:
    # redis.asyncio and asyncpg are asyncio libraries.
    return "asyncio"


def _test_id(request: pytest.FixtureRequest) -> str:
    raw = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[-40:].strip("_")
    return f"t{os.getpid()}_{raw}"


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def space(
    backend_name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[BrokerSpace]:
    """An isolated place on one broker for this test."""
    module = _backend_module(backend_name)
    async with module.space(_test_id(request), tmp_path, **_kw(module, backend_name)) as sp:
        yield sp


def _kw(module: Any, name: str) -> dict[str, Any]:
    return {"variant": name} if getattr(module, "NAMES", None) else {}


@pytest.fixture(params=SERVER_BACKENDS)
async def server_space(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[BrokerSpace]:
    """Like ``space``, for backends that other processes reach through ``space.url``."""
    module = _backend_module(request.param)
    async with module.space(_test_id(request), tmp_path, **_kw(module, request.param)) as sp:
        assert sp.url is not None
        yield sp


@pytest.fixture
async def make_broker(space: BrokerSpace) -> AsyncIterator[Callable[[], Awaitable[Broker]]]:
    """Connect another broker instance on the test's space; all are closed at the end."""
    opened: list[Broker] = []

    async def make() -> Broker:
        broker = space.make()
        await broker.connect()
        opened.append(broker)
        return broker

    yield make
    for broker in opened:
        await broker.close()


@pytest.fixture
async def broker(make_broker: Callable[[], Awaitable[Broker]]) -> Broker:
    return await make_broker()


@pytest.fixture
def persistent_redis() -> Iterator[servers.ThrowawayRedis]:
    """A private redis-server with appendonly yes / appendfsync always, for restart tests."""
    with servers.ThrowawayRedis(persistent=True) as server:
        yield server


@pytest.fixture
def volatile_redis() -> Iterator[servers.ThrowawayRedis]:
    """A private redis-server that keeps nothing on disk."""
    with servers.ThrowawayRedis(persistent=False) as server:
        yield server


@pytest.fixture
def throwaway_postgres() -> Iterator[servers.ThrowawayPostgres]:
    """A private PostgreSQL cluster the test may stop and start."""
    with servers.ThrowawayPostgres() as server:
        yield server


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_800_000_000.0)
