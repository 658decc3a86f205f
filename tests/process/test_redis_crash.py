"""A worker process is SIGKILLed in the instant between its BLMOVE (which moved a foreign
producer's payload into its processing list) and the claim script that would have leased it.
Another worker, in this process, recovers the payload once the processing grace period is over:
nothing is lost, nothing is delivered twice."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from brokers.redis import RedisBroker
from taskkit.job import decode_job
from tests import servers
from tests.backends import redis as backend

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

DOOMED = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from brokers.redis import RedisBroker

    async def main() -> None:
        broker = RedisBroker(sys.argv[1])
        await broker.connect()
        now = float(sys.argv[2])
        await broker.reserve(["default"], 1, 30, 0, now)  # seen in the workers zset at `now`
        block = broker._block

        async def block_then_die(keys, timeout):
            await block(keys, timeout)  # BLMOVE has moved the payload...
            os.kill(os.getpid(), signal.SIGKILL)  # ...and the claim script never runs

        broker._block = block_then_die
        print(broker.broker_id, flush=True)
        await broker.reserve(["default"], 1, 30, 20, now)

    asyncio.run(main())
    """
)


async def test_a_worker_killed_between_blmove_and_its_claim_loses_nothing(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    servers.ensure_redis()
    prefix = backend.unique_prefix(request.node.name)
    async with backend.space(prefix, tmp_path, "redis") as space:
        assert space.url is not None
        now = 1_800_000_000.0
        (tmp_path / "doomed.py").write_text(DOOMED)
        proc = subprocess.Popen(
            [sys.executable, str(tmp_path / "doomed.py"), space.url, repr(now)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        try:
            assert proc.stdout is not None
            doomed_id = proc.stdout.readline().strip()
            assert doomed_id, proc.stderr.read() if proc.stderr else ""
            survivor = space.make()
            assert isinstance(survivor, RedisBroker)
            await survivor.connect()
            k = survivor.keys("default")
            await anyio.sleep(0.3)  # let the doomed worker sit in BLMOVE
            payload = b'{"task": "reports.build", "args": [2026]}'
            await backend.cmd(survivor.client, "LPUSH", k.ready, payload)
            assert proc.wait(20) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
        processing = k.processing(doomed_id)
        assert await backend.cmd(survivor.client, "LRANGE", processing, 0, -1) == [payload]

        assert await survivor.reserve(["default"], 5, 30, 0, now + 1) == []
        grace = survivor.processing_grace
        await survivor.reclaim_expired(["default"], 30, 10, now + grace - 1)
        assert await survivor.reserve(["default"], 5, 30, 0, now + grace - 1) == []
        await survivor.reclaim_expired(["default"], 30, 10, now + grace + 1)
        [d] = await survivor.reserve(["default"], 5, 30, 0, now + grace + 1)
        assert d.payload == payload and d.attempts == 1
        assert decode_job(d.payload).args == [2026]
        assert await survivor.reserve(["default"], 5, 30, 0, now + grace + 2) == []
        await survivor.close()
