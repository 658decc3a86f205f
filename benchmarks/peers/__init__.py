"""The peers: one module per framework, each a ``System`` plus the worker-side module its CLI
imports. A peer's module imports its framework at the top; it is loaded only when asked for,
and one that is not installed is reported as skipped, not an error."""

from __future__ import annotations

import importlib

from benchmarks.system import System, Unavailable

# name -> (module, class, broker kind). Order: the order of the table.
PEERS: dict[str, tuple[str, str, str]] = {
    "taskiq": ("benchmarks.peers.taskiq_peer", "TaskiqPeer", "redis"),
    "huey": ("benchmarks.peers.huey_peer", "HueyPeer", "redis"),
    "dramatiq": ("benchmarks.peers.dramatiq_peer", "DramatiqPeer", "redis"),
    "saq": ("benchmarks.peers.saq_peer", "SaqPeer", "redis"),
    "celery": ("benchmarks.peers.celery_peer", "CeleryPeer", "redis"),
    "arq": ("benchmarks.peers.arq_peer", "ArqPeer", "redis"),
    "pgqueuer": ("benchmarks.peers.pgqueuer_peer", "PgQueuerPeer", "postgresql"),
    "procrastinate": ("benchmarks.peers.procrastinate_peer", "ProcrastinatePeer", "postgresql"),
}
# ``--peers all``: arq is left out, it needs redis-py < 6 and cannot share the bench env
# (see benchmarks/README.md); name it explicitly in an env that has it.
ALL = [name for name in PEERS if name != "arq"]


def kind(name: str) -> str:
    return PEERS[name][2]


def load(name: str, url: str, admin_url: str) -> System:
    """The peer ``name`` on ``url`` (its own db number or database; ``admin_url``: the server's
    database a PostgreSQL peer creates its own from)."""
    module_name, class_name, kind_ = PEERS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise Unavailable(f"not installed ({exc.name or exc}): pip install -e '.[bench]'") from None
    cls = getattr(module, class_name)
    system: System = cls(url, admin_url) if kind_ == "postgresql" else cls(url)
    return system
