"""`taskkit worker --metrics-port` serves Prometheus metrics and health checks over real HTTP,
on every broker a worker process can reach (SQLite, Redis, PostgreSQL)."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.backends import BrokerSpace
from tests.servers import free_port

from .helpers import run_cli, start_worker, wait_until
from .test_cli import TASKS


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "clitasks.py").write_text(TASKS)
    return tmp_path


pytestmark = pytest.mark.anyio


async def test_metrics_and_health_endpoints(server_space: BrokerSpace, project: Path) -> None:
    url, port = server_space.url, free_port()
    assert url is not None
    base = f"http://127.0.0.1:{port}"
    for args in (["--args", "[1, 2]"], ["--args", "[3, 4]"], []):
        task = "calc.add" if args else "calc.fail"
        assert (
            run_cli(project, "enqueue", "clitasks:router", task, *args, "--broker", url).returncode
            == 0
        )
    worker = start_worker(
        "clitasks:router",
        url,
        project,
        "--metrics-port",
        str(port),
        "--metrics-host",
        "127.0.0.1",
        worker_id="metrics",
    )
    try:
        wait_until(lambda: get(f"{base}/healthz")[0] == 200, 30, "/healthz to answer")
        done = 'taskkit_jobs_succeeded_total{queue="math",task="calc.add"} 2.0'
        wait_until(lambda: done in get(f"{base}/metrics")[1], 30, "two successes in /metrics")
        status, body = get(f"{base}/metrics")
        assert status == 200
        assert 'taskkit_jobs_dead_total{queue="math",task="calc.fail"} 1.0' in body
        assert 'taskkit_job_duration_seconds_count{queue="math",task="calc.add"} 2.0' in body
        assert "taskkit_worker_concurrency 10.0" in body and "taskkit_claim_seconds" in body
        wait_until(
            lambda: (
                'taskkit_queue_jobs{queue="math",state="dead"} 1.0' in get(f"{base}/metrics")[1]
            ),
            30,
            "queue depth sampled",
        )
        assert get(f"{base}/readyz") == (200, "ready\n")
        assert get(f"{base}/nope")[0] == 404
    finally:
        worker.terminate()
        out, _ = worker.communicate(timeout=30)
    assert worker.returncode == 0, out
