"""Job arrays (EXT-ARRAY-1): the index spec as Slurm writes it, and the per-array cap on tasks
running at once, which the pass applies as it walks the queue; pure."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

#: Tasks one array may hold (EXT-LIMITS).
MAX_TASKS = 10_000
#: The highest index a spec may name: large enough for any sweep, small enough to stay an int32.
MAX_INDEX = 2**31 - 1

_ITEM = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")


class ArraySpecError(ValueError):
    """The spec is malformed or over a limit; the message names what, not the spec."""


_TOO_MANY = f"more than {MAX_TASKS} tasks (the limit per array)"


@dataclass(frozen=True)
class ArraySpec:
    """A parsed spec: the indexes in ascending order, and the cap (0: none)."""

    text: str
    indexes: tuple[int, ...]
    max_running: int = 0


def parse(text: str) -> ArraySpec:
    """``0-99``, ``0-99:5``, ``1,4,9``, each with an optional ``%N`` cap; every index once."""
    body, cap_sep, cap = text.strip().partition("%")
    max_running = 0
    if cap_sep:
        if not cap.isdigit() or int(cap) < 1:
            raise ArraySpecError("the %N cap must be a whole number >= 1")
        max_running = int(cap)
    if not body:
        raise ArraySpecError("no indexes (write e.g. 0-99, 0-99:5 or 1,4,9)")
    indexes: set[int] = set()
    for item in body.split(","):
        for index in _item(item.strip()):
            if index in indexes:
                raise ArraySpecError(f"index {index} is given twice")
            indexes.add(index)
            if len(indexes) > MAX_TASKS:
                raise ArraySpecError(_TOO_MANY)
    return ArraySpec(text.strip(), tuple(sorted(indexes)), max_running)


def _item(item: str) -> range:
    match = _ITEM.fullmatch(item)
    if match is None:
        raise ArraySpecError(f"{item!r} is not an index, a range A-B or a stepped range A-B:S")
    first, last, step = match.groups()
    start = int(first)
    end = start if last is None else int(last)
    if max(start, end) > MAX_INDEX:
        raise ArraySpecError(f"indexes go up to {MAX_INDEX}")
    if end < start:
        raise ArraySpecError(f"range {item} runs backwards")
    stride = 1 if step is None else int(step)
    if stride < 1:
        raise ArraySpecError(f"the step of {item} must be >= 1")
    if (end - start) // stride + 1 > MAX_TASKS:
        raise ArraySpecError(_TOO_MANY)
    return range(start, end + 1, stride)


#: The cap of an array and its tasks assigned or running now: ``(max_running, active)``.
ReadCap = Callable[[str], tuple[int, int]]


class ArrayCaps:
    """The ``%N`` caps as one pass sees them: each array read once, its placements counted;
    ``full`` holds the arrays at their cap, which the queue walk stops reading."""

    def __init__(self, read: ReadCap) -> None:
        self._read = read
        self._room: dict[str, int | None] = {}  #: array -> tasks it may still start (None: no cap)
        self.full: set[str] = set()

    def admits(self, array_id: str) -> bool:
        """Whether a task of ``array_id`` may start in this pass."""
        if not array_id:
            return True
        if array_id not in self._room:
            cap, active = self._read(array_id)
            self._room[array_id] = None if cap <= 0 else cap - active
        room = self._room[array_id]
        if room is not None and room <= 0:
            self.full.add(array_id)
            return False
        return True

    def placed(self, array_id: str) -> None:
        room = self._room.get(array_id)
        if room is not None:
            self._room[array_id] = room - 1
            if room <= 1:
                self.full.add(array_id)
