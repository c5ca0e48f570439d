"""Ending a finished job's escapees by their ``RC_JOB_ID`` (WRK-120..123): ``setsid``
leaves the group, not the environment. It only reports, never changes the outcome.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

from resource_controller.worker import procs
from resource_controller.worker.timings import DEFAULT, Timings

log = logging.getLogger(__name__)

#: Above this many ``/proc`` entries a scan runs in a thread, worth the hop only then.
INLINE_SCAN_LIMIT = 2048


@dataclass(frozen=True)
class StragglerReport:
    """What one sweep saw (WRK-122): every carrier found, those left after SIGKILL."""

    scanned: bool
    found: tuple[int, ...] = ()
    remaining: tuple[int, ...] = ()
    #: Some environment could not be read: an escapee may have been missed.
    blind: bool = False

    @property
    def clean(self) -> bool:
        """The only report that proves anything."""
        return self.scanned and not self.blind and not self.remaining


async def _scan(job_id: str, protected: frozenset[int]) -> procs.Carriers | None:
    entries = procs.proc_entries()
    if entries is None or len(entries) <= INLINE_SCAN_LIMIT:
        return procs.scan_carriers(protected, job_id, entries)
    return await asyncio.to_thread(procs.scan_carriers, protected, job_id, entries)


async def _phase(
    job_id: str,
    protected: frozenset[int],
    signum: int,
    length: float,
    poll: float,
    current: list[int],
    signalled: dict[int, None],
) -> tuple[list[int], bool]:
    """Signal each match once, re-scan every ``poll`` for at most ``length``: what still
    matched at the last scan, and whether a scan was blind."""
    deadline = asyncio.get_running_loop().time() + length
    blind = False
    while True:
        for pid in current:
            if pid not in signalled:
                signalled[pid] = None
                procs.signal_pid(pid, signum)
        if asyncio.get_running_loop().time() >= deadline:
            return current, blind
        await asyncio.sleep(poll)
        scan = await _scan(job_id, protected)
        if scan is None:
            return current, True  # lost sight of /proc: what we last saw still stands
        blind = blind or scan.blind
        current = list(scan.pids)
        if not current:
            return current, blind


async def clear(job_id: str, timings: Timings = DEFAULT) -> StragglerReport:
    """End every live process carrying ``RC_JOB_ID=<job_id>``: SIGTERM for
    ``straggler_term``, then SIGKILL for ``straggler_kill`` (WRK-121)."""
    if not job_id:
        return StragglerReport(scanned=False)
    protected = procs.self_and_ancestors()
    scan = await _scan(job_id, protected)
    if scan is None:
        return StragglerReport(scanned=False)
    if not scan.pids:
        return StragglerReport(scanned=True, blind=scan.blind)
    termed: dict[int, None] = {}
    poll = timings.straggler_poll
    left, blind = await _phase(
        job_id, protected, signal.SIGTERM, timings.straggler_term, poll, list(scan.pids), termed
    )
    killed: dict[int, None] = {}
    if left:
        left, kill_blind = await _phase(
            job_id, protected, signal.SIGKILL, timings.straggler_kill, poll, left, killed
        )
        blind = blind or kill_blind
    found = tuple({**termed, **killed})
    return StragglerReport(True, found, tuple(left), scan.blind or blind)


def kill_now(job_id: str) -> None:
    """One SIGKILL to every carrier, for a job task torn down that cannot wait."""
    scan = procs.scan_carriers(procs.self_and_ancestors(), job_id) if job_id else None
    for pid in scan.pids if scan is not None else ():
        procs.signal_pid(pid, signal.SIGKILL)


def log_report(job_id: str, report: StragglerReport) -> None:
    """An error when something survived SIGKILL, a warning when escapees were swept."""
    extra = {"action": "sweep", "job_id": job_id}
    if report.remaining:
        log.error(
            "job %s: process(es) %s still carry its RC_JOB_ID after SIGKILL; "
            "the device may still be occupied",
            job_id,
            ", ".join(map(str, report.remaining)),
            extra=extra,
        )
    elif report.found:
        log.warning(
            "job %s: swept %d escaped process(es) carrying its RC_JOB_ID: %s",
            job_id,
            len(report.found),
            ", ".join(map(str, report.found)),
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
