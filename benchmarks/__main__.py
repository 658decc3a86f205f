"""taskkit against its Python peers, on the same servers, in one run.

    python -m benchmarks drain   --broker redis://127.0.0.1:6379/0 --jobs 20000 --peers all
    python -m benchmarks enqueue --broker sqlite:///.bench-cache/bench.db --peers none --json
    python -m benchmarks all --broker sqlite:///.bench-cache/bench.db \\
        --broker redis://127.0.0.1:6379/0 --broker postgresql://postgres@127.0.0.1:5432/test

Sub-commands: enqueue, drain, latency, scale, memory (several may be given), all.
``--broker`` may be repeated: taskkit runs on each, and the peers of each broker's kind (Redis:
TaskIQ, Huey, Dramatiq, SAQ, Celery; PostgreSQL: PgQueuer, Procrastinate) run on the same
server, each in its own Redis db number (``--redis-db-base`` and up, FLUSHDB'ed) or its own
PostgreSQL database (created and dropped). Every figure is the median of ``--repeat`` runs,
printed with its min-max spread. Progress goes to stderr; the table (or ``--json``) to stdout.
See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

import anyio

from benchmarks import drain, enqueue, latency, memory, peers, scale
from benchmarks.common import RUN_DIR, Figure, Options, Skipped, progress
from benchmarks.report import as_json, as_text, code_state, dump
from benchmarks.subject import Taskkit, check_broker
from benchmarks.system import System, Unavailable, kind_of, with_database, with_db

Measure = Callable[[System, Options], Awaitable[list[Figure]]]
ORDER = ["drain", "enqueue", "latency", "scale", "memory"]
TASKKIT_ONLY = {"scale", "memory"}


async def _enqueue(system: System, opts: Options) -> list[Figure]:
    figures, skipped = await enqueue.measure(system, opts)
    _SKIPPED.extend(skipped)
    return figures


MEASURES: dict[str, Measure] = {
    "drain": drain.measure,
    "enqueue": _enqueue,
    "latency": latency.measure,
    "scale": scale.measure,
    "memory": memory.measure,
}
_SKIPPED: list[Skipped] = []


def parse_peers(text: str) -> list[str]:
    if text == "all":
        return list(peers.ALL)
    if text in ("none", ""):
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in peers.PEERS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(peers.PEERS)}"
        )
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "command",
        nargs="+",
        choices=[*ORDER, "all"],
        help="one or more, run in this order: " + ", ".join(ORDER) + "; all = every one",
    )
    p.add_argument(
        "--broker",
        action="append",
        metavar="URL",
        help="taskkit broker URL, repeatable (default: a SQLite file under .bench-cache/)",
    )
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per drain / batch enqueue")
    p.add_argument(
        "--single-jobs", type=int, default=5_000, help="jobs per single-enqueue run (<= --jobs)"
    )
    p.add_argument("--repeat", type=int, default=3, help="runs per figure; the median is shown")
    p.add_argument(
        "--peers",
        type=parse_peers,
        default="all",
        help=f"comma list, all or none (known: {', '.join(peers.PEERS)}; all = all but arq)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--json-out", metavar="FILE", help="also write the JSON to FILE")
    p.add_argument(
        "--concurrency", type=int, default=10, help="taskkit worker concurrency (CLI default 10)"
    )
    p.add_argument("--batch", type=int, default=1000, help="jobs per bulk enqueue call")
    p.add_argument("--latency-jobs", type=int, default=1000)
    p.add_argument("--latency-rate", type=float, default=200.0, help="jobs/s, paced")
    p.add_argument("--big", type=int, default=1_000_000, help="the large backlog of `scale`")
    p.add_argument(
        "--workers",
        default="1,2,4",
        type=lambda s: [int(x) for x in s.split(",")],
        help="worker process counts of `scale`",
    )
    p.add_argument(
        "--redis-db-base",
        type=int,
        default=10,
        help="Redis peers use this db number and the next ones (each FLUSHDB'ed)",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds any one run may take")
    return p


def peer_url(name: str, url: str, index: int, opts: Options) -> str:
    if peers.kind(name) == "redis":
        return with_db(url, opts.redis_db_base + index)
    return with_database(url, f"taskkit_bench_{name}")


def base_url(url: str) -> str:
    """The URL without taskkit's query options (prefix, schema), for a peer's admin use."""
    return urlsplit(url)._replace(query="").geturl()


def systems_for(url: str, opts: Options) -> tuple[list[System], list[Skipped]]:
    """taskkit on ``url`` and the asked-for peers of its kind on the same server."""
    kind = kind_of(url)
    skipped = []
    out: list[System] = []
    why = check_broker(url)
    if why is None:
        out.append(Taskkit(url, opts.concurrency))
    else:
        skipped.append(Skipped("taskkit", kind, "all", why))
    for index, name in enumerate(peers.PEERS):
        if name not in opts.peers or peers.kind(name) != kind:
            continue
        try:
            out.append(peers.load(name, peer_url(name, url, index, opts), base_url(url)))
        except Unavailable as exc:
            skipped.append(Skipped(name, kind, "all", str(exc)))
    return out, skipped


async def run(commands: Sequence[str], opts: Options) -> tuple[list[Figure], bool]:
    """Every measurement, taskkit and peers one after the other on the same servers."""
    figures: list[Figure] = []
    ok = True
    for url in opts.brokers:
        systems, skipped = systems_for(url, opts)
        _SKIPPED.extend(skipped)
        for s in skipped:
            progress(f"skipping {s.system} on {s.broker}: {s.reason}")
        for system in systems:
            progress(f"{system.name} {system.version} on {system.kind}: setting up")
            try:
                await system.setup()
            except Exception as exc:
                ok = _failed(system, "setup", exc) and ok
                continue
            try:
                for command in commands:
                    if command in TASKKIT_ONLY and system.name != "taskkit":
                        continue
                    try:
                        figures += await MEASURES[command](system, opts)
                    except Unavailable as exc:
                        _SKIPPED.append(Skipped(system.name, system.kind, command, str(exc)))
                    except Exception as exc:
                        ok = _failed(system, command, exc) and ok
            finally:
                try:
                    await system.teardown()
                except Exception as exc:
                    progress(f"{system.name}: teardown failed: {exc!r}")
    return figures, ok


def _failed(system: System, what: str, exc: Exception) -> bool:
    """Record a failure: a peer's is a skipped figure; taskkit's also fails the run."""
    progress(f"{system.name} on {system.kind}: {what} failed:\n{traceback.format_exc()}")
    reason = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    _SKIPPED.append(Skipped(system.name, system.kind, what, reason))
    return system.name != "taskkit"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if isinstance(args.peers, str):  # the default, not parsed by argparse
        args.peers = parse_peers(args.peers)
    opts = Options(
        brokers=args.broker or [f"sqlite:///{RUN_DIR / 'bench.db'}"],
        jobs=args.jobs,
        single_jobs=args.single_jobs,
        repeat=args.repeat,
        peers=args.peers,
        concurrency=args.concurrency,
        batch=args.batch,
        latency_jobs=args.latency_jobs,
        latency_rate=args.latency_rate,
        big=args.big,
        workers=args.workers,
        redis_db_base=args.redis_db_base,
        timeout=args.timeout,
    )
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    commands = [c for c in ORDER if "all" in args.command or c in args.command]
    code = code_state()
    figures, ok = anyio.run(run, commands, opts)
    if ok:  # keep the worker logs of a failed run to read
        shutil.rmtree(RUN_DIR, ignore_errors=True)
    command = ["python", "-m", "benchmarks", *(sys.argv[1:] if argv is None else argv)]
    data = as_json(command, figures, _SKIPPED, code)
    if args.json_out:
        Path(args.json_out).write_text(dump(data) + "\n")
    if args.json:
        print(dump(data))
    else:
        print(as_text(figures, _SKIPPED))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
