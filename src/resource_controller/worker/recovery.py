"""The recovery proof sent at registration.

When a worker dies mid-job, the controller quarantines that job's device: nothing
proves the job's processes died with the worker. A registering worker can offer that
proof from what it observes, and the controller then returns the device to the pool on
its own. Every field is a positive claim; silence is never
proof, so anything the worker cannot see makes it claim nothing.

The decision, in order:

1. ``require_manual_clear`` → no claim (logged, so an operator sees why devices never
   come back on their own). This beats even a provable isolation.
2. Isolation: this process is PID 1, ``/proc`` is readable and shows no other live
   process → ``{"isolated": true}`` (a container whose only process is the worker:
   whatever the old job ran died with the old namespace).
3. Survivor check: any live process other than this one carrying a non-empty
   ``RC_JOB_ID`` → ``survivors_checked`` and ``survivors_found``; none, but some
   environment unreadable → no claim ("unable to look" is not "found nothing"); none
   and nothing hidden → ``survivors_checked``; ``/proc`` unreadable → no claim.

Only our own PID is excluded, not our ancestors: a worker started from inside
a job errs toward keeping devices quarantined. The mode is derived, never configured:
a flag that must match reality eventually will not.

The proof must be computed while the worker supervises nothing: a scan taken
while our own job runs would find that job. The agent only registers at start-up and
when idle.
"""

from __future__ import annotations

import logging
import os

from resource_controller.worker import procs

log = logging.getLogger(__name__)

#: The claims of a recovery proof as the wire carries them: only the true fields, ``{}``
#: for "no claim". The controller reads them into ``core.expiry.Proof``.
Claims = dict[str, bool]


def compute(require_manual_clear: bool, *, own_pid: int | None = None) -> Claims:
    """Decide the proof from what ``/proc`` shows right now.

    ``own_pid`` defaults to this process; tests name another one to stand in for it
    inside a ``/proc`` tree of their own.
    """
    pid = os.getpid() if own_pid is None else own_pid
    extra = {"action": "recovery_proof"}
    if require_manual_clear:
        log.info(
            "recovery proof: none (require_manual_clear is set; a quarantined device "
            "waits for an operator)",
            extra=extra,
        )
        return {}
    scan = procs.scan_job_ids(exclude=(pid,))
    if pid == 1 and scan.readable and not scan.live:
        log.info("recovery proof: isolated (PID 1, alone in its PID namespace)", extra=extra)
        return {"isolated": True}
    if not scan.readable:
        log.warning("recovery proof: none (%s cannot be read)", procs.PROC_ROOT, extra=extra)
        return {}
    if scan.carriers:
        pid_found, job_id = min(scan.carriers.items())
        log.info(
            "recovery proof: survivors found (%d process(es) carry RC_JOB_ID, e.g. pid %d with %s)",
            len(scan.carriers),
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
