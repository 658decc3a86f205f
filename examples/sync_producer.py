"""Enqueue from plain synchronous code (a script, a Django or Flask view) with SyncApp.

    python examples/sync_producer.py

SyncApp runs the async producer on a background event loop, so the caller needs none. Here a
worker runs in a thread of the same program so the example is self-contained; normally it is
`taskkit worker examples.sync_producer:router` in its own process.
"""

from __future__ import annotations

import threading

import anyio

from taskkit import App, Router, SyncApp, WorkerSettings

router = Router()
BROKER = "sqlite:///sync_example.db"


@router.task(name="reports.render", keep_result=600)
def render_report(customer: str, pages: int = 1) -> str:
    return f"{pages}-page report for {customer}"


def run_worker() -> None:
    async def main() -> None:
        async with App(router, BROKER) as app:
            await app.worker(WorkerSettings(burst=True, poll_wait=0.1)).run()

    anyio.run(main)


if __name__ == "__main__":
    with SyncApp(router, BROKER) as app:        # no event loop in sight
        handle = app.enqueue(render_report, "ACME", pages=3)
        print("enqueued", handle.id, "state:", handle.info().state.value)  # type: ignore[union-attr]
        worker = threading.Thread(target=run_worker)
        worker.start()
        print("result:", handle.get(timeout=30))
        worker.join()
