"""Owner-epoch headers on processor outputs, and the rule their readers apply (pure).

A stateful processor stamps every record it produces with two headers:
``framespool-owner-epoch`` (the epoch under which it owned the input partition,
claimed from the shared snapshot store on each takeover) and
``framespool-input`` (``<input topic>[<partition>]@<offset>``: the input whose
fold produced it). The Avro payload is untouched, so old readers are unaffected.

Output event ids are derived from the input position (``<cell>@<offset>/<i>``), so
a zombie (an instance that lost the partition but has not noticed yet) can only
produce records whose ids a newer owner produces too. A reader keeps, per input
position, the highest epoch it has seen (:class:`EpochFence`) and ignores a record
from a lower epoch for the same input position: the newer owner's decision is the
one that counts. Records without the headers (older writers) are always admitted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

OWNER_EPOCH = "framespool-owner-epoch"
INPUT_POSITION = "framespool-input"


def fencing_headers(input_position: str, epoch: int) -> tuple[tuple[str, bytes], ...]:
    return ((OWNER_EPOCH, str(int(epoch)).encode()), (INPUT_POSITION, input_position.encode()))


def read_fencing(headers: Iterable[tuple[str, bytes | str | None]]) -> tuple[str, int] | None:
    """``(input position, epoch)`` from a record's headers, or None if it has none."""
    epoch = position = None
    for name, value in headers or ():
        if value is None:
            continue
        raw = value.decode() if isinstance(value, bytes) else value
        if name == OWNER_EPOCH:
            try:
                epoch = int(raw)
            except ValueError:
                return None
        elif name == INPUT_POSITION:
            position = raw
    if epoch is None or position is None:
        return None
    return position, epoch


class EpochFence:
    """Remembers the highest owner epoch seen per input position (the ``limit`` most
    recent positions); :meth:`admit` says whether a record counts."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._epochs: OrderedDict[str, int] = OrderedDict()
        self.ignored = 0

    def admit(self, headers: Iterable[tuple[str, bytes | str | None]]) -> bool:
        """False for a record from a lower epoch than one already seen for its input."""
        found = read_fencing(headers)
        if found is None:
            return True
        position, epoch = found
        best = self._epochs.get(position)
        if best is not None and epoch < best:
            self.ignored += 1
            return False
        self._epochs[position] = epoch if best is None else max(best, epoch)
        self._epochs.move_to_end(position)
        if len(self._epochs) > self.limit:
            self._epochs.popitem(last=False)
        return True
