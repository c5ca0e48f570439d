"""Job output: a capped, append-only file per job; the head only grows, so an offset a follower
reached always names the same byte; the rest goes to a ring."""

from __future__ import annotations

import contextlib
import os
import re
import struct
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from resource_controller import crashpoints, errors
from resource_controller.store import private

_SAFE_ID = re.compile(r"^[A-Za-z0-9._-]+$")
READ_CHUNK = 32 * 1024
#: Largest log offset a reader may ask for.
MAX_OFFSET = 2**63 - 1
#: EXT-KEEP-1's default cap on one job's stored output.
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
#: The smallest cap ``--max-log-bytes`` accepts: room for a head, the marker and a tail.
MIN_MAX_BYTES = 4 * 1024
#: Room kept for the marker inside the cap; the marker is always shorter.
MARKER_ROOM = 256
_HEADER = struct.Struct(">QQ")  #: the ring file's header: bytes written, ring size


def marker(dropped: int) -> bytes:
    """The line that stands where output was dropped."""
    return (
        f"\n[rc: {dropped} bytes of output dropped here: the log is capped by"
        " --max-log-bytes, which keeps its head and its tail]\n"
    ).encode()


def marker_piece(dropped: int) -> Piece:
    text = marker(dropped)
    return text, 0, len(text)


@dataclass(frozen=True)
class Layout:
    """How a capped log's budget splits: the head file's share and the ring's size."""

    head: int
    ring: int

    @classmethod
    def for_cap(cls, max_bytes: int) -> Layout | None:
        """Half the cap for the head, the rest less the marker's room for the tail; None = no cap."""
        if max_bytes <= 0:
            return None
        head = max_bytes // 2
        return cls(head, max_bytes - head - MARKER_ROOM)


#: Reads ``n`` bytes at a position of one stored piece (a chunk in the database).
PieceReader = Callable[[int, int], bytes]
#: One piece of a log's view: file bytes at a position, literal bytes, or fetched bytes.
Piece = tuple[int | bytes | PieceReader, int, int]


class Snapshot:
    """The bytes of one log from an offset up to its size when opened, until ``close``."""

    def __init__(self, pieces: list[Piece], offset: int, fds: list[int] | None = None) -> None:
        self._pieces = pieces
        self._fds = fds or []
        self.offset = offset
        self.end = max(offset, sum(n for _, _, n in pieces))

    def read(self, limit: int = READ_CHUNK) -> bytes:
        """The next ``limit`` bytes at most; empty once the snapshot is complete."""
        if self.offset >= self.end:
            return b""
        start = 0
        for source, at, length in self._pieces:
            if self.offset < start + length:
                skip = self.offset - start
                n = min(limit, length - skip)
                if isinstance(source, bytes):
                    chunk = source[skip : skip + n]
                elif isinstance(source, int):
                    chunk = os.pread(source, n, at + skip)
                else:
                    chunk = source(at + skip, n)
                self.offset += len(chunk)
                if not chunk:
                    self.end = self.offset  # shorter than it was: nothing more to send
                return chunk
            start += length
        self.end = self.offset
        return b""

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []


class JobLogs(ABC):
    """Where job output lives: files, or the database when controllers share one."""

    layout: Layout | None
    #: An append waits on a database server, so it runs off the event loop; a file append in place.
    remote: bool

    @abstractmethod
    def append(self, job_id: str, chunk: bytes) -> None: ...

    @abstractmethod
    def snapshot(self, job_id: str, offset: int = 0, *, settled: bool = True) -> Snapshot:
        """A reader of the view from ``offset``; unsettled (running), only the head, which never
        moves."""

    @abstractmethod
    def delete(self, job_id: str) -> bool:
        """Remove a job's stored output (EXT-KEEP-1 retention); True when there was some."""

    def touch(self, job_id: str) -> None:
        """Create an empty log so a follower may attach before the first byte."""
        self.append(job_id, b"")


def check_offset(offset: int) -> None:
    if not 0 <= offset <= MAX_OFFSET:
        raise ValueError(f"log offset {offset} is outside 0..{MAX_OFFSET}")


def check_id(job_id: str) -> str:
    """``job_id`` when it is a safe file name; ``LogError`` otherwise."""
    if not _SAFE_ID.match(job_id) or job_id in (".", ".."):
        raise errors.LogError(f"job id {job_id!r} cannot name a log file")
    return job_id


class LogStore(JobLogs):
    """Job logs in files, 0600 in a 0700 directory; ``max_bytes`` caps each (0: no cap)."""

    remote = False

    def __init__(self, directory: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.directory = directory
        self.layout = Layout.for_cap(max_bytes)
        #: Serialised, so a reader never sees a ring header its bytes have not caught up with.
        self._lock = threading.Lock()
        private.private_dir(directory)

    def path(self, job_id: str) -> Path:
        return self.directory / f"{check_id(job_id)}.log"

    def tail_path(self, job_id: str) -> Path:
        """The ring of a log past its head."""
        return self.path(job_id).with_suffix(".tail")

    def append(self, job_id: str, chunk: bytes) -> None:
        path = self.path(job_id)
        try:
            with self._lock:
                crashpoints.hit("log_append", ".before_write")
                self._append(job_id, path, chunk)
                crashpoints.hit("log_append", ".after_write")
        except OSError as exc:
            raise errors.LogError(f"append to log of {job_id} failed: {exc.strerror}") from exc

    def _append(self, job_id: str, path: Path, chunk: bytes) -> None:
        ring = self.tail_path(job_id)
        if self.layout is None or (not chunk and not ring.exists()):
            _append_file(path, chunk)
            return
        view = memoryview(chunk)
        if not ring.exists():
            size = path.stat().st_size if path.exists() else 0
            room = max(0, self.layout.head - size)
            _append_file(path, view[:room])
            view = view[room:]
            if not view:
                return
        _ring_write(ring, view, self.layout.ring)

    def snapshot(self, job_id: str, offset: int = 0, *, settled: bool = True) -> Snapshot:
        check_offset(offset)
        fds: list[int] = []
        try:
            with self._lock:
                pieces = self._pieces(job_id, fds, settled)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return Snapshot(pieces, offset, fds)

    def _pieces(self, job_id: str, fds: list[int], settled: bool) -> list[Piece]:
        try:
            fd = os.open(self.path(job_id), os.O_RDONLY)
        except FileNotFoundError:
            return []
        fds.append(fd)
        pieces: list[Piece] = [(fd, 0, os.fstat(fd).st_size)]
        if not settled:
            return pieces
        try:
            rfd = os.open(self.tail_path(job_id), os.O_RDONLY)
        except FileNotFoundError:
            return pieces
        fds.append(rfd)
        written, size = _header(rfd)
        if written <= size:
            return [*pieces, (rfd, _HEADER.size, written)]
        start = written % size
        return [
            *pieces,
            marker_piece(written - size),
            (rfd, _HEADER.size + start, size - start),
            (rfd, _HEADER.size, start),
        ]

    def delete(self, job_id: str) -> bool:
        found = False
        with self._lock:
            for p in (self.path(job_id), self.tail_path(job_id)):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
                    found = True
        return found


def _append_file(path: Path, data: bytes | memoryview) -> None:
    with open(path, "ab", opener=lambda p, flags: os.open(p, flags, private.FILE_MODE)) as f:
        f.write(data)


def _header(fd: int) -> tuple[int, int]:
    raw = os.pread(fd, _HEADER.size, 0)
    if len(raw) < _HEADER.size:
        return 0, 1
    written, size = _HEADER.unpack(raw)
    return int(written), max(1, int(size))


def _pwrite_all(fd: int, data: memoryview, at: int) -> None:
    while data:
        n = os.pwrite(fd, data, at)
        data, at = data[n:], at + n


def _ring_write(path: Path, data: memoryview, ring_size: int) -> None:
    """Write ``data`` into the ring, then the header that counts it; a ring keeps its size."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, private.FILE_MODE)
    try:
        written, size = _header(fd)
        if written == 0:
            size = max(1, ring_size)
        total = written + len(data)
        if len(data) > size:
            data = data[len(data) - size :]
        pos = (total - len(data)) % size
        first = min(len(data), size - pos)
        _pwrite_all(fd, data[:first], _HEADER.size + pos)
        _pwrite_all(fd, data[first:], _HEADER.size)
        os.pwrite(fd, _HEADER.pack(total, size), 0)
    finally:
        os.close(fd)
