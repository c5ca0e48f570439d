"""Ending a finished job's stragglers by their ``RC_JOB_ID``.

A child that calls ``setsid`` (a daemon, tmux, ``nohup ... &`` under a new session)
leaves the job's process group and session, so tearing the job's target down never
reaches it; but it keeps its environment. After every job's target is gone, on every
path, the worker therefore looks for live processes whose ``RC_JOB_ID`` is exactly this
job's ID and ends them: SIGTERM first, SIGKILL for whatever is left.

This pass (the spec's "straggler sweep", not to be confused with the controller's
reaper) only reports. It never changes the job's state, exit code or reason: a job
that exited 0 and left a detached process is a successful job, and whether the device
is still dirty is the verify pass's business. Hooks, probes and verify
scripts are never swept (their ``RC_JOB_ID`` names the job they serve).

Known residual: a process that re-execs with a scrubbed environment is
invisible here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import dataclass

from resource_controller.worker import procs
from resource_controller.worker.timings import DEFAULT, Timings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StragglerReport:
    """What one pass saw and did; nothing else comes out of it."""

    #: ``/proc`` was read (false for an empty job ID or an unreadable ``/proc``).
    scanned: bool
    #: Every PID that carried the job's ID at some scan, in order of discovery.
    found: tuple[int, ...] = ()
    #: PIDs still carrying it after the SIGKILL phase.
    remaining: tuple[int, ...] = ()
    #: Some environment could not be read: an escapee may have been missed.
    blind: bool = False

    @property
    def clean(self) -> bool:
        """Scanned, not blind, and nothing left: the only report that proves anything."""
        return self.scanned and not self.blind and not self.remaining


#: Above this many ``/proc`` entries a scan runs in a thread; below it, on the loop.
#: A few hundred entries take about a millisecond, less than the hop to a thread and
#: back costs on a busy host (the GIL hand-off alone can take several).
INLINE_SCAN_LIMIT = 2048
#: Bytes per read of an environment: most fit in one.
READ_SIZE = 65_536


def _live(pid: int) -> bool:
    st = procs.read_stat(pid)
    return st is not None and st.state != "Z"


def _matches_in(
    entries: list[str], job_id: str, protected: frozenset[int]
) -> tuple[list[int], bool]:
    """The live PIDs among ``entries`` carrying exactly ``job_id``, and blindness.

    The same verdicts as ``procs.scan_job_ids`` in a cheaper order:
    the environment first, since almost no process carries the ID, and the stat (is
    it a zombie?) only for a process that does, or whose environment could not be
    read (a zombie's unreadable environment is not blindness). It runs after every
    job over the whole process table, so each environment is opened relative to one
    descriptor of ``/proc`` and read in place, without a helper call per process.
    """
    needle = procs.JOB_ID_VAR
    pids: list[int] = []
    blind = False
    try:
        root = os.open(procs.PROC_ROOT, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return pids, True  # listed a moment ago, unreadable now: nothing seen
    flags = os.O_RDONLY | os.O_CLOEXEC
    try:
        for entry in entries:
            if not entry.isdigit():
                continue
            pid = int(entry)
            if pid in protected:
                continue
            try:
                fd = os.open(entry + "/environ", flags, dir_fd=root)
                try:
                    raw = chunk = os.read(fd, READ_SIZE)
                    while chunk:
                        chunk = os.read(fd, READ_SIZE)
                        raw += chunk
                finally:
                    os.close(fd)
            except (FileNotFoundError, ProcessLookupError):
                continue  # gone: no match, and not blindness
            except OSError:
                blind = blind or _live(pid)
                continue
            # Exact equality of the whole value, never a prefix: job "ab" must not sweep "abc".
            if needle in raw and procs.job_id_in_environ(raw) == job_id and _live(pid):
                pids.append(pid)
    finally:
        os.close(root)
    pids.sort()
    return pids, blind


def _matches(job_id: str, protected: frozenset[int]) -> tuple[list[int], bool, bool]:
    """PIDs carrying exactly ``job_id``; whether ``/proc`` was readable; blindness."""
    entries = procs.proc_entries()
    if entries is None:
        return [], False, False
    pids, blind = _matches_in(entries, job_id, protected)
    return pids, True, blind


async def _scan(job_id: str, protected: frozenset[int]) -> tuple[list[int], bool, bool]:
    """``_matches``, on the loop for an ordinary process table, in a thread for a huge
    one: reading thousands of environments inline would delay heartbeats and other
    jobs' output."""
    entries = procs.proc_entries()
    if entries is None:
        return [], False, False
    if len(entries) <= INLINE_SCAN_LIMIT:
        pids, blind = _matches_in(entries, job_id, protected)
    else:
        pids, blind = await asyncio.to_thread(_matches_in, entries, job_id, protected)
    return pids, True, blind


async def _phase(
    job_id: str,
    protected: frozenset[int],
    signum: int,
    length: float,
    poll: float,
    first: list[int],
    found: dict[int, None],
) -> tuple[list[int], bool]:
    """Signal each matching PID once, re-scan every ``poll``, for at most ``length``.

    Returns what still matched at the last scan and whether any scan was blind.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + length
    signalled: set[int] = set()
    current = first
    blind = False
    while True:
        for pid in current:
            found.setdefault(pid, None)
            if pid not in signalled:
                signalled.add(pid)
                procs.signal_pid(pid, signum)
        if loop.time() >= deadline:
            return current, blind
        await asyncio.sleep(poll)
        latest, readable, was_blind = await _scan(job_id, protected)
        if not readable:
            return current, True  # lost sight of /proc: what we last saw still stands
        blind = blind or was_blind
        current = latest
        if not current:
            return current, blind


async def clear(job_id: str, timings: Timings = DEFAULT) -> StragglerReport:
    """Find and end every live process carrying ``RC_JOB_ID=<job_id>``.

    SIGTERM for ``timings.straggler_term``, then SIGKILL for ``straggler_kill``,
    re-scanning every ``straggler_poll``.
    """
    if not job_id:
        return StragglerReport(scanned=False)
    protected = procs.self_and_ancestors()
    matches, readable, blind = await _scan(job_id, protected)
    if not readable:
        return StragglerReport(scanned=False)
    if not matches:
        return StragglerReport(scanned=True, blind=blind)
    found: dict[int, None] = {}
    poll = timings.straggler_poll
    left, term_blind = await _phase(
        job_id, protected, signal.SIGTERM, timings.straggler_term, poll, matches, found
    )
    blind = blind or term_blind
    if left:
        left, kill_blind = await _phase(
            job_id, protected, signal.SIGKILL, timings.straggler_kill, poll, left, found
        )
        blind = blind or kill_blind
    return StragglerReport(scanned=True, found=tuple(found), remaining=tuple(left), blind=blind)


def kill_now(job_id: str) -> None:
    """One SIGKILL to every carrier, no waiting: for a job task that is being torn down.

    An abandoned job (shutdown window expired) cannot wait for the phases, but it must
    not leave its escapees running unsupervised either.
    """
    if not job_id:
        return
    matches, _, _ = _matches(job_id, procs.self_and_ancestors())
    for pid in matches:
        procs.signal_pid(pid, signal.SIGKILL)


def log_report(job_id: str, report: StragglerReport) -> None:
    """Log what the pass found: error when something survived SIGKILL."""
    extra = {"action": "sweep", "job_id": job_id}
    pids = ", ".join(str(p) for p in report.remaining)
    if report.remaining:
        log.error(
            "job %s: process(es) %s still carry its RC_JOB_ID after SIGKILL; "
            "the device may still be occupied",
            job_id,
            pids,
            extra=extra,
        )
    elif report.found:
        log.warning(
            "job %s: swept %d escaped process(es) carrying its RC_JOB_ID: %s",
            job_id,
            len(report.found),
            ", ".join(str(p) for p in report.found),
            extra=extra,
        )
    if not report.scanned:
        log.warning("job %s: sweep could not read /proc", job_id, extra=extra)
    elif report.blind:
        log.warning(
            "job %s: sweep could not read some processes' environments; "
            "an escapee may have been missed",
            job_id,
            extra=extra,
        )
