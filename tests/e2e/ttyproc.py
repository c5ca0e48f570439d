"""Drive ``rc`` under a real pseudo-terminal, as a person at a terminal would.

The test owns the PTY: ``rc`` gets the slave as stdin, stdout, stderr and controlling
terminal (in a session of its own), so raw mode, SIGWINCH and the restoration of the
terminal's attributes are all the real thing; the test types into the master and reads
what the terminal shows from it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import struct
import subprocess
import termios
import time
from typing import Any

from .cluster import RC, Cluster


def _controlling_terminal() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class PtyRc:
    """One ``rc`` process on a PTY of its own; stop it with ``close``."""

    def __init__(self, cluster: Cluster, *args: str, rows: int = 40, cols: int = 120) -> None:
        self.master, self.slave = os.openpty()
        set_size(self.master, rows, cols)
        #: The terminal's attributes before rc touched them.
        self.before = termios.tcgetattr(self.slave)
        self.proc = subprocess.Popen(
            [RC, *args],
            stdin=self.slave,
            stdout=self.slave,
            stderr=self.slave,
            env=cluster.env(),
            start_new_session=True,
            preexec_fn=_controlling_terminal,
        )
        cluster.procs.append(self.proc)
        self.seen = b""

    def attrs(self) -> list[Any]:
        return termios.tcgetattr(self.slave)

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def resize(self, rows: int, cols: int) -> None:
        set_size(self.master, rows, cols)  # the kernel sends SIGWINCH to rc

    def expect(self, marker: bytes, timeout: float = 20) -> bytes:
        """Read until ``marker`` shows; everything seen so far."""
        deadline = time.monotonic() + timeout
        while marker not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {marker!r}; saw {self.seen!r}")
            ready, _, _ = select.select([self.master], [], [], min(left, 0.2))
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    chunk = b""
                if not chunk and self.proc.poll() is not None:
                    raise AssertionError(f"rc exited before {marker!r}; saw {self.seen!r}")
                self.seen += chunk
        return self.seen

    def wait(self, timeout: float = 30) -> int:
        """rc's exit status, reading (and keeping) what it printed meanwhile."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"rc did not exit; saw {self.seen!r}")
            self._drain(0.1)
        self._drain(0.1)
        return self.proc.returncode

    def _drain(self, wait: float) -> None:
        ready, _, _ = select.select([self.master], [], [], wait)
        if ready:
            with contextlib.suppress(OSError):
                self.seen += os.read(self.master, 65536)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        for fd in (self.master, self.slave):
            with contextlib.suppress(OSError):
                os.close(fd)
