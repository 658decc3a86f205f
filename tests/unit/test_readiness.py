"""/readyz turns 503 when the broker stops answering and 200 again when it is back."""

from __future__ import annotations

import urllib.error
import urllib.request

import anyio
import pytest

from brokers.memory import MemoryBroker
from taskkit import Router, Worker, WorkerSettings
from taskkit.errors import BrokerUnavailable
from taskkit.job import QueueStats
from taskkit.metrics import attach

pytestmark = pytest.mark.anyio


class FlakyBroker(MemoryBroker):
    down = False

    async def stats(self, now: float) -> dict[str, QueueStats]:
        if self.down:
            raise BrokerUnavailable("redis://127.0.0.1:1 does not answer")
        return await super().stats(now)


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


async def test_readyz_follows_the_broker() -> None:
    broker = FlakyBroker("memory://readyz")
    worker = Worker(Router(), broker, WorkerSettings(poll_wait=0.05))
    server = attach(worker, 0, "127.0.0.1", sample_every=0.05)
    seen: list[int] = []

    async def poll_until(expected: int) -> None:
        with anyio.fail_after(10):
            while (code := await anyio.to_thread.run_sync(status, url)) != expected:
                await anyio.sleep(0.05)
            seen.append(code)

    async with anyio.create_task_group() as tg:
        port = await tg.start(server.serve)
        url = f"http://127.0.0.1:{port}/readyz"
        tg.start_soon(worker.run)
        await poll_until(200)
        broker.down = True
        await poll_until(503)
        broker.down = False
        await poll_until(200)
        worker.stop()
        await anyio.sleep(0.2)
        tg.cancel_scope.cancel()
    assert seen == [200, 503, 200]
