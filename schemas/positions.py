"""Where an output sits in the log: the position in its event id (the contract).

Every output a fold emits has the event id ``<source>@<offset>/<index>``:
``source`` is the fold's input (``cell-<p>`` for a scheduler partition,
``admission-<p>`` for a commands partition), ``offset`` the input record's offset
and ``index`` the output's place among that input's outputs. That is what orders
outputs on their source's timeline across topics and partitions, and what makes
a replayed batch's outputs recognisable (same ids). The folds format it
(:func:`input_position`, then ``f"{position}/{index}"`` in the core's hot path);
the tools parse it here, and nowhere else.
"""

from __future__ import annotations

import re

_POSITION = re.compile(r"^(?P<src>[^@/]+)@(?P<offset>[0-9]+)/(?P<index>[0-9]+)$")
CELL_PREFIX = "cell-"
ADMISSION_PREFIX = "admission-"


def input_position(source: str, offset: int) -> str:
    """``cell-0``, 123 -> ``cell-0@123``: the prefix of that input's outputs' ids."""
    return f"{source}@{offset}"


def admission_source(partition: int) -> str:
    """The source name of commands partition ``partition``'s admission fold."""
    return f"{ADMISSION_PREFIX}{partition}"


def parse(event_id: str) -> tuple[str, int, int] | None:
    """``cell-0@123/4`` -> ("cell-0", 123, 4); None where the id is no position
    (an event made outside a fold: a submission, an agent's report)."""
    m = _POSITION.match(event_id or "")
    return (m["src"], int(m["offset"]), int(m["index"])) if m else None


def parse_cell(event_id: str) -> tuple[str, int, int] | None:
    """:func:`parse`, for a cell's outputs only (``cell-<p>@...``)."""
    pos = parse(event_id)
    return pos if pos is not None and _numbered(pos[0], CELL_PREFIX) else None


def parse_admission(event_id: str) -> tuple[str, int, int] | None:
    """:func:`parse`, for an admission fold's outputs only (``admission-<p>@...``)."""
    pos = parse(event_id)
    return pos if pos is not None and _numbered(pos[0], ADMISSION_PREFIX) else None


def _numbered(source: str, prefix: str) -> bool:
    tail = source[len(prefix) :]
    return source.startswith(prefix) and tail.isascii() and tail.isdigit()
