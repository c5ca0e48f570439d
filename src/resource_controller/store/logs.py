"""Job output: one append-only file per job under ``<data>/logs`` (LOG-001, LOG-002).

Chunks are appended verbatim in arrival order and never rewritten. A job ID that is
not a safe file name is refused, so no request can write outside the log directory.

Reads never hold a whole log in memory (EXT-LIMITS-4): a snapshot is read chunk by
chunk from one open file, and an offset past the end reads nothing, however large.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from resource_controller import crashpoints, errors

_SAFE_ID = re.compile(r"^[A-Za-z0-9._-]+$")
READ_CHUNK = 32 * 1024
#: Largest log offset a reader may ask for (EXT-LIMITS-1).
MAX_OFFSET = 2**63 - 1


class Snapshot:
    """The bytes of one log from an offset up to its size when opened (EXT-LIMITS-4).

    Each ``read`` is one bounded ``pread``; the file stays open until ``close``. The
    calls block on the disk, so the controller makes them off its event loop.
    """

    def __init__(self, fd: int | None, offset: int, end: int) -> None:
        self._fd = fd
        self.offset = offset
        self.end = end

    def read(self, limit: int = READ_CHUNK) -> bytes:
        """The next ``limit`` bytes at most; empty once the snapshot is complete."""
        if self._fd is None or self.offset >= self.end:
            return b""
        chunk = os.pread(self._fd, min(limit, self.end - self.offset), self.offset)
        self.offset += len(chunk)
        if not chunk:
            self.end = self.offset  # shorter than it was: nothing more to send
        return chunk

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class LogStore:
    """Append and read job logs; files are created on first append, mode 0644."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)

    def path(self, job_id: str) -> Path:
        if not _SAFE_ID.match(job_id) or job_id in (".", ".."):
            raise errors.LogError(f"job id {job_id!r} cannot name a log file")
        return self.directory / f"{job_id}.log"

    def append(self, job_id: str, chunk: bytes) -> None:
        path = self.path(job_id)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                crashpoints.hit("log_append", ".before_write")
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
                crashpoints.hit("log_append", ".after_write")
            finally:
                os.close(fd)
        except OSError as exc:
            raise errors.LogError(f"append to log of {job_id} failed: {exc.strerror}") from exc

    def touch(self, job_id: str) -> None:
        """Create an empty log so a follower may attach before the first byte (LOG-003)."""
        self.append(job_id, b"")

    def read(self, job_id: str, offset: int = 0, limit: int = READ_CHUNK) -> bytes:
        """Up to ``limit`` bytes from ``offset``; empty when nothing (more) is stored."""
        snap = self.snapshot(job_id, offset)
        try:
            return snap.read(limit)
        finally:
            snap.close()

    def snapshot(self, job_id: str, offset: int = 0) -> Snapshot:
        """A reader of the bytes stored from ``offset`` on; empty past the end or for no file."""
        if not 0 <= offset <= MAX_OFFSET:
            raise ValueError(f"log offset {offset} is outside 0..{MAX_OFFSET}")
        try:
            fd = os.open(self.path(job_id), os.O_RDONLY)
        except FileNotFoundError:
            return Snapshot(None, offset, offset)
        try:
            size = os.fstat(fd).st_size
        except OSError:
            os.close(fd)
            raise
        return Snapshot(fd, offset, max(offset, size))
