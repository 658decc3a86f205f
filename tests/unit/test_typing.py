"""mypy catches a wrong enqueue call: the task's signature flows into App.enqueue (ParamSpec)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from mypy import api

PROGRAM = textwrap.dedent(
    """
    from taskkit import App, Router, SyncApp

    router = Router()

    @router.task
    async def send_email(to: str, retries: int = 3) -> bool:
        return True

    @router.task(queue="mail")
    def resize(path: str, width: int) -> str:
        return path

    async def produce(app: App, sync: SyncApp) -> None:
        {calls}
    """
)


def check(tmp_path: Path, calls: str) -> tuple[str, int]:
    source = tmp_path / "producer.py"
    source.write_text(PROGRAM.format(calls=calls))
    out, err, status = api.run(
        ["--strict", "--no-incremental", "--cache-dir", str(tmp_path / ".mypy"), str(source)]
    )
    return out + err, status


def test_right_calls_type_check(tmp_path: Path) -> None:
    out, status = check(
        tmp_path,
        "h = await app.enqueue(send_email, 'a@example.com', retries=2)\n"
        "    ok: bool = await h.result()\n"
        "    await app.enqueue(resize.options(delay=5), 'a.png', 300)\n"
        "    s: str = sync.enqueue(resize, 'a.png', width=10).get()\n"
        "    hs = await app.enqueue_many([resize.call('a.png', 1), resize.call('b.png', width=2)])\n"
        "    r: str = await hs[0].result()",
    )
    assert status == 0, out


WRONG_CALLS = [
    ("await app.enqueue(send_email, 42)", 'incompatible type "int"; expected "str"'),
    ("await app.enqueue(send_email, 'a', retry=2)", 'Unexpected keyword argument "retry"'),
    ("await app.enqueue(resize, 'a.png')", 'Missing positional argument "width"'),
    ("sync.enqueue(resize, 'a.png', width='wide')", 'incompatible type "str"; expected "int"'),
    ("x: str = await (await app.enqueue(send_email, 'a')).result()", 'expression has type "bool"'),
    (
        "await app.enqueue_many([resize.call('a.png', 'wide')])",
        'incompatible type "str"; expected "int"',
    ),
]


def test_wrong_calls_are_caught(tmp_path: Path) -> None:
    out, status = check(tmp_path, "\n    ".join(call for call, _ in WRONG_CALLS))
    assert status == 1, out
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == len(WRONG_CALLS), out
    first_line = PROGRAM.splitlines().index("    {calls}") + 1
    for n, (call, complaint) in enumerate(WRONG_CALLS):
        assert any(f"producer.py:{first_line + n}:" in e and complaint in e for e in errors), (
            f"mypy did not flag {call!r} with {complaint!r}:\n{out}"
        )
