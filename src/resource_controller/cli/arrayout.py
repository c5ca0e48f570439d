"""Where an array's output goes (EXT-ARRAY-2): each task's lines under its index, or its own
file, and one status line, written from every follower's thread."""

from __future__ import annotations

import contextlib
import sys
import threading
import time

from resource_controller.cli import render

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

#: How often a status line is printed when not on a terminal.
PLAIN_EVERY = 5.0


class Prefixer:
    """A task's output as whole lines, each prefixed ``[<index>] ``; a partial line waits
    for its end, or for ``end`` (the task's end), which gives it a newline."""

    def __init__(self, index: object) -> None:
        self.prefix = f"[{index}] ".encode()
        self.rest = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self.rest + chunk
        whole, newline, self.rest = data.rpartition(b"\n")
        if not newline:
            self.rest = whole + self.rest
            return b""
        return b"".join(self.prefix + line + b"\n" for line in whole.split(b"\n"))

    def end(self) -> bytes:
        rest, self.rest = self.rest, b""
        return self.prefix + rest + b"\n" if rest else b""


class Screen:
    """Every write of an array's run, from any thread: output on stdout, ``rc:`` lines and the
    status line on stderr. On a terminal the status line is redrawn in place with ``\\r``
    (cleared before anything else is written); elsewhere it is printed when it changes, at
    most once every ``PLAIN_EVERY`` seconds."""

    def __init__(
        self,
        tty: bool | None = None,
        out: Callable[[bytes], None] = render.write_bytes,
        err: Any = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.err = err or sys.stderr
        self.tty = _isatty(self.err) if tty is None else tty
        self._out, self._now = out, now
        self._lock = threading.Lock()
        self.line = ""  # the status shown (tty) or last printed (plain)
        self._shown = False
        self.broken = False
        self._done = False  # the last status was drawn: none is drawn again
        self._printed_at: float | None = None

    def _clear(self) -> None:
        if self._shown:
            self.err.write("\r\x1b[K")
            self._shown = False

    def _draw(self) -> None:
        if self.tty and self.line and not self._done:
            self.err.write(f"\r{self.line}\x1b[K")
            self._shown = True
        self.err.flush()

    def output(self, data: bytes) -> None:
        """``data`` on stdout; once stdout failed (a closed pipe) the rest is dropped, said
        once by the follower that met the failure."""
        if not data or self.broken:
            return
        with self._lock:
            with contextlib.suppress(OSError, ValueError):
                self._clear()
                self.err.flush()
            try:
                self._out(data)
            except (OSError, ValueError):
                self.broken = True
                raise
            finally:
                with contextlib.suppress(OSError, ValueError):
                    self._draw()

    def say(self, message: str) -> None:
        with self._lock, contextlib.suppress(OSError, ValueError):
            self._clear()
            self.err.write(f"rc: {message}\n")
            self._draw()

    def status(self, text: str, *, final: bool = False) -> None:
        """The status line now; ``final``: the last one (printed when new, wherever)."""
        with self._lock, contextlib.suppress(OSError, ValueError):
            if self.tty:
                if text != self.line or not self._shown:
                    self.line = text
                    self._draw()
                if final and self._shown:
                    self.err.write("\n")
                    self.err.flush()
                    self._shown = False
                self._done = self._done or final
                return
            now = self._now()
            due = self._printed_at is None or now - self._printed_at >= PLAIN_EVERY
            if text != self.line and (due or final):
                self.line, self._printed_at = text, now
                self.err.write(f"rc: {text}\n")
                self.err.flush()


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, OSError, ValueError):
        return False


class Lines:
    """A task's output to stdout, line by line under its prefix."""

    def __init__(self, index: object, screen: Screen) -> None:
        self.lines, self.screen = Prefixer(index), screen

    def write(self, chunk: bytes) -> None:
        self.screen.output(self.lines.feed(chunk))

    def close(self) -> None:
        self.screen.output(self.lines.end())


class File:
    """A task's output, unchanged, to ``DIR/<index>.log``."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "wb")  # noqa: SIM115 - closed at the task's end

    def write(self, chunk: bytes) -> None:
        self.file.write(chunk)
        self.file.flush()

    def close(self) -> None:
        self.file.close()
