"""A worker started before its broker waits for it instead of exiting (Redis, started late)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import textwrap
from pathlib import Path

from tests.servers import free_port

from .helpers import run_cli, start_worker, wait_until

TASKS = textwrap.dedent(
    """
    from pathlib import Path
    from taskkit import Router

    router = Router()

    @router.task(name="late.touch")
    def touch(path: str) -> None:
        Path(path).write_text("ran")
    """
)


def test_a_worker_waits_for_a_broker_that_starts_later(tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0?prefix=late"
    (tmp_path / "latetasks.py").write_text(TASKS)
    log = tmp_path / "worker.log"
    worker = start_worker("latetasks:router", url, tmp_path, worker_id="early", log=log)
    server: subprocess.Popen[bytes] | None = None
    try:
        wait_until(lambda: "waiting for the broker" in log.read_text(), 30, "the worker to wait")
        assert worker.poll() is None
        redis_server = shutil.which("redis-server")
        assert redis_server, "redis-server is needed (apt-get install redis-server)"
        server = subprocess.Popen(
            [
                redis_server,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(tmp_path),
            ],
            stdout=subprocess.DEVNULL,
        )
        marker = tmp_path / "ran.txt"
        wait_until(
            lambda: (
                run_cli(
                    tmp_path,
                    "enqueue",
                    "latetasks:router",
                    "late.touch",
                    "--args",
                    f'["{marker}"]',
                    "--broker",
                    url,
                ).returncode
                == 0
            ),
            30,
            "redis-server to accept the job",
        )
        wait_until(marker.exists, 60, "the early worker to run the job")
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(30)
        if server is not None:
            server.terminate()
            server.wait(10)
    output = log.read_text()
    assert code == 0, output
    assert output.count("waiting for the broker") == 1 and "Traceback" not in output
    assert "connected to redis://127.0.0.1" in output
