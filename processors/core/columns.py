"""Columns of plain values for snapshots that hold many small records.

A snapshot pickles a partition's whole state inside a processor's turn, so its
cost is paid in the outputs' latency. Pickle costs about a microsecond per
object: 60,000 decisions of five fields each are ~300,000 objects. As columns,
a column of strings is one joined string and an ``array`` of lengths, a column
of repeated strings (tenants, cells) a list of the distinct values and an
``array`` of codes, a column of ints one ``array``: a handful of objects
whatever the number of records. Cost: O(records) in C-level loops to build
(``join``, ``map``, ``array``), O(records) slices to rebuild.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from itertools import accumulate, repeat
from operator import is_

Strings = tuple[str, array]
Repeated = tuple[list[str | None], array]


def pack_strings(values: Sequence[str]) -> Strings:
    """Distinct-ish strings as one joined string and their lengths."""
    return "".join(values), array("I", map(len, values))


def unpack_strings(packed: Strings) -> list[str]:
    joined, lengths = packed
    ends = list(accumulate(lengths))
    return [joined[a:b] for a, b in zip([0, *ends][:-1], ends, strict=True)]


def pack_optional_strings(values: Sequence[str | None]) -> tuple[Strings, bytes]:
    """Distinct-ish strings or None: packed, with a byte per value saying which are None."""
    missing = bytes(map(is_, values, repeat(None)))
    strings = [v or "" for v in values] if any(missing) else values
    return pack_strings(strings), missing  # type: ignore[arg-type]  # no None left


def unpack_optional_strings(packed: tuple[Strings, bytes]) -> list[str | None]:
    strings, missing = packed
    return [None if gone else v for v, gone in zip(unpack_strings(strings), missing, strict=True)]


def pack_repeated(values: Iterable[str | None]) -> Repeated:
    """Strings (or None) drawn from a few distinct values: the values and a code each."""
    values = list(values)
    distinct = list(dict.fromkeys(values))
    codes = {v: i for i, v in enumerate(distinct)}
    return distinct, array("q", map(codes.__getitem__, values))


def unpack_repeated(packed: Repeated) -> list[str | None]:
    distinct, column = packed
    return [distinct[c] for c in column]


def pack_ints(values: Iterable[int]) -> array:
    return array("q", values)


def pack_flags(values: Iterable[bool]) -> bytes:
    return bytes(values)
