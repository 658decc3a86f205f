"""The output: one table of every figure, a summary of taskkit against the best peer, and the
same as JSON."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, Figure, Skipped


def _num(value: float, unit: str) -> str:
    if unit == "jobs/s":
        return f"{value:,.0f}"
    return f"{value:,.2f}" if value < 100 else f"{value:,.1f}"


def _size(n: int) -> str:
    return "-" if n == 0 else f"{n:,}"


def grouped(figures: Sequence[Figure]) -> list[Figure]:
    """Rows by broker, then measurement, then system, each in the order first run: every figure
    of one comparison next to each other."""
    brokers = list(dict.fromkeys(f.broker for f in figures))
    measurements = list(dict.fromkeys(f.measurement for f in figures))
    systems = list(dict.fromkeys(f.system for f in figures))
    return sorted(
        figures,
        key=lambda f: (
            brokers.index(f.broker),
            measurements.index(f.measurement),
            systems.index(f.system),
        ),
    )


def table(figures: Sequence[Figure]) -> str:
    header = ["measurement", "broker", "system", "jobs", "median", "min-max", "unit", "settings"]
    rows = [
        [
            f.measurement,
            f.broker,
            f"{f.system} {f.version}",
            _size(f.jobs),
            _num(f.median, f.unit),
            f"{_num(min(f.runs), f.unit)}-{_num(max(f.runs), f.unit)}",
            f.unit,
            f.settings,
        ]
        for f in grouped(figures)
    ]
    return _markdown(header, rows)


def summary(figures: Sequence[Figure]) -> list[dict[str, Any]]:
    """Per measurement and broker: taskkit's median over the best peer's (best: the highest
    rate, the lowest latency). Only where both were measured."""
    out = []
    keys = dict.fromkeys((f.measurement, f.broker) for f in figures)
    for measurement, broker in keys:
        group = [f for f in figures if (f.measurement, f.broker) == (measurement, broker)]
        ours = next((f for f in group if f.system == "taskkit"), None)
        peers = [f for f in group if f.system != "taskkit"]
        if ours is None or not peers:
            continue
        pick = max if ours.better == "higher" else min
        best = pick(peers, key=lambda f: f.median)
        out.append(
            {
                "measurement": measurement,
                "broker": broker,
                "unit": ours.unit,
                "better": ours.better,
                "taskkit": ours.median,
                "best_peer": best.system,
                "best_peer_value": best.median,
                "ratio": ours.median / best.median if best.median else float("inf"),
            }
        )
    return out


def summary_table(rows: Sequence[dict[str, Any]]) -> str:
    header = ["measurement", "broker", "taskkit", "best peer", "taskkit / best peer"]
    body = [
        [
            r["measurement"],
            r["broker"],
            f"{_num(r['taskkit'], r['unit'])} {r['unit']}",
            f"{r['best_peer']}: {_num(r['best_peer_value'], r['unit'])} {r['unit']}",
            f"{r['ratio']:.2f} ({r['better']} is better)",
        ]
        for r in rows
    ]
    return _markdown(header, body)


def skipped_table(skipped: Sequence[Skipped]) -> str:
    rows = [[s.measurement, s.broker, s.system, s.reason] for s in skipped]
    return _markdown(["measurement", "broker", "system", "not measured because"], rows)


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def as_json(
    command: Sequence[str],
    figures: Sequence[Figure],
    skipped: Sequence[Skipped],
    code: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "command": list(command),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": _cpus(),
        **(code if code is not None else code_state()),
        "figures": [f.to_dict() for f in figures],
        "summary": summary(figures),
        "skipped": [vars(s) for s in skipped],
    }


def as_text(figures: Sequence[Figure], skipped: Sequence[Skipped]) -> str:
    parts = [table(figures)] if figures else ["(no figures)"]
    rows = summary(figures)
    if rows:
        parts += ["", "Summary: taskkit / best peer", "", summary_table(rows)]
    if skipped:
        parts += ["", "Not measured", "", skipped_table(skipped)]
    return "\n".join(parts)


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def code_state() -> dict[str, Any]:
    """The commit and whether taskkit/ or brokers/ had uncommitted changes (the figures are of
    the work tree, not of HEAD). Taken when the run starts: workers import the code then."""
    return {
        "taskkit_commit": _git("rev-parse", "--short", "HEAD"),
        "taskkit_dirty": bool(_git("status", "--porcelain", "--", "taskkit", "brokers")),
    }


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2)


def load(path: str) -> tuple[list[Figure], list[Skipped]]:
    """The figures and skips of a saved ``--json`` / ``--json-out`` file."""
    data = json.loads(Path(path).read_text())
    fields = set(Figure.__dataclass_fields__)
    figures = [Figure(**{k: v for k, v in f.items() if k in fields}) for f in data["figures"]]
    return figures, [Skipped(**s) for s in data["skipped"]]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.report A.json [B.json ...]``: the table of saved runs, merged."""
    figures: list[Figure] = []
    skipped: list[Skipped] = []
    for path in argv if argv is not None else sys.argv[1:]:
        more, skips = load(path)
        figures += more
        skipped += skips
    print(as_text(figures, skipped))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
