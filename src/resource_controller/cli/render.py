"""Everything ``rc`` writes; every write is flushed so a failed write surfaces as an error."""

from __future__ import annotations

import sys
from collections.abc import Sequence

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from typing import Any

PADDING = 2


def table(rows: Sequence[Sequence[str]]) -> str:
    """CLI-062; contiguous blocks of rows with different shapes align independently."""
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
    import json  # not at the top: every rc start imports this module, few print JSON

    return json.dumps(value, separators=(",", ":"), ensure_ascii=False) + "\n"


def json_indented(value: Any) -> str:
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
