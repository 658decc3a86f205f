"""The `taskkit` command as a subprocess, with the exact forms and JSON shapes scripts rely on."""

from __future__ import annotations

import json
import time
import re
import textwrap
from pathlib import Path

import pytest

from .helpers import run_cli

TASKS = textwrap.dedent(
    """
    from taskkit import Router

    router = Router()

    @router.task(name="calc.add", queue="math", keep_result=60)
    def add(a: int, b: int) -> int:
        return a + b

    @router.task(name="calc.fail", queue="math", max_attempts=1)
    def fail() -> None:
        raise RuntimeError("always fails")
    """
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "clitasks.py").write_text(TASKS)
    return tmp_path


def test_enqueue_work_inspect_and_manage_dead_letters(project: Path) -> None:
    url = f"sqlite:///{project / 'q.db'}"
    add = run_cli(
        project,
        "enqueue",
        "clitasks:router",
        "calc.add",
        "--args",
        "[2]",
        "--kwargs",
        '{"b": 3}',
        "--broker",
        url,
    )
    assert add.returncode == 0, add.stderr
    assert re.fullmatch(r"[0-9a-f]{32}\n", add.stdout)
    fail = run_cli(project, "enqueue", "clitasks:router", "calc.fail", "--broker", url)
    later = run_cli(
        project,
        "enqueue",
        "clitasks:router",
        "calc.add",
        "--args",
        "[1, 1]",
        "--delay",
        "3600",
        "--broker",
        url,
    )
    assert fail.returncode == 0 and later.returncode == 0

    info = json.loads(run_cli(project, "info", "--json", "--broker", url).stdout)
    oldest = info["queues"]["math"].pop("oldest_ready_at")
    assert info["queues"]["math"] == {
        "ready": 2,
        "scheduled": 1,
        "running": 0,
        "dead": 0,
        "paused": False,
    }
    assert isinstance(oldest, float) and abs(oldest - time.time()) < 60

    worker = run_cli(project, "worker", "clitasks:router", "--burst", "--broker", url)
    assert worker.returncode == 0, worker.stderr
    info = json.loads(run_cli(project, "info", "--json", "--broker", url).stdout)
    assert info["queues"]["math"]["dead"] == 1 and info["queues"]["math"]["scheduled"] == 1

    dead = json.loads(run_cli(project, "dead", "list", "--json", "--broker", url).stdout)
    assert len(dead) == 1
    assert {"id", "task", "queue", "attempts", "error"} <= set(dead[0])
    assert dead[0]["id"] == fail.stdout.strip() and dead[0]["task"] == "calc.fail"
    assert dead[0]["queue"] == "math" and dead[0]["attempts"] == 1
    assert dead[0]["error"].startswith("RuntimeError: always fails")

    refused = run_cli(project, "dead", "requeue", "--broker", url)
    assert refused.returncode == 2 and "--all" in refused.stderr
    requeued = run_cli(project, "dead", "requeue", "--id", dead[0]["id"], "--json", "--broker", url)
    assert json.loads(requeued.stdout) == {"requeued": [dead[0]["id"]]}
    run_cli(project, "worker", "clitasks:router", "--burst", "--broker", url)
    purged = run_cli(
        project, "dead", "purge", "--all", "--queue", "math", "--json", "--broker", url
    )
    assert json.loads(purged.stdout) == {"purged": 1}


def test_pause_and_resume_show_in_info(project: Path) -> None:
    url = f"sqlite:///{project / 'q.db'}"
    assert run_cli(project, "pause", "math", "--broker", url).returncode == 0
    run_cli(project, "enqueue", "clitasks:router", "calc.add", "--args", "[1, 2]", "--broker", url)
    assert run_cli(project, "worker", "clitasks:router", "--burst", "--broker", url).returncode == 0
    info = json.loads(run_cli(project, "info", "--json", "--broker", url).stdout)
    assert info["queues"]["math"]["paused"] is True and info["queues"]["math"]["ready"] == 1
    assert run_cli(project, "resume", "math", "--broker", url).returncode == 0
    run_cli(project, "worker", "clitasks:router", "--burst", "--broker", url)
    info = json.loads(run_cli(project, "info", "--json", "--broker", url).stdout)
    assert info["queues"]["math"]["ready"] == 0


def test_the_broker_url_comes_from_the_environment(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKKIT_BROKER_URL", f"sqlite:///{project / 'env.db'}")
    run_cli(project, "enqueue", "clitasks:router", "calc.add", "--args", "[1, 2]")
    assert (project / "env.db").exists() and not (project / "taskkit.db").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["info", "--broker", "amqp://user:hunter2@127.0.0.1/"], "no broker for scheme 'amqp'"),
        (["info", "--broker", "sqlite:////no/such/dir/x.db"], "cannot open SQLite database"),
        (["worker", "nosuchmodule:router"], "cannot import 'nosuchmodule'"),
        (["worker", "clitasks"], "module:attribute"),
        (["worker", "clitasks:nothing"], "has no attribute 'nothing'"),
        (["enqueue", "clitasks:router", "calc.nope"], "no task named 'calc.nope'"),
        (["enqueue", "clitasks:router", "calc.add", "--args", "[1, 2, 3]"], "calc.add"),
        (["enqueue", "clitasks:router", "calc.add", "--args", "{"], "--args is not valid JSON"),
        (["worker", "clitasks:router", "--concurrency", "0"], "concurrency"),
    ],
)
def test_mistakes_are_one_readable_line(project: Path, args: list[str], expected: str) -> None:
    result = run_cli(project, *args)
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr
    assert "hunter2" not in result.stderr + result.stdout


def test_worker_logs_one_json_object_per_line(project: Path) -> None:
    url = f"sqlite:///{project / 'q.db'}"
    run_cli(project, "enqueue", "clitasks:router", "calc.add", "--args", "[1, 2]", "--broker", url)
    run_cli(project, "enqueue", "clitasks:router", "calc.fail", "--broker", url)
    worker = run_cli(
        project, "worker", "clitasks:router", "--burst", "--log-format", "json", "--broker", url
    )
    assert worker.returncode == 0, worker.stderr
    entries = [json.loads(line) for line in worker.stderr.splitlines()]
    events = {e.get("event"): e for e in entries}
    assert events["done"]["task"] == "calc.add" and events["done"]["queue"] == "math"
    assert events["dead"]["error"] == "RuntimeError: always fails"
    assert {"job_id", "attempt", "duration", "ts", "level"} <= set(events["dead"])


def test_job_status_and_cancel(project: Path) -> None:
    url = f"sqlite:///{project / 'q.db'}"
    later = run_cli(
        project,
        "enqueue",
        "clitasks:router",
        "calc.add",
        "--args",
        "[1, 2]",
        "--delay",
        "3600",
        "--broker",
        url,
    ).stdout.strip()
    now = run_cli(
        project, "enqueue", "clitasks:router", "calc.add", "--args", "[2, 2]", "--broker", url
    ).stdout.strip()
    status = json.loads(run_cli(project, "job", later, "--json", "--broker", url).stdout)
    assert (status["state"], status["attempts"], status["task"]) == ("scheduled", 0, "calc.add")
    cancelled = run_cli(project, "cancel", later, "--broker", url)
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
    run_cli(project, "worker", "clitasks:router", "--burst", "--broker", url)
    done = json.loads(run_cli(project, "job", now, "--json", "--broker", url).stdout)
    assert (done["state"], done["result"], done["attempts"]) == ("done", 4, 1)
    assert done["started_at"] is not None and done["finished_at"] is not None
    refused = run_cli(project, "cancel", now, "--broker", url)
    assert refused.returncode == 1 and "not cancelled, it is done" in refused.stdout
    text = run_cli(project, "job", later, "--broker", url).stdout
    assert "state:" in text and "cancelled" in text
    missing = run_cli(project, "job", "f" * 32, "--broker", url)
    assert missing.returncode == 1 and "no job" in missing.stderr
