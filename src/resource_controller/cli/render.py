"""Everything ``rc`` writes: tables, JSON, job output and its own ``rc:`` lines.

Stdout carries data only; what ``rc`` says about its own progress goes to stderr with
the ``rc: `` prefix. Tables and JSON are built from the same data, and
every write is flushed at once, so that a failed write (a closed pipe, a full disk)
surfaces as an exception and a non-zero exit instead of a silently lost table
, and a reader of ``rc run``'s output sees each chunk as it arrives
.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from typing import Any

#: Spaces after the widest cell of a column.
PADDING = 2


def table(rows: Sequence[Sequence[str]]) -> str:
    """Lay rows out as CLI-062 says: text/tabwriter alignment with two spaces of padding.

    Every cell but a row's last belongs to a column; a column is as wide as its
    widest cell among the contiguous lines that have that column, so blocks of rows
    with different shapes (``rc describe``) align independently. The last cell of a
    row is never padded.
    """
    widths: list[list[int]] = [[0] * max(len(r) - 1, 0) for r in rows]
    ncols = max((len(r) - 1 for r in rows), default=0)
    for col in range(ncols):
        start = 0
        while start < len(rows):
            if len(rows[start]) - 1 <= col:
                start += 1
                continue
            end = start
            while end < len(rows) and len(rows[end]) - 1 > col:
                end += 1
            width = max(len(rows[i][col]) for i in range(start, end)) + PADDING
            for i in range(start, end):
                widths[i][col] = width
            start = end
    lines = []
    for row, row_widths in zip(rows, widths, strict=True):
        cells = [cell.ljust(w) for cell, w in zip(row, row_widths, strict=False)]
        if row:
            cells.append(row[-1])
        lines.append("".join(cells) + "\n")
    return "".join(lines)


def command_text(command: Any) -> str:
    """A job's command as its arguments joined by single spaces, unquoted."""
    if not command:
        return ""
    return " ".join(str(part) for part in command)


def json_compact(value: Any) -> str:
    """One line of JSON, newline-terminated (``rc jobs -o json``)."""
    import json  # not at the top: every rc start imports this module, few print JSON

    return json.dumps(value, separators=(",", ":"), ensure_ascii=False) + "\n"


def json_indented(value: Any) -> str:
    """JSON indented two spaces, newline-terminated (``rc devices``/``describe``)."""
    import json

    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def out(text: str) -> None:
    """Write text to stdout and flush it; a failure raises ``OSError``."""
    write_bytes(text.encode("utf-8"))


def write_bytes(data: bytes) -> None:
    """Write raw bytes to stdout and flush them (job output is copied unmodified)."""
    stream = sys.stdout.buffer
    stream.write(data)
    stream.flush()


def say(message: str) -> None:
    """One ``rc: `` line on stderr: progress, announcements, warnings, errors."""
    try:
        sys.stderr.write(f"rc: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # nowhere left to report to; the exit code still tells
