"""One module per CLI command; each exposes ``register(subparsers)`` (see ``framespool.cli``)."""

from __future__ import annotations

import sys
from collections.abc import Callable


class CommandError(Exception):
    """The user asked for something that cannot be done; the message says what to change."""


def progress_bar(enabled: bool, width: int = 30) -> Callable[[float, str], None] | None:
    """A one-line progress bar on stderr, or None when stderr is not a terminal."""
    if not enabled or not sys.stderr.isatty():
        return None

    def show(fraction: float, text: str) -> None:
        done = int(max(0.0, min(1.0, fraction)) * width)
        sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {fraction:6.1%} {text}\x1b[K")
        sys.stderr.flush()

    return show


def end_progress(bar: Callable[[float, str], None] | None) -> None:
    if bar is not None:
        sys.stderr.write("\n")
        sys.stderr.flush()
