"""The controller's operations: one function each, between a parsed request and the store.

Every operation runs its store work on the store thread (``Services.db``), decides what
the spec says about the outcome, and returns a ``wake.Done``: its value (or the error
to answer with after a commit) and the wake-ups the change implies. Nothing here wakes
anyone; ``wake.perform`` applies the wake-ups once the operation has committed. Routes
parse the request, call ``perform(svc.hub, service.<op>(...))`` and render the answer;
the background loops (``controller/loops.py``) do the same for a scheduling pass and a
sweep.

Which changes imply a scheduling pass is EXT-FAST-1's list: a submit (its pass runs
inline), a terminal status report, a cancel, a kill finalised here, a device cleared,
a registration and a heartbeat (which may bring a device back from ``unknown``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from resource_controller import errors, wire
from resource_controller.controller import submits, webhooks
from resource_controller.controller.deps import Services
from resource_controller.controller.parked import Parked
from resource_controller.controller.wake import SCHEDULE, Done, Wake
from resource_controller.core import (
    expiry,
    identity,
    mig,
    share,
    states,
    waiting,
)
from resource_controller.core import usage as acct
from resource_controller.core.identity import Caller
from resource_controller.core.states import TERMINAL, DeviceState, JobState, Kind, Role
from resource_controller.store.jobs import KillRequest
from resource_controller.store.leadership import Fence
from resource_controller.store.records import (
    Assigned,
    AutoRecovery,
    GpuUse,
    JobRecord,
    PassResult,
    Registration,
    SweepResult,
)

log = logging.getLogger(__name__)

SHEET_CAP = 65536


# ---- client: jobs --------------------------------------------------------------------


async def submit(svc: Services, caller: Caller, req: wire.SubmitRequest) -> Done[JobRecord]:
    """Enqueue, run one scheduling pass at once, answer with the job."""
    # A named token's submit is recorded under its name.
    req.submitter = identity.recorded_submitter(caller, req.submitter)
    new = submits.validate_submit(req)
    # The name its submitter limit counts under.
    new = dataclasses.replace(new, share_name=identity.share_name(caller, req.submitter))
    submits.check_limit(svc.store.limits, new)

    def enqueue_and_schedule() -> tuple[JobRecord, PassResult]:
        job = svc.store.queue.enqueue(new)
        # Whatever fails after the enqueue (a database error or anything
        # unexpected) cancels the just-queued job, so it never lingers half-submitted.
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
    wake = Wake(scheduled=True) | Wake.poll(a.worker_id for a in done.assigned)
    wake |= _ended_by_pass(done, skip=job.id)
    if not (req.no_wait and job.queued):
        if job.terminal:  # failed by its pass: a job it named had already failed
            wake |= Wake.jobs_ended([job.id])
        return Done(job, wake | Wake.job(job.id, job.state))  # After the pass
    try:
        why = await svc.db(_why_busy, svc, job)
        if await svc.db(svc.store.queue.cancel, job.id, states.REASON_NO_WAIT):
            target = ",".join(new.device_ids) or new.device_id or new.selector or "any device"
            refused = errors.NoDeviceAvailable(f"{target} is busy; the job was not queued{why}")
            ended = Wake.jobs_ended([job.id]) | Wake.job(job.id, JobState.KILLED)
            return Done(job, wake | ended, error=refused)
        raced = await svc.db(svc.store.views.job, job.id)
        return Done(raced, wake | Wake.job(raced.id, raced.state))
    except errors.RcError as exc:  # the pass's assignments are committed: still wake them
        return Done(job, wake, error=exc)


def _ended_by_pass(done: PassResult, skip: str = "") -> Wake:
    """The wake-ups of the waiting jobs a pass ended ``dependency_failed``:
    their followers finish and the event stream says so; ``skip`` is announced by its
    caller."""
    ids = [j for j in done.ended if j != skip]
    wake = Wake.jobs_ended(ids) if ids else Wake()
    for job_id in ids:
        wake |= Wake.job(job_id, JobState.KILLED)
    return wake


def _why_busy(svc: Services, job: JobRecord) -> str:
    """``: <who holds what>`` for a no-wait refusal (EXT-WHY-2 extends CLI-104), read
    before the cancel; best effort, so the refusal never depends on it."""
    try:
        waits = svc.store.queue.waiting_for(job)
    except Exception:
        log.exception("reading what job %s waits for failed", job.id)
        return ""
    return f": {waiting.summary(waits, svc.store.now(), pinned=job.snap().pinned)}"


async def kill(svc: Services, caller: Caller, job_id: str, req: wire.KillRequest) -> Done[None]:
    """Cancel a queued job or flag an active one for its worker."""
    job = await svc.db(svc.store.views.job, job_id)
    if not identity.may_end(caller, job.submitter, req.submitter):
        who = f"the token of {caller.owner!r}" if caller.owner else repr(req.submitter)
        raise errors.NotJobOwner(f"job {job_id} belongs to {job.submitter!r}, not {who}")
    # A named token's reason names who it is, as its submits do.
    submitter = identity.recorded_submitter(caller, req.submitter)
    reason = states.kill_reason(submitter, admin=caller.admin)
    if job.state == JobState.QUEUED:
        if not await svc.db(svc.store.queue.cancel, job_id, reason):
            raise errors.NotCancellable(f"job {job_id} already started")
        return Done(
            None, Wake.jobs_ended([job_id], schedule=True) | Wake.job(job_id, JobState.KILLED)
        )
    if job.state not in states.ACTIVE:
        raise errors.NotCancellable(f"job {job_id} already finished")
    outcome = await svc.db(
        svc.store.queue.request_kill, job_id, reason, svc.settings.retain_disconnected_jobs
    )
    if outcome is KillRequest.NOT_CANCELLABLE:
        raise errors.NotCancellable(f"job {job_id} already finished")
    wake = Wake.poll([job.worker_id])
    if outcome is KillRequest.FINALIZED:  # the worker is gone: ended here, the device stays out
        return Done(
            None,
            wake | Wake.jobs_ended([job_id], schedule=True) | Wake.job(job_id, JobState.KILLED),
        )
    return Done(None, wake | Wake.job(job_id, job.state))  # handed to the worker


# ---- worker: registration and facts --------------------------------------------------


def check_sheets(sheet: str | None, device_sheets: dict[str, str] | None) -> None:
    """Refuse the whole request when any sheet is over 64 KiB."""
    if sheet is not None and len(sheet.encode()) > SHEET_CAP:
        raise errors.TooLarge("host sheet exceeds 65536 bytes", code="sheet_too_large")
    for name, text in (device_sheets or {}).items():
        if len(text.encode()) > SHEET_CAP:
            raise errors.TooLarge(
                f"sheet of device {name} exceeds 65536 bytes", code="sheet_too_large"
            )


def proof_of(recovery: wire.RecoveryProof | None) -> expiry.Proof | None:
    """The registration's recovery proof; absent means none."""
    if recovery is None:
        return None
    return expiry.Proof(
        isolated=recovery.isolated,
        survivors_checked=recovery.survivors_checked,
        survivors_found=recovery.survivors_found,
    )


async def register(svc: Services, caller: Caller, req: wire.RegisterRequest) -> Done[Registration]:
    """Upsert the worker and its devices, recover what its proof allows, store its facts."""
    if not req.host:
        raise errors.BadRequest("host must not be empty")
    # A named worker token speaks only for its own host. An admin token
    # (which satisfies worker routes) keeps its override, named or not.
    if caller.role == Role.WORKER and caller.name is not None and req.host != caller.name:
        raise errors.NotThisHost(
            f"a worker token named {caller.name!r} cannot register host {req.host!r}"
        )
    check_sheets(req.sheet, req.device_sheets)
    declared = [(d.name, max(0, d.max_runtime_seconds or 0)) for d in req.devices]
    names = [d.name for d in req.devices]
    proof = proof_of(req.recovery)

    def apply() -> tuple[Registration, AutoRecovery]:
        # Upsert (with ceilings) -> auto-recovery -> labels and sheets, each
        # its own transaction. Recovery comes after the upsert because it most often
        # lifts the ``registration`` quarantine the upsert itself has just written.
        reg = svc.store.devices.register(req.host, req.boot_id, declared)
        try:
            recovery = svc.store.devices.auto_recover(reg.worker_id, proof)
        except Exception:
            # Logged, never fails the registration; the devices simply
            # stay quarantined, which nothing schedules onto.
            log.exception("automatic recovery for worker %s failed", req.host)
            recovery = AutoRecovery()
        svc.store.devices.apply_facts(
            req.host, names, req.labels, req.declared_labels, req.sheet, req.device_sheets
        )
        return reg, recovery

    reg, recovery = await svc.db(apply)
    # A registration is one of the events a quiet controller still logs.
    log.info("worker %s registered: %d devices", req.host, len(names))
    for job_id in reg.reaped:
        log.warning("job %s lost: worker %s re-registered", job_id, req.host)
    _say_mig_conflicts(req, reg)
    recovered: list[webhooks.Notice] = []
    for r in recovery.recovered:
        why = f"was quarantined for {r.reason}; {proof.summary if proof else ''}"
        log.info("device %s returned to the pool: %s", r.device_id, why)
        recovered.append(
            webhooks.Notice(webhooks.DEVICE_RECOVERED, svc.clock.now(), r.device_id, "", why)
        )
    for device_id in recovery.held_back:
        log.warning(
            "device %s stays quarantined: it recovered automatically %d times within %d s; "
            "an operator must clear it",
            device_id,
            expiry.FLAP_LIMIT,
            expiry.FLAP_WINDOW,
        )
    wake = Wake(schedule=True, ended=frozenset(reg.reaped), devices=True, notices=tuple(recovered))
    return Done(reg, wake)


def _say_mig_conflicts(req: wire.RegisterRequest, reg: Registration) -> None:
    """EXT-MIG-3: a name in conflict with its GPU's MIG mode is said at registration."""
    for name in sorted((req.labels or {}).keys()):
        why = ((req.labels or {}).get(name) or {}).get(mig.CONFLICT)
        if name and why:
            log.warning("device %s:%s is not offered: MIG conflict: %s", req.host, name, why)
    for device_id, by in sorted(reg.superseded.items()):
        log.warning(
            "device %s is not offered: %s now stand for its GPU (MIG conflict)",
            device_id,
            ", ".join(by),
        )


async def push_labels(svc: Services, worker_id: str, req: wire.LabelsPush) -> Done[None]:
    """Replace the worker's labels and sheets; only for its registered host."""
    if not req.host:
        raise errors.BadRequest("host must not be empty")
    host = await svc.db(svc.store.devices.worker_host, worker_id)
    if host != req.host:
        raise errors.BadRequest(f"worker {worker_id} is registered as {host!r}, not {req.host!r}")
    check_sheets(req.sheet, req.device_sheets)
    await svc.db(
        svc.store.devices.apply_facts,
        req.host,
        req.devices,
        req.labels,
        req.declared_labels,
        req.sheet,
        req.device_sheets,
    )
    return Done(None, Wake(devices=True))


# ---- worker: the spine ---------------------------------------------------------------


async def poll(
    svc: Services, worker_id: str, wait: float, gone: asyncio.Future[None]
) -> Done[tuple[list[JobRecord], list[str]]]:
    """Long poll: hand out assignments and due kills, or wait to be woken.

    Empty lists once ``wait`` seconds pass, the controller shuts down or the caller is
    ``gone``. The hand-out moves each job to ``running`` in the store.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        woken = svc.hub.workers.waiter(worker_id)
        if gone.done():
            return Done(([], []))
        handed, kills = await svc.db(svc.store.reports.take_work, worker_id)
        if handed or kills:
            return _handed(svc, handed, kills)
        remaining = deadline - loop.time()
        if remaining <= 0 or svc.hub.shutting_down.is_set():
            return Done(([], []))
        # Parked: a terminal report that places work here may hand it out in its own
        # commit and answer this poll directly (``controller/parked.py``).
        parked = svc.hub.parked.park(worker_id)
        wake = asyncio.ensure_future(woken.wait())
        stop = asyncio.ensure_future(svc.hub.shutting_down.wait())
        waits: set[asyncio.Future[Any]] = {wake, stop, gone, parked.answer}
        await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        wake.cancel()
        stop.cancel()
        if not svc.hub.parked.leave(parked):
            answer = await parked.answer  # claimed: the report's commit is under way
            if answer is not None and (answer[0] or answer[1]):
                return _handed(svc, *answer)


def _handed(
    svc: Services, handed: list[JobRecord], kills: list[str]
) -> Done[tuple[list[JobRecord], list[str]]]:
    now = svc.clock.now()
    for j in handed:  # Submit to start is submit to hand-out
        svc.metrics.submit_to_start.observe(max(0.0, now - j.submitted_at))
    return Done((handed, kills))


async def heartbeat(svc: Services, worker_id: str, req: wire.HeartbeatRequest) -> Done[None]:
    """Renew the named jobs' leases and restore the devices they prove."""
    # Pending jobs (finished, report still in the worker's outbox) keep their leases and
    # their devices busy until the report lands.
    moved = await svc.db(
        svc.store.reports.heartbeat,
        worker_id,
        list(req.running_job_ids or []),
        svc.settings.retain_disconnected_jobs,
        list(req.pending_job_ids or []),
    )
    # A device back from unknown may place a queued job; a heartbeat that moved no
    # device changed nothing a pass reads, and 1,000 workers send 100 a second.
    return Done(None, SCHEDULE if moved else Wake())


async def append_log(svc: Services, job_id: str, epoch: str | None, chunk: bytes) -> Done[None]:
    """Store a chunk of the job's output; a stale lease epoch is refused."""
    if epoch is not None:
        job = await svc.db(svc.store.views.job, job_id)
        # ASCII digits only, and short: int() refuses "²" and 5,000-digit text.
        current = epoch.isascii() and epoch.isdigit() and len(epoch) <= 20
        if not current or int(epoch) != job.lease_epoch:
            raise errors.StaleLease(f"lease epoch {epoch} is not job {job_id}'s current lease")
    if svc.logs.remote:
        await asyncio.to_thread(svc.logs.append, job_id, chunk)
    else:
        svc.logs.append(job_id, chunk)
    return Done(None, Wake(output=frozenset((job_id,))))


async def report_status(svc: Services, job_id: str, req: wire.StatusReport) -> Done[None]:
    """A worker reports ``running`` or the outcome; terminal frees the lease."""

    def check(job: JobRecord) -> None:
        if not req.worker_id or req.worker_id != job.worker_id:
            raise errors.NotJobOwner(f"job {job_id} is not assigned to worker {req.worker_id!r}")
        if req.lease_epoch is not None and req.lease_epoch != job.lease_epoch:
            raise errors.StaleLease(
                f"lease epoch {req.lease_epoch} is not job {job_id}'s current lease "
                f"({job.lease_epoch})"
            )
        if req.state != JobState.RUNNING and req.state not in TERMINAL:
            raise errors.BadRequest(f"state must be running or terminal, got {req.state!r}")

    gpu = GpuUse(req.gpu_util_mean, req.gpu_mem_peak_bytes, req.samples)

    claimed: list[Parked] = []

    def hand_out(worker_id: str) -> bool:
        if any(p.worker_id == worker_id for p in claimed):
            return True  # claimed by an attempt the store ran again after a lost race
        parked = svc.hub.parked.claim(worker_id)
        if parked is not None:
            claimed.append(parked)
        return parked is not None

    def record() -> tuple[JobRecord, PassResult | None]:
        # The ownership checks, the change and the pass a release calls for
        # are one transaction on the store thread: the freed device is handed on without
        # a round through the scheduler loop, and to a waiting poll of its worker in the
        # same commit. A failed pass is left to that loop. The claimed polls are answered
        # here, once the transaction ended, whatever becomes of this request.
        result: PassResult | None = None
        try:
            before, result = svc.store.reports.status(
                job_id, check, req.state, req.exit_code, req.reason, gpu, hand_out
            )
            return before, result
        finally:
            handed = result.handed if result is not None else {}
            for parked in claimed:
                parked.give(handed.get(parked.worker_id))

    before, done = await svc.db(record)
    device_id = "" if req.state == JobState.RUNNING else before.device_id
    announce = Wake.job(job_id, req.state)  # Repeats publish again
    if not device_id:
        return Done(None, announce)
    # A first terminal report of a non-hold job whose reason is a watchdog's.
    trip = (
        before.state not in TERMINAL
        and before.kind != Kind.HOLD
        and webhooks.is_watchdog_trip(req.reason or "")
    )
    if trip:
        announce |= Wake(
            notices=(
                webhooks.Notice(
                    webhooks.WATCHDOG_TRIP, svc.clock.now(), device_id, job_id, req.reason or ""
                ),
            )
        )
    # A job ending is an event; its start is the worker's to log.
    log.info(
        "job %s %s on %s%s",
        job_id,
        req.state,
        device_id,
        f" (exit {req.exit_code})" if req.exit_code is not None else "",
    )
    if done is None:
        passed = Wake(schedule=True)
    else:  # A pass that assigned is announced, as the scheduler loop does
        passed = Wake(scheduled=True, assigned=bool(done.assigned)) | Wake.poll(
            a.worker_id for a in done.assigned
        )
        passed |= _ended_by_pass(done)
    return Done(None, Wake.jobs_ended([job_id]) | passed | announce)


async def fault(svc: Services, device_id: str, req: wire.FaultReport) -> Done[None]:
    """The host takes a device out itself; only an admin clears a fault."""
    if not req.reason:
        raise errors.BadRequest("reason must not be empty")

    def quarantine() -> str:
        svc.store.devices.set_state(device_id, DeviceState.UNHEALTHY, req.reason)
        try:  # a separate read after the commit: it only names the job
            return svc.store.views.active_job_on(device_id)
        except Exception:
            log.exception("reading the job on faulted device %s failed", device_id)
            return ""

    job_id = await svc.db(quarantine)
    log.warning("device %s quarantined by its host: %s", device_id, req.reason)
    notice = webhooks.fault_notice(svc.clock.now(), device_id, job_id, req.reason)
    return Done(None, Wake(devices=True, notices=(notice,)))


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
    """Flag a device draining; a pass follows, as the device's
    reservations are gone and the jobs waiting for it now wait for others."""
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
    """One scheduling pass: wake the long poll of every worker it assigned to,
    and the followers of the waiting jobs it ended."""
    done = await svc.db(svc.store.queue.run_pass)
    assigned = done.assigned
    wake = Wake.poll(a.worker_id for a in assigned) | Wake(assigned=bool(assigned))
    return Done(assigned, wake | _ended_by_pass(done))


async def reload_limits(svc: Services) -> Done[share.SubmitterLimits | None]:
    """Read the limits file again (SIGHUP). A good file replaces the limits
    in force and a pass follows (a raised limit may place jobs); a bad one is logged,
    naming the line, and the limits in force stay."""
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
    """One reaper sweep, made under ``fence`` (the leader's epoch, checked in its
    transaction): followers of ended jobs finish; a pass may place work.

    A sweep never frees a device, but a device gone ``unknown`` or out can change what a
    queued job waits for, so a pass follows whenever it took anything out.
    """
    result = await svc.db(svc.store.devices.sweep, rules, fence)
    took_out = bool(result.devices_unknown or result.alarming)
    return Done(
        result,
        Wake(
            schedule=took_out,
            ended=frozenset([*result.jobs_lost, *result.leases_expired]),
            swept=result.alarming,
        ),
    )


#: Jobs whose stored output one retention pass deletes at most: a long
#: backlog is worked off over several passes instead of holding the store thread.
RETENTION_BATCH = 200


async def prune_logs(svc: Services, fence: Fence | None) -> Done[list[str]]:
    """Delete the stored output of jobs that ended longer ago than ``--log-retention``
    ; the job rows stay. Files go first, then the mark, so a pass cut short
     only leaves a job to be looked at again."""
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
