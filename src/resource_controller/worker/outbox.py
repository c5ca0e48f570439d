"""The outbox: reports kept on disk until the controller answers them for good.

Terminal and fault reports, and chunks of output the controller did not take, are
written before their first attempt (``delivery`` retries them; EXT-OUTBOX-1), and
heartbeats name a job pending while its outcome waits here (EXT-OUTBOX-2). On disk:
``<state_dir>/outbox`` (0700), one ``<seq>-<kind>.json`` per report whose ``body`` is the
exact request body, so a restarted worker re-sends what the old process meant;
``<state_dir>/lock`` (``flock``) keeps a second worker out.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from resource_controller.clock import Clock, SystemClock
from resource_controller.worker import channel, procs

log = logging.getLogger(__name__)

SUBDIR = "outbox"
LOCK_FILE = "lock"
FORMAT_VERSION = 1
STATUS = "status"
FAULT = "fault"
LOG = "log"


class OutboxError(Exception):
    """The state directory cannot be used; the message is the whole one-line story."""


@dataclass(eq=False)
class Report:
    """One report that must reach the controller."""

    seq: int
    kind: str
    #: The job reported on (``status``), or whose end revealed the fault (may be ``""``).
    job_id: str
    #: The device a ``fault`` is about (``""`` for a ``status`` report).
    device_id: str
    #: Every device the report concerns: what orders it behind earlier faults.
    device_ids: tuple[str, ...]
    body: dict[str, Any]
    created_at: float
    chunk: bytes = b""
    #: Its file once durable; ``""`` before that, or when the disk refused it.
    path: str = ""
    attempts: int = 0
    gone: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def label(self) -> str:
        """How logs name it."""
        if self.kind == FAULT:
            return f"device {self.device_id}: fault report"
        if self.kind == LOG:
            return f"job {self.job_id}: {len(self.chunk)} bytes of output"
        return f"job {self.job_id}: terminal report ({self.body.get('state', '?')})"

    @property
    def file_name(self) -> str:
        return f"{self.seq:012d}-{self.kind}.json"

    def encode(self) -> bytes:
        record = {
            "version": FORMAT_VERSION,
            "kind": self.kind,
            "job_id": self.job_id,
            "device_id": self.device_id,
            "device_ids": list(self.device_ids),
            "body": self.body,
            "created_at": self.created_at,
        }
        if self.kind == LOG:
            record["chunk"] = base64.b64encode(self.chunk).decode("ascii")
        return json.dumps(record, sort_keys=True).encode()


class _Record(BaseModel):
    """A report's file, read as strictly as it was written."""

    model_config = ConfigDict(strict=True)

    version: Literal[1]
    kind: Literal["status", "fault", "log"]
    job_id: str = ""
    device_id: str = ""
    device_ids: list[str] = []
    body: dict[str, Any]
    created_at: float = 0.0
    chunk: str = ""


def _decode(name: str, raw: bytes) -> Report:
    """Rebuild a report from its file; ``ValueError`` when it is not one."""
    seq_text = name.partition("-")[0]
    if not seq_text.isdigit():
        raise ValueError("file name does not start with a sequence number")
    try:
        r = _Record.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(" ".join(map(str, (*first["loc"], first["msg"])))) from None
    if not (r.device_id if r.kind == FAULT else r.job_id):
        raise ValueError("the report names no target")
    try:
        chunk = base64.b64decode(r.chunk, validate=True) if r.kind == LOG else b""
    except binascii.Error as exc:
        raise ValueError("chunk is not base64") from exc
    ids = tuple(r.device_ids)
    return Report(int(seq_text), r.kind, r.job_id, r.device_id, ids, r.body, r.created_at, chunk)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(directory: str, name: str, data: bytes) -> str:
    """Write ``data`` to ``directory/name`` so that a crash leaves it whole or absent."""
    final = os.path.join(directory, name)
    temp = os.path.join(directory, f".{name}.tmp")
    try:
        with open(temp, "wb", opener=lambda p, flags: os.open(p, flags, 0o600)) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, final)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _fsync_dir(directory)
    return final


def _remove(path: str, *, durably: bool) -> None:
    """Unlink an answered report's file; fsync the directory only when ``durably``."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    if durably:
        _fsync_dir(os.path.dirname(path))


def _make_dir(path: str) -> None:
    """Create ``path`` (and parents) as 0700 if missing; an existing one is left as it is."""
    if os.path.isdir(path):
        return
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)  # the umask must not widen or narrow what we asked for
    except OSError as exc:
        raise OutboxError("state_dir: " + procs.os_error_text("mkdir", path, exc)) from exc


class Outbox:
    """The reports not yet answered for good, in memory and on disk."""

    def __init__(self, directory: str, lock_fd: int = -1, clock: Clock | None = None) -> None:
        self.directory = directory
        self._lock_fd = lock_fd
        self._clock: Clock = clock or SystemClock()
        self._reports: dict[int, Report] = {}
        self._next_seq = 1
        #: Set while no report is here: what the start-up drain waits for.
        self.emptied = asyncio.Event()
        self.emptied.set()

    @classmethod
    def open(cls, state_dir: str, clock: Clock | None = None) -> Outbox:
        """Create ``state_dir`` if missing (0700), lock it and load what a previous run
        left; ``OutboxError`` if it cannot: a worker that cannot keep reports must not start."""
        _make_dir(state_dir)
        lock_path = os.path.join(state_dir, LOCK_FILE)
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise OutboxError("state_dir: " + procs.os_error_text("open", lock_path, exc)) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            # The default is per host name: a second worker with the same one.
            raise OutboxError(
                f"state_dir {state_dir} is in use by another worker process "
                f"({exc.strerror}): two workers on one machine need different host "
                "names or each its own state_dir in worker.yaml"
            ) from exc
        box = cls(os.path.join(state_dir, SUBDIR), fd, clock)
        try:
            _make_dir(box.directory)
            box._load()
        except BaseException:
            box.close()
            raise
        return box

    def close(self) -> None:
        """Release the directory; reports still here stay on disk for the next start."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = -1

    def _load(self) -> None:
        try:
            names = sorted(os.listdir(self.directory))
        except OSError as exc:
            raise OutboxError(
                "state_dir: " + procs.os_error_text("open", self.directory, exc)
            ) from exc
        for name in names:
            path = os.path.join(self.directory, name)
            number = name.lstrip(".").partition("-")[0]
            if number.isdigit():  # never reuse a number, not even a set-aside one's
                self._next_seq = max(self._next_seq, int(number) + 1)
            if name.startswith(".") and name.endswith(".tmp"):
                # Never renamed into place, so never attempted: gone with its process.
                log.warning(
                    "outbox: removing %s, a report the previous run did not finish writing",
                    path,
                    extra={"action": "outbox_load"},
                )
                with contextlib.suppress(OSError):
                    os.unlink(path)
                continue
            if not name.endswith(".json"):
                continue
            try:
                with open(path, "rb") as f:
                    report = _decode(name, f.read())
            except (OSError, ValueError) as exc:
                log.error(
                    "outbox: %s is not a readable report (%s); moved aside as %s.bad",
                    path,
                    exc,
                    name,
                    extra={"action": "outbox_load"},
                )
                with contextlib.suppress(OSError):
                    os.replace(path, path + ".bad")
                continue
            report.path = path
            self._insert(report)
        if self._reports:
            log.info(
                "outbox: %d report(s) left by the previous run in %s",
                len(self._reports),
                self.directory,
                extra={"action": "outbox_load"},
            )

    def _insert(self, report: Report) -> None:
        self._reports[report.seq] = report
        self.emptied.clear()

    @property
    def empty(self) -> bool:
        return not self._reports

    def __len__(self) -> int:
        return len(self._reports)

    def reports(self) -> list[Report]:
        """Oldest first."""
        return [self._reports[s] for s in sorted(self._reports)]

    def pending_attempts(self) -> list[tuple[str, int | None]]:
        """(job, lease epoch) of every terminal report waiting here: attempts never to run again."""
        return [(r.job_id, r.body.get("lease_epoch")) for r in self.reports() if r.kind == STATUS]

    def pending_job_ids(self) -> list[str]:
        """Jobs whose terminal report waits here: named as pending in heartbeats."""
        return list(dict.fromkeys(r.job_id for r in self.reports() if r.kind == STATUS))

    def predecessors(self, report: Report) -> list[Report]:
        """What must land first: earlier fault reports about one of its devices, and the
        job's output (its earlier chunks; every chunk, for its terminal report)."""
        mine = set(report.device_ids)
        output = report.kind in (LOG, STATUS)
        return [
            r
            for r in self.reports()
            if (r.seq < report.seq and r.kind == FAULT and mine.intersection(r.device_ids))
            or (
                output
                and r.kind == LOG
                and r.job_id == report.job_id
                and (r.seq < report.seq or report.kind == STATUS)
            )
        ]

    def add_status(self, job_id: str, device_ids: Sequence[str], body: dict[str, Any]) -> Report:
        """Take a terminal report in (in memory at once; ``persist`` makes it durable)."""
        return self._add(STATUS, job_id, "", tuple(device_ids), body)

    def add_fault(self, device_id: str, reason: str, job_id: str = "") -> Report:
        return self._add(FAULT, job_id, device_id, (device_id,), channel.fault_body(reason))

    def add_log(self, job_id: str, chunk: bytes, lease_epoch: int | None) -> Report:
        """Take in a chunk of output the controller did not take."""
        body = {"lease_epoch": lease_epoch} if lease_epoch else {}
        return self._add(LOG, job_id, "", (), body, chunk)

    def _add(
        self,
        kind: str,
        job_id: str,
        device_id: str,
        ids: tuple[str, ...],
        body: dict[str, Any],
        chunk: bytes = b"",
    ) -> Report:
        # Synchronous on purpose: from this instant the report counts (its job pending,
        # the outbox not empty), with no await for a heartbeat or a registration to slip in.
        now = self._clock.now()
        report = Report(self._next_seq, kind, job_id, device_id, ids, dict(body), now, chunk)
        self._next_seq += 1
        self._insert(report)
        return report

    async def persist(self, report: Report) -> None:
        """Write the report durably; a disk that refuses leaves it in memory only."""
        try:
            report.path = await asyncio.to_thread(
                write_durably, self.directory, report.file_name, report.encode()
            )
        except OSError as exc:
            # Still delivered from memory: a full disk must not cost the outcome.
            log.error(
                "%s could not be written to %s (%s); it is kept in memory only",
                report.label,
                self.directory,
                exc,
                extra={"action": "outbox_write", "job_id": report.job_id},
            )

    async def discard(self, report: Report) -> None:
        """It was answered for good: forget it, then remove its file."""
        if self._reports.pop(report.seq, None) is None:
            return
        report.gone.set()
        if not self._reports:
            self.emptied.set()
        if report.path:
            try:
                if report.kind == STATUS:
                    # One brought back by a crash is re-sent and answered as a silent
                    # success, so no fsync; a fault brought back would take a device
                    # the operator may have cleared again, a chunk would be stored twice.
                    _remove(report.path, durably=False)
                else:
                    await asyncio.to_thread(_remove, report.path, durably=True)
            except OSError as exc:  # re-sent at the next start, and answered as known
                log.error(
                    "outbox: cannot remove %s: %s",
                    report.path,
                    exc,
                    extra={"action": "outbox_remove"},
                )
