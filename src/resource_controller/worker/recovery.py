"""The recovery proof sent at registration (WRK-140..143): whatever the worker cannot see
makes it claim nothing; the ``Journal`` says which ``RC_JOB_ID`` carriers are its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from collections.abc import Iterable

from resource_controller.worker import procs

log = logging.getLogger(__name__)

#: Only the true fields; ``{}`` for "no claim".
Claims = dict[str, bool]

JOURNAL_DIR = "jobs"
COMPLETE = ".complete"
#: A job ID used as a record's name as it is; any other is named by its hash.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}\Z")


def record_name(job_id: str) -> str:
    """A job's ID when it is a plain name, else ``#`` and a hash."""
    if _PLAIN_NAME.match(job_id):
        return job_id
    raw = job_id.encode("utf-8", errors="surrogateescape")
    return "#" + hashlib.sha256(raw).hexdigest()[:40]


class Journal:
    """The jobs this worker started whose processes may still live, one empty file each;
    complete only while ``COMPLETE`` is there. No fsync: a reboot took every job with it."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    @classmethod
    def open(cls, state_dir: str, *, fresh: bool) -> Journal:
        """Created if missing; complete only in a ``fresh`` state directory."""
        journal = cls(os.path.join(state_dir, JOURNAL_DIR))
        try:
            if not os.path.isdir(journal.directory):
                os.mkdir(journal.directory, 0o700)
                if fresh:
                    journal._touch(COMPLETE)
        except OSError as exc:
            log.error(
                "recovery journal: %s; no recovery proof will be claimed while processes "
                "carry an RC_JOB_ID",
                procs.os_error_text("create", journal.directory, exc),
                extra={"action": "recovery_journal"},
            )
        return journal

    def _touch(self, name: str) -> None:
        os.close(os.open(os.path.join(self.directory, name), os.O_WRONLY | os.O_CREAT, 0o600))

    def started(self, job_id: str) -> None:
        """Record a job before anything of it runs; failing, the journal is incomplete."""
        try:
            self._touch(record_name(job_id))
        except OSError as exc:
            log.error(
                "job %s: cannot record it in %s (%s); until a scan shows nothing left of it, "
                "no recovery proof will be claimed",
                job_id,
                self.directory,
                exc.strerror or exc,
                extra={"action": "recovery_journal", "job_id": job_id},
            )
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.directory, COMPLETE))

    def ended(self, job_id: str) -> None:
        """Nothing of the job is left; a record that stays only withholds a proof."""
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.directory, record_name(job_id)))

    def read(self) -> frozenset[str] | None:
        """The records' names; ``None`` when the journal cannot say which jobs are ours."""
        try:
            names = os.listdir(self.directory)
        except OSError:
            return None
        if COMPLETE not in names:
            return None
        return frozenset(n for n in names if n != COMPLETE)

    def settle(self, listed: frozenset[str] | None, carried: Iterable[str]) -> None:
        """After a scan that saw every environment; an incomplete one takes every carried job."""
        alive = {record_name(j) for j in carried}
        with contextlib.suppress(OSError):  # left as it was: at worst a proof withheld
            if listed is None:
                for name in sorted(alive):
                    self._touch(name)
                self._touch(COMPLETE)
                return
            for name in listed - alive:
                os.unlink(os.path.join(self.directory, name))


def compute(require_manual_clear: bool, journal: Journal, *, own_pid: int | None = None) -> Claims:
    """Decide the proof from ``/proc`` now (WRK-141) and settle the journal; no job starting."""
    pid = os.getpid() if own_pid is None else own_pid
    extra = {"action": "recovery_proof"}
    if require_manual_clear:
        log.info(
            "recovery proof: none (require_manual_clear is set; a quarantined device "
            "waits for an operator)",
            extra=extra,
        )
        return {}
    listed = journal.read()
    scan = procs.scan_carriers(exclude=(pid,))
    if scan is not None and not scan.blind:
        journal.settle(listed, scan.pids.values())
    if pid == 1 and scan is not None and procs.alone(pid):
        log.info("recovery proof: isolated (PID 1, alone in its PID namespace)", extra=extra)
        return {"isolated": True}
    if scan is None:
        log.warning("recovery proof: none (%s cannot be read)", procs.PROC_ROOT, extra=extra)
        return {}
    ours = {p: j for p, j in scan.pids.items() if listed is None or record_name(j) in listed}
    if ours and listed is None:
        log.info(
            "recovery proof: none (%d process(es) carry RC_JOB_ID and %s cannot say which "
            "jobs were this worker's)",
            len(ours),
            journal.directory,
            extra=extra,
        )
        return {}
    if ours:
        pid_found, job_id = min(ours.items())
        log.info(
            "recovery proof: survivors found (%d process(es) carry the RC_JOB_ID of a job "
            "of this worker, e.g. pid %d with %s)",
            len(ours),
            pid_found,
            job_id,
            extra=extra,
        )
        return {"survivors_checked": True, "survivors_found": True}
    if scan.blind:
        log.info("recovery proof: none (some processes' environments cannot be read)", extra=extra)
        return {}
    log.info("recovery proof: no surviving job processes", extra=extra)
    return {"survivors_checked": True}
