"""The task of the soak run (benchmarks/soak.py): it does nothing."""

from __future__ import annotations

from taskkit import Router

router = Router()


@router.task(name="soak.noop")
async def noop() -> None:
    return None
