"""Real Redis and PostgreSQL servers for the tests.

The tests use TASKKIT_TEST_REDIS_URL (default redis://127.0.0.1:6379/0) and
TASKKIT_TEST_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/test). When nothing
answers there, ``ensure_redis``/``ensure_postgres`` start a throwaway server from the local
binaries on a free port (and point the variable at it); when the binaries are missing, the run
stops with the packages to install. Tests that stop and start a server use ``ThrowawayRedis`` and
``ThrowawayPostgres`` directly. PostgreSQL is started by hand rather than with pytest-postgresql
because CI runs as root and initdb refuses root: the server has to run as the ``postgres`` user.
"""

from __future__ import annotations

import atexit
import inspect
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import redis

from taskkit.broker import redact_url

REDIS_ENV, REDIS_DEFAULT = "TASKKIT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"
POSTGRES_ENV = "TASKKIT_TEST_POSTGRES_URL"
POSTGRES_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"


class ServerMissing(Exception):
    """A server binary is not installed; the message names the package."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(url: str, default_port: int) -> bool:
    """Whether something accepts TCP connections at the URL's host and port."""
    parts = urlsplit(url)
    try:
        address = (parts.hostname or "127.0.0.1", parts.port or default_port)
        with socket.create_connection(address, 1):
            return True
    except OSError:
        return False


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


async def eventually(condition: Callable[[], Any], timeout: float = 10.0) -> None:
    """``wait_until`` for async tests: poll ``condition`` (its value, awaited when it is
    awaitable) without blocking the event loop; fail after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        while True:
            value = condition()
            if await value if inspect.isawaitable(value) else value:
                return
            await anyio.sleep(0.02)


class ThrowawayRedis:
    """A private redis-server on 127.0.0.1:``port``, its files under a fresh temporary directory.
    ``start`` and ``stop`` return once the server answers PING, or once its process has exited."""

    def __init__(self, *, persistent: bool) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServerMissing("redis-server is missing (apt-get install redis-server)")
        self.binary = binary
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="taskkit-redis-"))
        self.persistent = persistent
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert self.proc is None, "already running"
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.persistent
            else ["--appendonly", "no"]
        )
        self.starts += 1
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                "--save",
                "",
                *persistence,
                "--logfile",
                str(self.dir / f"redis-{self.starts}.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)
        try:
            wait_until(lambda: self._pong(client), 20, "redis-server to answer PING")
        finally:
            client.close()

    def _pong(self, client: redis.Redis) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            log = (self.dir / f"redis-{self.starts}.log").read_text(errors="replace")
            raise AssertionError(f"redis-server exited with {self.proc.returncode}:\n{log}")
        try:
            return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            return False

    def stop(self) -> None:
        """SIGTERM, as ``redis-cli shutdown`` would: the AOF is fsynced before the process ends."""
        assert self.proc is not None, "not running"
        self.proc.terminate()
        code = self.proc.wait(20)
        self.proc = None
        assert code == 0, f"redis-server exited with {code} on SIGTERM"

    def freeze(self) -> None:
        """SIGSTOP: connections stay open but nothing answers (a hung host, a dead network)."""
        assert self.proc is not None, "not running"
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None, "not running"
        self.proc.send_signal(signal.SIGCONT)

    def clients_waiting_in_blmove(self) -> int:
        """How many clients sit blocked in BLMOVE now (CLIENT LIST: cmd=blmove, flag b)."""
        client = redis.Redis(port=self.port, socket_timeout=2, socket_connect_timeout=2)
        try:
            listing = client.client_list()
        finally:
            client.close()
        return sum(1 for c in listing if c.get("cmd") == "blmove" and "b" in c.get("flags", ""))

    def __enter__(self) -> ThrowawayRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def destroy(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


def pg_binary(name: str) -> str:
    """``name`` from PATH or the newest /usr/lib/postgresql/*/bin."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    if not candidates:
        raise ServerMissing(f"{name} is not installed (apt-get install postgresql)")
    return str(candidates[-1])


class ThrowawayPostgres:
    """A private PostgreSQL cluster on 127.0.0.1:``port``, data under a fresh temporary
    directory. ``start``/``stop`` wait until the server is up or down (pg_ctl -w)."""

    def __init__(self) -> None:
        self.pg_ctl = pg_binary("pg_ctl")
        self.port = free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix="taskkit-pg-"))
        self.data = self.workdir / "data"
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root
            shutil.chown(self.workdir, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str, timeout: float = 60) -> None:
        done = subprocess.run(
            [*self.as_user, *argv], capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed:\n{done.stdout}{done.stderr}")

    def init(self) -> None:
        self._run(
            pg_binary("initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync"
        )

    def start(self) -> None:
        # fsync=off is safe here: the tests kill the server, not the machine, so the OS still
        # holds every write. Commits stay synchronous: a commit the client saw must survive.
        options = f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            self.pg_ctl,
            "-D",
            str(self.data),
            "-l",
            str(self.workdir / "log"),
            "-w",
            "-o",
            options,
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run(self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "stop")

    def createdb(self, name: str) -> str:
        """Create a database and return its URL."""
        self._run(
            pg_binary("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name
        )
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def __enter__(self) -> ThrowawayPostgres:
        self.init()
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.workdir, ignore_errors=True)


def _say(message: str) -> None:
    message = " ".join(redact_url(w) if "://" in w else w for w in message.split(" "))
    print(f"[taskkit tests] {message}", file=sys.stderr)


def ensure_redis() -> str:
    asked = os.environ.get(REDIS_ENV, REDIS_DEFAULT)
    if answers(asked, 6379):
        return asked
    try:
        server = ThrowawayRedis(persistent=False)
    except ServerMissing as exc:
        raise SystemExit(
            f"[taskkit tests] nothing answers at {redact_url(asked)} and {exc}"
        ) from None
    server.start()
    atexit.register(server.destroy)
    os.environ[REDIS_ENV] = server.url
    _say(f"nothing answered at {asked}: started a throwaway redis-server at {server.url}")
    return server.url


def ensure_postgres() -> str:
    asked = os.environ.get(POSTGRES_ENV, POSTGRES_DEFAULT)
    if answers(asked, 5432):
        return asked
    try:
        server = ThrowawayPostgres()
    except ServerMissing as exc:
        raise SystemExit(
            f"[taskkit tests] nothing answers at {redact_url(asked)} and {exc}"
        ) from None
    server.init()
    server.start()
    atexit.register(server.destroy)
    url = server.createdb("test")
    os.environ[POSTGRES_ENV] = url
    _say(f"nothing answered at {asked}: started a throwaway PostgreSQL at {url}")
    return url
