"""Quickstart: enqueue a few jobs, run a worker until they are done, print the results.

    pip install -e . && python examples/quickstart.py

Runs on the embedded default broker (a SQLite file, no server). In a real deployment the producer
and `taskkit worker examples.quickstart:router` run in different processes.
"""

from __future__ import annotations

import anyio

from taskkit import App, Router, WorkerSettings

router = Router()


@router.task(name="quickstart.add", keep_result=3600)
async def add(a: int, b: int) -> int:
    """An async task runs on the worker's event loop."""
    return a + b


@router.task(name="quickstart.shout", keep_result=3600, max_attempts=5)
def shout(word: str) -> str:
    """A plain function runs in the worker's thread pool."""
    return word.upper() + "!"


async def main() -> None:
    async with App(router, "sqlite:///quickstart.db") as app:
        handles = [await app.enqueue(add, 2, 3), await app.enqueue(add, 40, 2)]
        handles.append(await app.enqueue(shout, "hello"))

        # Burst mode: the worker exits once nothing is ready or running.
        await app.worker(WorkerSettings(burst=True, poll_wait=0.1)).run()

        for handle in handles:
            print(f"job {handle.id}: {await handle.result(timeout=10)!r}")


if __name__ == "__main__":
    anyio.run(main)
