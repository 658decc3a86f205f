"""The chaos run at CI size on every server broker: SIGKILL workers mid-drain, lose nothing."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from benchmarks.chaos import run
from tests.backends import BrokerSpace

pytestmark = pytest.mark.anyio


async def test_killing_workers_mid_drain_loses_no_job_and_completes_none_twice(
    server_space: BrokerSpace, tmp_path: Path
) -> None:
    assert server_space.url is not None
    url = server_space.url
    report = await anyio.to_thread.run_sync(
        lambda: run(
            url,
            jobs=1000,
            workers=3,
            kills=4,
            interval=1.0,
            lease=2.0,
            timeout=120,
            workdir=tmp_path,
        )
    )
    print(report.table())
    assert report.enqueued == 1000
    assert report.lost == 0, report.table()
    assert report.completed_twice == 0, report.table()
    assert report.completed == 1000 and report.dead == 0
