"""The clients', operators' and loops' operations, each returning a ``wake.Done``."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from resource_controller import errors, wire
from resource_controller.controller import submits
from resource_controller.controller.deps import Services
from resource_controller.controller.wake import Done, Wake
from resource_controller.core import expiry, identity, share, states, waiting
from resource_controller.core import usage as acct
from resource_controller.core.identity import Caller
from resource_controller.core.states import JobState
from resource_controller.store.arrays import ArrayRecord, TaskRecord
from resource_controller.store.jobs import KillOutcome, NewJob
from resource_controller.store.leadership import Fence
from resource_controller.store.records import (
    Assigned,
    JobRecord,
    PassResult,
    SweepResult,
)

log = logging.getLogger(__name__)

#: An array and its tasks, in index order.
ArrayView = tuple[ArrayRecord, list[TaskRecord]]


# ---- client: jobs --------------------------------------------------------------------


def _admit(svc: Services, caller: Caller, req: wire.SubmitRequest) -> NewJob:
    """The submit checked, recorded under a named token's name, its limit's name set."""
    req.submitter = identity.recorded_submitter(caller, req.submitter)
    new = submits.validate_submit(req)
    new = dataclasses.replace(new, share_name=identity.share_name(caller, req.submitter))
    submits.check_limit(svc.store.limits, new)
    return new


async def submit_array(svc: Services, caller: Caller, req: wire.SubmitRequest) -> Done[ArrayView]:
    """EXT-ARRAY-1: every task enqueued in one transaction, then one pass; the array's view."""
    new = _admit(svc, caller, req)
    spec = submits.array_spec(req)

    def enqueue_and_schedule() -> tuple[ArrayView, PassResult]:
        record = svc.store.arrays.submit(new, spec)
        try:
            done = svc.store.queue.run_pass()
        except Exception:
            log.exception("scheduling pass after submit of array %s failed", record.id)
            svc.store.arrays.kill(record.id, states.REASON_SUBMIT_SCHEDULE)
            raise errors.StoreError("could not schedule the array") from None
        return svc.store.arrays.view(record.id), done

    (record, tasks), done = await svc.db(enqueue_and_schedule)
    return Done((record, tasks), Wake(scheduled=True, assigned=True) | Wake.of_pass(done))


async def submit(svc: Services, caller: Caller, req: wire.SubmitRequest) -> Done[JobRecord]:
    """Enqueue, run one scheduling pass at once, answer with the job."""
    new = _admit(svc, caller, req)

    def enqueue_and_schedule() -> tuple[JobRecord, PassResult]:
        job = svc.store.queue.enqueue(new)
        # Whatever fails after the enqueue cancels the job, so it never lingers half-submitted.
        try:
            done = svc.store.queue.schedule_after(job)
        except Exception:
            log.exception("scheduling pass after submit of job %s failed", job.id)
            svc.store.queue.cancel(job.id, states.REASON_SUBMIT_SCHEDULE)
            raise errors.StoreError("could not schedule the job") from None
        if job.id not in done.ended and all(a.job_id != job.id for a in done.assigned):
            return job, done  # the pass left it as it was written
        try:
            return svc.store.views.job(job.id), done
        except Exception:
            log.exception("reading back job %s after submit failed", job.id)
            svc.store.queue.cancel(job.id, states.REASON_SUBMIT_READ)
            raise errors.StoreError("could not read the job back") from None

    job, done = await svc.db(enqueue_and_schedule)
    wake = Wake(scheduled=True) | Wake.of_pass(done, skip=job.id, nudge=False)
    if not (req.no_wait and job.queued):
        if job.terminal:  # failed by its pass: a job it named had already failed
            wake |= Wake.jobs_ended([job.id])
        return Done(job, wake | Wake.job(job.id, job.state))  # After the pass
    try:
        why = await svc.db(_why_busy, svc, job)
        if await svc.db(svc.store.queue.cancel, job.id, states.REASON_NO_WAIT):
            target = ",".join(new.device_ids) or new.device_id or new.selector or "any device"
            refused = errors.NoDeviceAvailable(f"{target} is busy; the job was not queued{why}")
            return Done(job, wake | Wake.killed(job.id), error=refused)
        raced = await svc.db(svc.store.views.job, job.id)
        return Done(raced, wake | Wake.job(raced.id, raced.state))
    except errors.RcError as exc:  # the pass's assignments are committed: still wake them
        return Done(job, wake, error=exc)


def _why_busy(svc: Services, job: JobRecord) -> str:
    """``: <who holds what>`` for a no-wait refusal (EXT-WHY-2 extends CLI-104), read
    before the cancel; best effort, so the refusal never depends on it."""
    try:
        waits = svc.store.queue.waiting_for(job)
    except Exception:
        log.exception("reading what job %s waits for failed", job.id)
        return ""
    return f": {waiting.summary(waits, svc.store.now(), pinned=job.snap().pinned)}"


def _kill_reason(caller: Caller, req: wire.KillRequest, what: str, owner: str) -> str:
    """The reason a kill records, once the caller may end ``what``."""
    if not identity.may_end(caller, owner, req.submitter):
        who = f"the token of {caller.owner!r}" if caller.owner else repr(req.submitter)
        raise errors.NotJobOwner(f"{what} belongs to {owner!r}, not {who}")
    # A named token's reason names who it is, as its submits do.
    submitter = identity.recorded_submitter(caller, req.submitter)
    return states.kill_reason(submitter, admin=caller.admin)


async def kill_array(
    svc: Services, caller: Caller, array_id: str, req: wire.KillRequest
) -> Done[None]:
    """EXT-ARRAY-3: every task of the array not yet ended, ended as a kill ends a job."""
    record = await svc.db(svc.store.arrays.record, array_id)
    reason = _kill_reason(caller, req, f"array {array_id}", record.submitter)
    ended = await svc.db(svc.store.arrays.kill, array_id, reason)
    wake = Wake.jobs_ended(ended.cancelled, schedule=True) | Wake(assigned=True)
    return Done(None, wake | Wake.poll(w for _, w in ended.flagged))


async def kill(svc: Services, caller: Caller, job_id: str, req: wire.KillRequest) -> Done[None]:
    """Cancel a queued job or flag an active one for its worker; an array's ID ends its tasks."""
    try:
        job = await svc.db(svc.store.views.job, job_id)
    except errors.JobNotFound:
        try:
            return await kill_array(svc, caller, job_id, req)
        except errors.ArrayNotFound:
            raise errors.JobNotFound(f"no job or array has the ID {job_id[:80]!r}") from None
    reason = _kill_reason(caller, req, f"job {job_id}", job.submitter)
    if job.state == JobState.QUEUED:
        if not await svc.db(svc.store.queue.cancel, job_id, reason):
            raise errors.NotCancellable(f"job {job_id} already started")
        return Done(None, Wake.killed(job_id, schedule=True))
    if job.state not in states.ACTIVE:
        raise errors.NotCancellable(f"job {job_id} already finished")
    outcome = await svc.db(
        svc.store.queue.request_kill, job_id, reason, svc.settings.retain_disconnected_jobs
    )
    if outcome is KillOutcome.NOT_CANCELLABLE:
        raise errors.NotCancellable(f"job {job_id} already finished")
    wake = Wake.poll([job.worker_id])
    if outcome is KillOutcome.FINALIZED:  # the worker is gone: ended here, the device stays out
        return Done(None, wake | Wake.killed(job_id, schedule=True))
    return Done(None, wake | Wake.job(job_id, job.state))  # handed to the worker


# ---- client: accounting --------------------------------------------------------------


async def usage(svc: Services, by: str, since: str, limit: int) -> Done[acct.Window]:
    """Who held what over the window: from the usage rollup, two rows per
    group; a bad ``by``, ``since`` or ``limit`` is ``400 bad_request`` naming it."""
    try:
        acct.check_by(by)
        seconds = acct.parse_since(since)
    except acct.UsageError as exc:
        raise errors.BadRequest(str(exc)) from None
    if not 1 <= limit <= acct.MAX_GROUPS:
        raise errors.BadRequest(f"limit: must be in 1..{acct.MAX_GROUPS}, got {limit}")
    return Done(await svc.db(svc.store.views.usage, by, seconds, limit))


# ---- admin: the fleet ----------------------------------------------------------------


async def clear(svc: Services, device_id: str) -> Done[None]:
    """Return a quarantined, lease-free device to the pool."""
    if not await svc.db(svc.store.devices.clear, device_id):
        raise errors.DeviceNotCleared(
            f"{device_id} was not cleared: it must exist, be unhealthy and have no live lease"
        )
    log.info("device %s cleared by an operator", device_id)
    return Done(None, Wake(schedule=True, devices=True))


async def retire(svc: Services, device_id: str) -> Done[None]:
    """Delete a lease-free device; an unknown one is ``404 device_not_found``."""
    await svc.db(svc.store.devices.retire, device_id)
    log.info("device %s retired", device_id)
    return Done(None, Wake(devices=True))


async def drain(
    svc: Services, caller: Caller, device_id: str, req: wire.DrainRequest
) -> Done[None]:
    """Flag a device draining; a pass follows, as jobs waiting for it now wait for others."""
    by = identity.recorded_submitter(caller, req.submitter)
    await svc.db(svc.store.devices.drain, device_id, by, req.reason)
    log.info("device %s draining, by %s%s", device_id, by, f": {req.reason}" if req.reason else "")
    return Done(None, Wake(schedule=True, devices=True))


async def undrain(svc: Services, device_id: str) -> Done[None]:
    """Clear the drain flag: the device takes work again, so a pass follows."""
    await svc.db(svc.store.devices.undrain, device_id)
    log.info("device %s undrained", device_id)
    return Done(None, Wake(schedule=True, devices=True))


# ---- the background loops ------------------------------------------------------------


async def schedule_pass(svc: Services) -> Done[list[Assigned]]:
    """One scheduling pass, with its wake-ups (``Wake.of_pass``)."""
    done = await svc.db(svc.store.queue.run_pass)
    return Done(done.assigned, Wake.of_pass(done))


async def reload_limits(svc: Services) -> Done[share.SubmitterLimits | None]:
    """Read the limits file again (SIGHUP): a good one replaces the limits in force and a
    pass follows (a raised limit may place jobs); a bad one is logged, naming the line."""
    from resource_controller.controller import sharelimits

    path = svc.settings.limits_file
    if not path:
        return Done(None)
    try:
        limits = await asyncio.to_thread(
            sharelimits.load, path, svc.settings.max_devices_per_submitter
        )
    except sharelimits.LimitsError as exc:
        log.error("limits not read again, the ones in force stay: %s", exc)
        return Done(None)
    svc.store.limits = limits
    log.info("limits read again from %s: %s", path, sharelimits.describe(limits))
    return Done(limits, Wake(schedule=True))


async def sweep(svc: Services, rules: expiry.SweepRules, fence: Fence | None) -> Done[SweepResult]:
    """One reaper sweep under ``fence``; a device it took out may change waits: a pass follows."""
    result = await svc.db(svc.store.devices.sweep, rules, fence)
    marked = await mark_requeued(svc, result.jobs_requeued)
    ended = frozenset([*result.jobs_lost, *result.leases_expired])
    took_out = bool(result.devices_unknown or result.alarming)
    return Done(result, marked | Wake(schedule=took_out, ended=ended, swept=result.alarming))


async def mark_requeued(svc: Services, job_ids: list[str]) -> Wake:
    """A line in each requeued job's output between its attempts (EXT-RETRY-1), written after the
    commit: a marker lost to a crash costs only the line. Its wake-ups: the followers read the
    line, the event stream says ``queued``."""
    for job_id in job_ids:
        try:
            past = await svc.db(svc.store.views.attempts, job_id)
            if not past:
                continue
            a = past[-1]
            code = "" if a.exit_code is None else f", exit {a.exit_code}"
            why = f" ({a.kill_reason})" if a.kill_reason else ""
            line = (
                f"--- rc: attempt {a.attempt} {a.state}{code}{why}; attempt {a.attempt + 1} queued"
            )
            log.info("job %s: %s", job_id, line[len("--- rc: ") :])
            await svc.log_store(svc.logs.append, job_id, f"{line} ---\n".encode())
        except Exception:
            log.exception("marking the next attempt of job %s failed", job_id)
    queued = tuple((j, str(JobState.QUEUED)) for j in job_ids)
    return Wake(output=frozenset(job_ids), jobs=queued)


#: Jobs one retention pass deletes at most, so a backlog never holds the store thread.
RETENTION_BATCH = 200


async def prune_logs(svc: Services, fence: Fence | None) -> Done[list[str]]:
    """Delete the stored output of jobs ended over ``--log-retention`` ago: files first, then the
    mark, so a pass cut short only leaves a job to look at again."""
    retention = svc.settings.log_retention
    if retention <= 0:
        return Done([])
    ids = await svc.db(svc.store.views.logs_to_prune, retention, RETENTION_BATCH, fence)
    if not ids:
        return Done([])

    def delete() -> None:
        for job_id in ids:
            svc.logs.delete(job_id)

    await asyncio.to_thread(delete)
    await svc.db(svc.store.views.mark_logs_pruned, ids, fence)
    log.info("deleted the stored output of %d job(s) ended over %ds ago", len(ids), retention)
    return Done(ids)
