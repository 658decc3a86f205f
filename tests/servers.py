"""Real Redis and PostgreSQL servers for the tests.

The tests use TASKKIT_TEST_REDIS_URL (default redis://127.0.0.1:6379/0) and
TASKKIT_TEST_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/test). When nothing
answers there, a throwaway server is started from the local binaries on a free port (and the
variable is pointed at it); when the binaries are missing, the run stops with the packages to
install. We start PostgreSQL by hand rather than with pytest-postgresql because CI runs as root,
and initdb refuses root: the server has to run as the ``postgres`` user.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from taskkit.broker import redact_url

REDIS_ENV, REDIS_DEFAULT = "TASKKIT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"
POSTGRES_ENV = "TASKKIT_TEST_POSTGRES_URL"
POSTGRES_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"


def _answers(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        address = (parts.hostname or "127.0.0.1", parts.port or default_port)
        with socket.create_connection(address, 1):
            return True
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _say(message: str) -> None:
    message = " ".join(redact_url(w) if "://" in w else w for w in message.split(" "))
    print(f"[taskkit tests] {message}", file=sys.stderr)


def _missing(binary: str, package: str) -> None:
    raise SystemExit(
        f"[taskkit tests] nothing answers at the test server URL and {binary!r} is not installed: "
        f"install it (apt-get install {package}) or point the URL at a running server"
    )


def _wait_port(port: int, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not _answers(f"tcp://127.0.0.1:{port}", port):
        if time.monotonic() > deadline:
            raise SystemExit(f"[taskkit tests] {what} did not start within {timeout}s")
        time.sleep(0.1)


def ensure_redis() -> str:
    asked = os.environ.get(REDIS_ENV, REDIS_DEFAULT)
    if _answers(asked, 6379):
        return asked
    binary = shutil.which("redis-server")
    if binary is None:
        _missing("redis-server", "redis-server")
    assert binary is not None
    port, workdir = _free_port(), tempfile.mkdtemp(prefix="taskkit-redis-")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir,
         "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    atexit.register(_stop, proc, workdir)
    _wait_port(port, 20, "redis-server")
    url = f"redis://127.0.0.1:{port}/0"
    os.environ[REDIS_ENV] = url
    _say(f"nothing answered at {asked}: started a throwaway redis-server at {url}")
    return url


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    return str(candidates[-1]) if candidates else None


def ensure_postgres() -> str:
    asked = os.environ.get(POSTGRES_ENV, POSTGRES_DEFAULT)
    if _answers(asked, 5432):
        return asked
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        _missing("initdb/pg_ctl", "postgresql")
    assert initdb is not None and pg_ctl is not None
    port, workdir = _free_port(), Path(tempfile.mkdtemp(prefix="taskkit-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        shutil.chown(workdir, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data = workdir / "data"
    subprocess.run([*as_user, initdb, "-D", str(data), "-U", "postgres", "-A", "trust"],
                   check=True, capture_output=True)
    subprocess.run(
        [*as_user, pg_ctl, "-D", str(data), "-l", str(workdir / "log"), "-w", "-o",
         f"-p {port} -k {workdir} -c listen_addresses=127.0.0.1 -c fsync=off", "start"],
        check=True, capture_output=True,
    )
    atexit.register(
        lambda: subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"],
                               capture_output=True)
    )
    subprocess.run(
        [*as_user, _pg_bin("createdb") or "createdb", "-h", "127.0.0.1", "-p", str(port),
         "-U", "postgres", "test"],
        check=True, capture_output=True,
    )
    url = f"postgresql://postgres@127.0.0.1:{port}/test"
    os.environ[POSTGRES_ENV] = url
    _say(f"nothing answered at {asked}: started a throwaway PostgreSQL at {url}")
    return url


def _stop(proc: subprocess.Popen[bytes], workdir: str) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    shutil.rmtree(workdir, ignore_errors=True)
