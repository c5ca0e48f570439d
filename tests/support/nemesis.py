"""Nemeses: faults a reliability run injects into real processes and real connections.

``FaultProxy`` is a TCP proxy on loopback to put between workers and the controller
(the workers' ``controller_url`` names the proxy); its mode can be switched at run time
from the test's thread. Process nemeses act on a process by PID: ``kill -9``, and
SIGSTOP/SIGCONT to freeze a controller or worker without closing its sockets.

Modes (``FaultProxy.set``):

- ``pass``: forward both ways, after ``delay`` seconds per chunk when set;
- ``drop``: close every new connection at once (a refused or crashed peer); live ones
  keep working;
- ``blackhole``: new connections are accepted and never answered nor forwarded, live
  ones stop moving bytes in both directions; nothing is closed, so the peers see only
  silence, as behind a dead route. Healing delivers what was held, as TCP would;
- ``reset``: every live connection and every new one is reset (RST, by ``SO_LINGER`` 0);
- ``up_only`` / ``down_only``: a one-way partition: bytes from the client to the
  server (``up``) or from the server to the client (``down``) only; the other
  direction is held.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Literal

Mode = Literal["pass", "drop", "blackhole", "reset", "up_only", "down_only"]
MODES: tuple[Mode, ...] = ("pass", "drop", "blackhole", "reset", "up_only", "down_only")
Direction = Literal["up", "down"]

_HOLDS: dict[Mode, frozenset[Direction]] = {
    "blackhole": frozenset({"up", "down"}),
    "up_only": frozenset({"down"}),
    "down_only": frozenset({"up"}),
}


def _linger_zero(sock: socket.socket | None) -> None:
    """Make the next close send RST instead of FIN."""
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class FaultProxy:
    """A loopback TCP proxy to ``target_port`` whose faults are switched at run time.

    The event loop runs in a daemon thread; ``set`` may be called from any thread and
    takes effect for the next chunk of every live connection. ``stop`` closes
    everything.
    """

    def __init__(self, target_port: int, target_host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = (target_host, target_port)
        self._want_port = port
        self.port = 0
        self.mode: Mode = "pass"
        self.delay = 0.0
        #: Connections accepted, and those closed or reset at once by ``drop``/``reset``.
        self.accepted = 0
        self.refused = 0
        self.lost = 0  #: chunks ``lose`` matched
        #: Wall-clock time bytes last went each way (the peers' last contact).
        self.last_forwarded: dict[Direction, float] = {"up": 0.0, "down": 0.0}
        #: Called from the proxy's thread with (connection number, direction, the
        #: wall-clock ns the chunk arrived, the chunk) for every chunk it reads, to time
        #: a protocol exchange from outside both peers (``bench/handoff_phases.py``).
        self.tap: Callable[[int, Direction, int, bytes], None] | None = None
        #: A chunk this matches (direction, chunk) is never forwarded: both ends of its
        #: connection are reset instead, as when a peer dies after its commit and
        #: before its answer reaches the other side.
        self.lose: Callable[[Direction, bytes], bool] | None = None
        self._loop = asyncio.new_event_loop()
        self._changed: asyncio.Event | None = None
        self._closing = False
        self._server: asyncio.Server | None = None
        self._conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter | None]] = set()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="fault-proxy", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result(10)
        return self

    async def _open(self) -> None:
        self._changed = asyncio.Event()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self._want_port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _close(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        for down, up in list(self._conns):
            down.transport.abort()
            if up is not None:
                up.transport.abort()
        self._conns.clear()
        assert self._changed is not None
        self._changed.set()  # held pumps wake, see the closing flag and end
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=2)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set(self, mode: Mode, delay: float | None = None) -> None:
        """Switch the fault; ``delay`` (seconds per chunk) is kept unless given."""
        if mode not in MODES:
            raise ValueError(f"unknown proxy mode {mode!r} (known: {', '.join(MODES)})")
        if delay is not None and delay < 0:
            raise ValueError(f"proxy delay must be >= 0 seconds, not {delay}")
        fut = asyncio.run_coroutine_threadsafe(self._switch(mode, delay), self._loop)
        fut.result(10)

    async def _switch(self, mode: Mode, delay: float | None) -> None:
        self.mode = mode
        if delay is not None:
            self.delay = delay
        if mode == "reset":
            for down, up in list(self._conns):
                self._reset(down, up)
        assert self._changed is not None
        self._changed.set()
        self._changed = asyncio.Event()

    def _reset(self, down: asyncio.StreamWriter, up: asyncio.StreamWriter | None) -> None:
        for w in (down, up):
            if w is not None:
                _linger_zero(w.get_extra_info("socket"))
                w.transport.abort()
        self._conns.discard((down, up))

    async def _permit(self, direction: Direction) -> None:
        """Return once bytes may flow ``direction``; hold them while the mode says so."""
        while direction in _HOLDS.get(self.mode, frozenset()) and not self._closing:
            assert self._changed is not None
            await self._changed.wait()
        if self._closing:
            raise ConnectionAbortedError("the proxy is closing")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        conn = self.accepted
        if self.mode in ("drop", "reset"):
            self.refused += 1
            if self.mode == "reset":
                _linger_zero(writer.get_extra_info("socket"))
                writer.transport.abort()
            else:
                writer.close()
            return
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter | None] = (writer, None)
        self._conns.add(pair)
        try:
            # A black hole answers nothing: the server is not even dialled until it heals.
            await self._permit("up")
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:  # ConnectionAbortedError too: the proxy closed meanwhile
            self._conns.discard(pair)
            writer.transport.abort()
            return
        self._conns.discard(pair)
        if writer.transport.is_closing():
            up_writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._conns.add(pair)
        try:
            await asyncio.gather(
                self._pump(reader, up_writer, "up", writer, conn),
                self._pump(up_reader, writer, "down", up_writer, conn),
            )
        finally:
            self._conns.discard(pair)
            for w in (writer, up_writer):
                if not w.transport.is_closing():
                    w.close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        direction: Direction,
        source: asyncio.StreamWriter,
        conn: int = 0,
    ) -> None:
        """Copy one direction; at its end of file pass the half-close on (HTTP clients
        may shut down writing and still read the answer); on an error drop both ends."""
        try:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                if self.tap is not None:
                    self.tap(conn, direction, time.time_ns(), chunk)
                if self.lose is not None and self.lose(direction, chunk):
                    self.lost += 1
                    raise ConnectionResetError("the proxy lost this chunk on purpose")
                if self.delay:
                    await asyncio.sleep(self.delay)
                await self._permit(direction)
                writer.write(chunk)
                self.last_forwarded[direction] = time.time()
                await writer.drain()
            await self._permit(direction)
            if writer.can_write_eof() and not writer.transport.is_closing():
                writer.write_eof()
        except (ConnectionError, OSError):
            for w in (writer, source):
                w.transport.abort()


# ---- process nemeses -------------------------------------------------------------------


def kill_hard(pid: int) -> None:
    """``kill -9``; a process already gone is not an error."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def freeze(pid: int) -> None:
    """SIGSTOP: the process keeps its sockets and locks but does nothing."""
    os.kill(pid, signal.SIGSTOP)


def thaw(pid: int) -> None:
    """SIGCONT after ``freeze``; a process gone meanwhile is not an error."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[None]:
    """The process stopped for the block, continued after it whatever happened."""
    freeze(pid)
    try:
        yield
    finally:
        thaw(pid)


def process_state(pid: int) -> str:
    """The one-letter state from ``/proc/<pid>/stat`` (``T`` stopped, ``Z`` zombie), or
    ``""`` when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""


def wait_state(pid: int, states: str, timeout: float = 5) -> str:
    """Wait until the process is in one of ``states`` (letters, ``""`` counts as gone)."""
    deadline = time.monotonic() + timeout
    while True:
        st = process_state(pid)
        if st in states or (not st and "-" in states):
            return st
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} is {st or 'gone'!r}, not one of {states!r}")
        time.sleep(0.01)
