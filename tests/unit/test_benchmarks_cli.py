"""Smoke test of the benchmark suite (`python -m benchmarks`): a tiny drain and enqueue run on
SQLite, no peers, and the JSON shape that scripts and RESULTS.md rely on. Seconds, not minutes:
it proves the suite still runs against the current taskkit, not how fast taskkit is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # spawns a benchmark process, which spawns a worker

ROOT = Path(__file__).resolve().parents[2]
FIGURE_KEYS = {
    "measurement",
    "broker",
    "system",
    "version",
    "unit",
    "better",
    "jobs",
    "settings",
    "runs",
    "median",
    "min",
    "max",
}


def run_bench(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", *args, "--repeat", "1", "--peers", "none", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    assert data["skipped"] == [] and data["summary"] == []  # no peers: nothing to compare
    assert data["command"][:3] == ["python", "-m", "benchmarks"]
    for figure in data["figures"]:
        assert FIGURE_KEYS <= figure.keys()
        assert figure["system"] == "taskkit" and figure["broker"] == "sqlite"
        assert len(figure["runs"]) == 1 and figure["median"] > 0 and figure["settings"]
    return data


def test_drain_json(tmp_path: Path) -> None:
    data = run_bench("drain", "--broker", f"sqlite:///{tmp_path / 'bench.db'}", "--jobs", "200")
    [figure] = data["figures"]
    assert figure["measurement"] == "drain"
    assert figure["unit"] == "jobs/s" and figure["better"] == "higher"
    assert figure["jobs"] == 200
    assert "--burst" in figure["settings"]


def test_enqueue_json(tmp_path: Path) -> None:
    data = run_bench(
        "enqueue",
        "--broker",
        f"sqlite:///{tmp_path / 'bench.db'}",
        "--jobs",
        "200",
        "--single-jobs",
        "100",
        "--batch",
        "50",
    )
    by_name = {f["measurement"]: f for f in data["figures"]}
    assert set(by_name) == {"enqueue single", "enqueue batch"}
    assert by_name["enqueue single"]["jobs"] == 100
    assert by_name["enqueue batch"]["jobs"] == 200
    assert "batch=50" in by_name["enqueue batch"]["settings"]
