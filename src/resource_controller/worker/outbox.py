"""The outbox: a job's outcome, and its output, are never lost to a controller outage.

The terminal report is what frees a device, and the fault report is what keeps a dirty
one out of the pool. A chunk of a job's output the controller did not take comes here
too (``logship``): kept and delivered in order, before the job's terminal report. The base design gave up on them after about 28 seconds,
so a controller down for longer lost the job's real outcome: the lease expired, the job
was recorded ``lost`` and the device quarantined although nothing went wrong on the
host. Here every such report is written to disk before its first attempt and retried,
with backoff capped at ``Timings.outbox_backoff_max``, until the controller answers 2xx or refuses it
for good:

- 404: the job or device is unknown (a controller whose database was replaced);
- 409 ``stale_lease``: the report belongs to a lease that is no longer the job's;
- 409 saying the job is already terminal.

A chunk of output is refused for good by any 400, 404, 409, 413 or 422 (it is dropped
with a warning). Anything else (transport errors, 5xx, other 4xx) is retried: the answer that keeps a
possibly-occupied device out of the pool wins, and while a job's report waits here the
worker names the job as pending in its heartbeats, which keeps its lease (and so its
device) held without the job being treated as running.

On disk: the directory ``<state_dir>/outbox`` (mode 0700) holds one file per report,
``<seq>-<kind>.json`` with a zero-padded sequence number that orders them, containing
one JSON object::

    {"version": 1, "kind": "status" | "fault" | "log", "job_id": "...", "device_id": "...",
     "device_ids": ["..."], "body": {...}, "created_at": <unix seconds>}

``body`` is the exact request body (``worker_id`` and ``lease_epoch`` included, so a
restarted worker re-sends what the old process meant); the route follows from the kind:
``POST /v1/jobs/{job_id}/status``, ``POST /v1/devices/{device_id}/fault``, or for a
``log`` ``POST /v1/jobs/{job_id}/logs`` with the bytes of ``"chunk"`` (base64) and the
``lease_epoch`` of its body. A file is
written under a temporary name, fsynced, renamed into place and the directory fsynced,
so after a crash a report file is either whole or absent. It is removed once the
controller has answered for good; for a terminal report without a directory fsync (a
removal a crash undoes only re-sends a report the controller takes as a repeat). ``<state_dir>/lock`` is held (``flock``) while a
worker uses the directory, so two processes never send the same reports.

Order: a report waits for every earlier *fault* report naming one of its devices, so a
job's terminal report never overtakes the fault found at its end: the controller frees the device the moment the terminal report lands.
A chunk of output waits for the job's earlier chunks, and the job's terminal report for
all of them. Reports for unrelated devices never wait for each other.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import enum
import fcntl
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from resource_controller.clock import Clock, SystemClock
from resource_controller.h1.aio import Answer
from resource_controller.worker import channel, procs
from resource_controller.worker.timings import DEFAULT, Timings

log = logging.getLogger(__name__)

#: Each of the first attempts' failures is a warning; at this one an error says the
#: report is now waiting out an outage; after it only every ``QUIET_EVERY``-th failure
#: is logged, because retrying never stops.
LOUD_ATTEMPTS = 5
QUIET_EVERY = 30

SUBDIR = "outbox"
LOCK_FILE = "lock"
FORMAT_VERSION = 1
STATUS = "status"
FAULT = "fault"
LOG = "log"
_KINDS = (STATUS, FAULT, LOG)
#: What refuses a chunk of output for good: retrying it would never help.
LOG_REFUSALS = frozenset({400, 404, 409, 413, 422})


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
    #: The output a ``log`` report carries.
    chunk: bytes = b""
    #: Its file once durable; ``""`` before that, or when the disk refused it.
    path: str = ""
    attempts: int = 0
    #: Set when it leaves the outbox, delivered or refused.
    gone: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def route(self) -> str:
        """The route its kind names (what ``send`` calls through the sender)."""
        if self.kind == FAULT:
            return f"/v1/devices/{self.device_id}/fault"
        if self.kind == LOG:
            return f"/v1/jobs/{self.job_id}/logs"
        return f"/v1/jobs/{self.job_id}/status"

    async def send(self, sender: Sender, timeout: float) -> Answer:
        """One attempt, on the route its kind names."""
        if self.kind == FAULT:
            return await sender.fault(self.device_id, self.body, timeout)
        if self.kind == LOG:
            epoch = self.body.get("lease_epoch")
            return await sender.append_log(
                self.job_id, self.chunk, epoch if isinstance(epoch, int) else None, timeout
            )
        return await sender.status(self.job_id, self.body, timeout)

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


def _decode(name: str, raw: bytes) -> Report:
    """Rebuild a report from its file; ``ValueError`` when it is not one."""
    seq_text, _, _ = name.partition("-")
    if not seq_text.isdigit():
        raise ValueError("file name does not start with a sequence number")
    data = json.loads(raw)
    if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
        raise ValueError("not a version 1 outbox record")
    kind, body = data.get("kind"), data.get("body")
    job_id, device_id = data.get("job_id", ""), data.get("device_id", "")
    device_ids = data.get("device_ids", [])
    created = data.get("created_at", 0.0)
    if kind not in _KINDS or not isinstance(body, dict):
        raise ValueError("unknown kind or missing body")
    if not isinstance(job_id, str) or not isinstance(device_id, str):
        raise ValueError("job_id and device_id must be strings")
    if not isinstance(device_ids, list) or not all(isinstance(d, str) for d in device_ids):
        raise ValueError("device_ids must be a list of strings")
    if (kind != FAULT and not job_id) or (kind == FAULT and not device_id):
        raise ValueError("the report names no target")
    if not isinstance(created, int | float):
        raise ValueError("created_at must be a number")
    chunk = b""
    if kind == LOG:
        try:
            chunk = base64.b64decode(data.get("chunk", ""), validate=True)
        except (TypeError, binascii.Error) as exc:
            raise ValueError("chunk is not base64") from exc
    return Report(
        seq=int(seq_text),
        kind=kind,
        job_id=job_id,
        device_id=device_id,
        device_ids=tuple(device_ids),
        body=body,
        created_at=float(created),
        chunk=chunk,
    )


# ---- the files -----------------------------------------------------------------------


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
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
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


# ---- the outbox ----------------------------------------------------------------------


class Outbox:
    """The reports not yet answered for good, in memory and on disk."""

    def __init__(self, directory: str, lock_fd: int = -1, clock: Clock | None = None) -> None:
        self.directory = directory
        self._lock_fd = lock_fd
        self._clock: Clock = clock or SystemClock()
        self._reports: dict[int, Report] = {}
        self._next_seq = 1
        self._empty = asyncio.Event()
        self._empty.set()

    @classmethod
    def open(cls, state_dir: str, clock: Clock | None = None) -> Outbox:
        """Create ``state_dir`` if missing (0700), lock it and load what a previous run left.

        Raises ``OutboxError`` when the directory cannot be created, locked or read: a
        worker that cannot keep its reports must not start.
        """
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
            # The default is per host name, so this is a second worker
            # with the same host (or an explicit state_dir shared by mistake).
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
                # Never renamed into place, so never attempted: the process died while
                # writing it. Its report is gone with that process.
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
        self._empty.clear()

    # ---- reading ---------------------------------------------------------------------

    @property
    def empty(self) -> bool:
        return not self._reports

    def __len__(self) -> int:
        return len(self._reports)

    def reports(self) -> list[Report]:
        """Every report still here, oldest first."""
        return [self._reports[s] for s in sorted(self._reports)]

    def pending_job_ids(self) -> list[str]:
        """Jobs whose terminal report waits here: named as pending in heartbeats."""
        seen: dict[str, None] = {}
        for report in self.reports():
            if report.kind == STATUS:
                seen.setdefault(report.job_id, None)
        return list(seen)

    async def wait_empty(self) -> None:
        await self._empty.wait()

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

    # ---- writing ---------------------------------------------------------------------

    def add_status(self, job_id: str, device_ids: Sequence[str], body: dict[str, Any]) -> Report:
        """Take a terminal report in (in memory at once; ``persist`` makes it durable)."""
        return self._add(STATUS, job_id, "", tuple(device_ids), body)

    def add_fault(self, device_id: str, reason: str, job_id: str = "") -> Report:
        """Take a device fault report in."""
        return self._add(FAULT, job_id, device_id, (device_id,), channel.fault_body(reason))

    def add_log(self, job_id: str, chunk: bytes, lease_epoch: int | None) -> Report:
        """Take in a chunk of output the controller did not take."""
        body = {"lease_epoch": lease_epoch} if lease_epoch else {}
        report = self._add(LOG, job_id, "", (), body)
        report.chunk = chunk
        return report

    def _add(
        self,
        kind: str,
        job_id: str,
        device_id: str,
        device_ids: tuple[str, ...],
        body: dict[str, Any],
    ) -> Report:
        # Synchronous on purpose: from this instant the report counts (a terminal
        # report's job is pending, never running; the outbox is not empty), with no
        # await in between for a heartbeat or a re-registration to slip into.
        report = Report(
            seq=self._next_seq,
            kind=kind,
            job_id=job_id,
            device_id=device_id,
            device_ids=device_ids,
            body=dict(body),
            created_at=self._clock.now(),
        )
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
            # Still delivered from memory: a full disk must not cost the outcome while
            # the worker lives. Only a restart would lose it now.
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
            self._empty.set()
        if report.path:
            try:
                if report.kind == STATUS:
                    # A terminal report a crash brings back is re-sent and answered
                    # as a silent success: one unlink, no fsync, no
                    # thread. A fault report brought back would take a device the
                    # operator may have cleared out again, and a chunk of output would
                    # be stored twice, so their removal is durable.
                    _remove(report.path, durably=False)
                else:
                    await asyncio.to_thread(_remove, report.path, durably=True)
            except OSError as exc:
                # Re-sent at the next start; the controller then answers that it is
                # already known, and it goes.
                log.error(
                    "outbox: cannot remove %s: %s",
                    report.path,
                    exc,
                    extra={"action": "outbox_remove"},
                )


# ---- delivery ------------------------------------------------------------------------


class Verdict(enum.Enum):
    DELIVERED = "delivered"
    REFUSED = "refused"
    RETRY = "retry"


def judge(resp: Answer, kind: str = STATUS) -> Verdict:
    """What an answer means for a report of ``kind``.

    2xx delivers. 404, 409 ``stale_lease`` and a 409 saying the job is already
    terminal refuse it for good. The last is recognised by the word "terminal" in the
    error code or message, since no code is reserved for it. A chunk of output is also
    refused by the answers in ``LOG_REFUSALS``. Everything else is retried.
    """
    if resp.is_success:
        return Verdict.DELIVERED
    if resp.status_code == 404 or (kind == LOG and resp.status_code in LOG_REFUSALS):
        return Verdict.REFUSED
    if resp.status_code == 409:
        code, message = channel.error_body(resp)
        if code == "stale_lease" or "terminal" in f"{code} {message}".lower():
            return Verdict.REFUSED
    return Verdict.RETRY


class Sender(Protocol):
    """Sends one attempt of a report: the answer, or one of ``channel.TRANSPORT_ERRORS``.

    ``channel.Channel`` is one.
    """

    async def status(self, job_id: str, body: Mapping[str, Any], timeout: float) -> Answer: ...

    async def fault(self, device_id: str, body: Mapping[str, Any], timeout: float) -> Answer: ...

    async def append_log(
        self, job_id: str, chunk: bytes, lease_epoch: int | None, timeout: float | None = None
    ) -> Answer: ...


def _log_failure(report: Report, problem: str) -> None:
    extra = {"action": "outbox_retry", "job_id": report.job_id}
    n = report.attempts
    if n == LOUD_ATTEMPTS:
        log.error(
            "%s still not delivered after %d attempts (%s); it stays in the outbox and is "
            "retried until the controller answers",
            report.label,
            n,
            problem,
            extra=extra,
        )
    elif n < LOUD_ATTEMPTS or n % QUIET_EVERY == 0:
        log.warning("%s attempt %d failed: %s", report.label, n, problem, extra=extra)


async def deliver(
    box: Outbox, report: Report, sender: Sender, timings: Timings = DEFAULT
) -> Verdict:
    """Send ``report`` until the controller answers for good; never gives up on its own.

    Waits first for earlier faults about the same devices. Each attempt is bounded by
    ``report_attempt_timeout``; waits between attempts double from ``outbox_backoff``
    up to ``outbox_backoff_max``. Cancelling it leaves the report in the outbox (and
    on disk).
    """
    for earlier in box.predecessors(report):
        await earlier.gone.wait()
    bound = timings.report_attempt_timeout
    delay = timings.outbox_backoff
    while True:
        report.attempts += 1
        try:
            async with asyncio.timeout(bound):
                resp = await report.send(sender, bound)
        except channel.TRANSPORT_ERRORS as exc:
            problem = channel.error_text(exc)
        else:
            verdict = judge(resp, report.kind)
            if verdict is not Verdict.RETRY:
                await box.discard(report)
                if verdict is Verdict.REFUSED:
                    log.warning(
                        "%s refused for good by the controller (%s: %s); dropped",
                        report.label,
                        channel.status_line(resp),
                        channel.error_body(resp)[1] or "no detail",
                        extra={"action": "outbox_refused", "job_id": report.job_id},
                    )
                elif report.attempts > 1:
                    log.info(
                        "%s delivered at attempt %d",
                        report.label,
                        report.attempts,
                        extra={"action": "outbox_delivered", "job_id": report.job_id},
                    )
                return verdict
            problem = f"controller returned {channel.status_line(resp)}"
        _log_failure(report, problem)
        await asyncio.sleep(delay)
        delay = min(delay * 2, timings.outbox_backoff_max)
