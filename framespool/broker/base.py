"""What both embedded brokers share: loopback ports, the child's lifetime, the error."""

from __future__ import annotations

import ctypes
import signal
import socket
import sys
import threading
from collections.abc import Callable

from framespool.schemas.topics import Topic

# Created to prove a broker answers and its storage works (readiness is checked
# by creating a topic: docs/broker-notes.md#starting-it). Harmless, one partition.
READY_PROBE = Topic("framespool.ready-probe", 1, "unused")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(host: str, port: int) -> bool:
    """Whether a listener could bind ``port``: SO_REUSEADDR, like the brokers, so that
    connections in TIME_WAIT from an earlier broker on the port do not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGTERM when its parent dies (Linux).

    Only safe when called from the main thread: PR_SET_PDEATHSIG fires when the
    *thread* that forked exits, which for a worker thread can be any time.
    """
    if (
        not sys.platform.startswith("linux")
        or threading.current_thread() is not threading.main_thread()
    ):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, signal.SIGTERM)


class BrokerError(RuntimeError):
    """The embedded broker did not start or did not stop."""
