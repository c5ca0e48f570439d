"""Job output in the database (migration 0009), so several controllers share it; each append locks
its ``job_logs`` row, so two never interleave."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from resource_controller import crashpoints, errors
from resource_controller.store import engine
from resource_controller.store.logs import (
    DEFAULT_MAX_BYTES,
    JobLogs,
    Layout,
    Piece,
    PieceReader,
    Snapshot,
    check_id,
    check_offset,
    marker_piece,
)

HEAD, TAIL = 0, 1  #: ``log_chunks.part``


def _failed(what: str, job_id: str, exc: Exception) -> errors.LogError:
    return errors.LogError(f"{what} log of {job_id} failed: {engine.first_line(exc)}")


class DatabaseLogStore(JobLogs):
    """``store.logs.JobLogs`` on the database at ``url`` (a libpq URL)."""

    remote = True

    def __init__(self, url: str, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        import psycopg

        self._url = url
        self._psycopg = psycopg
        self.layout = Layout.for_cap(max_bytes)
        self._lock = threading.Lock()
        self._conn: Any = None
        self._connection()  # a database that cannot be reached stops the start

    def _connection(self) -> Any:
        """The connection, opened again first when the server dropped it while it stood
        idle (a restart: ``engine.dropped``), so that no call is handed a dead one."""
        if self._conn is not None and engine.dropped(self._conn):
            self._conn.close()
            self._conn = None
        if self._conn is None:
            self._conn = engine.connect_postgres(self._url)
        return self._conn

    def _run(self, what: str, job_id: str, work: Callable[[Any], Any], again: bool = True) -> Any:
        """``work(connection)`` under the lock, errors as ``LogError``; run once more on a new
        connection unless ``again`` is False (an append may have committed)."""
        with self._lock:
            for last in (not again, True):
                try:
                    return work(self._connection())
                except self._psycopg.Error as exc:
                    if not self._drop_broken() or last:
                        raise _failed(what, job_id, exc) from exc

    def _drop_broken(self) -> bool:
        """Close the connection if the error took it; whether it did."""
        if self._conn is None or not self._conn.broken:
            return False
        self._conn.close()
        self._conn = None
        return True

    def append(self, job_id: str, chunk: bytes) -> None:
        check_id(job_id)

        def write(conn: Any) -> None:
            with conn.transaction():
                crashpoints.hit("log_append", ".before_write")
                self._append(conn, job_id, chunk)
            crashpoints.hit("log_append", ".after_write")

        self._run("append to", job_id, write, again=False)

    def _append(self, conn: Any, job_id: str, chunk: bytes) -> None:
        head, written = conn.execute(
            "INSERT INTO job_logs (job_id, head_bytes, tail_written) VALUES (%s, 0, 0)"
            " ON CONFLICT (job_id) DO UPDATE SET job_id = excluded.job_id"
            " RETURNING head_bytes, tail_written",
            (job_id,),
        ).fetchone()
        if not chunk:
            return
        layout = self.layout
        room = len(chunk) if layout is None else (max(0, layout.head - head) if not written else 0)
        if room:
            part = chunk[:room]
            conn.execute(_INSERT, (job_id, HEAD, head, part))
            head += len(part)
        rest = chunk[room:]
        if rest:
            assert layout is not None
            conn.execute(_INSERT, (job_id, TAIL, written, rest))
            written += len(rest)
            # Chunks wholly before the ring's last bytes are never read again.
            conn.execute(
                "DELETE FROM log_chunks WHERE job_id = %s AND part = %s"
                " AND at + length(data) <= %s",
                (job_id, TAIL, written - layout.ring),
            )
        conn.execute(
            "UPDATE job_logs SET head_bytes = %s, tail_written = %s WHERE job_id = %s",
            (head, written, job_id),
        )

    def snapshot(self, job_id: str, offset: int = 0, *, settled: bool = True) -> Snapshot:
        """The stored view from ``offset`` on; each piece's bytes are fetched when read."""
        check_offset(offset)
        check_id(job_id)

        def index(conn: Any) -> tuple[Any, list[Any]]:
            with conn.transaction():  # the row and its chunks as of one moment
                meta = conn.execute(
                    "SELECT head_bytes, tail_written FROM job_logs WHERE job_id = %s", (job_id,)
                ).fetchone()
                chunks = conn.execute(
                    "SELECT part, at, length(data) FROM log_chunks WHERE job_id = %s"
                    " ORDER BY part, at",
                    (job_id,),
                ).fetchall()
            return meta, chunks

        meta, chunks = self._run("read the", job_id, index)
        if meta is None:
            return Snapshot([], offset)
        pieces: list[Piece] = [
            (self._reader(job_id, HEAD, at), 0, n) for part, at, n in chunks if part == HEAD
        ]
        if not settled:
            return Snapshot(pieces, offset)
        _head, tail_written = meta
        written = int(tail_written)
        ring = self.layout.ring if self.layout is not None else written
        start = max(0, written - ring)  #: where the tail's kept bytes begin
        if start:
            pieces.append(marker_piece(start))
        for part, at, n in chunks:
            if part != TAIL or at + n <= start:
                continue
            skip = max(0, start - at)
            pieces.append((self._reader(job_id, TAIL, at), skip, n - skip))
        return Snapshot(pieces, offset)

    def _reader(self, job_id: str, part: int, at: int) -> PieceReader:
        """Reads ``n`` bytes from position ``pos`` of one chunk (empty once it is gone)."""

        def read(pos: int, n: int) -> bytes:
            def fetch(conn: Any) -> bytes:
                row = conn.execute(
                    "SELECT substring(data FROM %s FOR %s) FROM log_chunks"
                    " WHERE job_id = %s AND part = %s AND at = %s",
                    (pos + 1, n, job_id, part, at),
                ).fetchone()
                return b"" if row is None else bytes(row[0])

            return bytes(self._run("read the", job_id, fetch))

        return read

    def delete(self, job_id: str) -> bool:
        def remove(conn: Any) -> bool:
            with conn.transaction():
                conn.execute("DELETE FROM log_chunks WHERE job_id = %s", (job_id,))
                gone = conn.execute("DELETE FROM job_logs WHERE job_id = %s", (job_id,))
                return bool(gone.rowcount)

        return bool(self._run("delete the", job_id, remove))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


_INSERT = "INSERT INTO log_chunks (job_id, part, at, data) VALUES (%s, %s, %s, %s)"
