"""Job output: one append-only file per job under ``<data>/logs`` (LOG-001, LOG-002).

Chunks are appended verbatim in arrival order and never rewritten. A job ID that is
not a safe file name is refused, so no request can write outside the log directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from resource_controller import errors

_SAFE_ID = re.compile(r"^[A-Za-z0-9._-]+$")
READ_CHUNK = 32 * 1024


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
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        except OSError as exc:
            raise errors.LogError(f"append to log of {job_id} failed: {exc.strerror}") from exc

    def touch(self, job_id: str) -> None:
        """Create an empty log so a follower may attach before the first byte (LOG-003)."""
        self.append(job_id, b"")

    def read(self, job_id: str, offset: int = 0, limit: int = READ_CHUNK) -> bytes:
        """Up to ``limit`` bytes from ``offset``; empty when nothing (more) is stored."""
        try:
            with open(self.path(job_id), "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return b""
