"""The workers' operations, each returning a ``wake.Done``."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from resource_controller import errors, wire
from resource_controller.controller import service, webhooks
from resource_controller.controller.deps import Services
from resource_controller.controller.parked import Parked
from resource_controller.controller.wake import SCHEDULE, Done, Wake
from resource_controller.core import expiry, mig
from resource_controller.core.identity import Caller
from resource_controller.core.states import TERMINAL, DeviceState, JobState, Kind, Role
from resource_controller.store import attempts
from resource_controller.store.records import (
    AutoRecovery,
    GpuUse,
    JobRecord,
    PassResult,
    Registration,
)

log = logging.getLogger(__name__)

SHEET_CAP = 65536


def check_sheets(sheet: str | None, device_sheets: dict[str, str] | None) -> None:
    """Refuse the whole request when any sheet is over 64 KiB."""
    if sheet is not None and len(sheet.encode()) > SHEET_CAP:
        raise errors.TooLarge("host sheet exceeds 65536 bytes", code="sheet_too_large")
    for name, text in (device_sheets or {}).items():
        if len(text.encode()) > SHEET_CAP:
            raise errors.TooLarge(
                f"sheet of device {name} exceeds 65536 bytes", code="sheet_too_large"
            )


async def register(svc: Services, caller: Caller, req: wire.RegisterRequest) -> Done[Registration]:
    """Upsert the worker and its devices, recover what its proof allows, store its facts."""
    if not req.host:
        raise errors.BadRequest("host must not be empty")
    # A named worker token speaks only for its own host; an admin token keeps its override.
    if caller.role == Role.WORKER and caller.name is not None and req.host != caller.name:
        raise errors.NotThisHost(
            f"a worker token named {caller.name!r} cannot register host {req.host!r}"
        )
    check_sheets(req.sheet, req.device_sheets)
    declared = [(d.name, max(0, d.max_runtime_seconds or 0)) for d in req.devices]
    names = [d.name for d in req.devices]
    proof = None if req.recovery is None else expiry.Proof(**req.recovery.model_dump())

    def apply() -> tuple[Registration, AutoRecovery]:
        # Upsert, then auto-recovery (it lifts the ``registration`` quarantine the upsert wrote),
        # then facts.
        reg = svc.store.devices.register(req.host, req.boot_id, declared)
        try:
            recovery = svc.store.devices.auto_recover(reg.worker_id, proof)
        except Exception:
            # Logged, never fails the registration: the devices stay quarantined.
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
        again = "; queued again" if job_id in reg.requeued else ""
        log.warning("job %s lost: worker %s re-registered%s", job_id, req.host, again)
    marked = await service.mark_requeued(svc, reg.requeued)
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
    lost = frozenset(reg.reaped) - frozenset(reg.requeued)
    wake = Wake(schedule=True, ended=lost, devices=True, notices=tuple(recovered))
    return Done(reg, marked | wake)


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


async def poll(
    svc: Services,
    worker_id: str,
    wait: float,
    gone: asyncio.Future[None],
    have: list[str] | None = None,
) -> Done[tuple[list[JobRecord], list[str]]]:
    """Long poll: hand out assignments and due kills (moving each job to ``running``), or
    wait to be woken; empty once ``wait`` passes, the controller stops or the caller is
    ``gone``. ``have``: the jobs the worker says it has (``reports.take_work``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        woken = svc.hub.workers.waiter(worker_id)
        if gone.done():
            return Done(([], []))
        handed, kills = await svc.db(svc.store.reports.take_work, worker_id, have)
        have = None  # a lost answer predates this poll: only its first look re-offers
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
    # Pending jobs (reported, not landed) keep their leases and devices until the report lands.
    moved = await svc.db(
        svc.store.reports.heartbeat,
        worker_id,
        list(req.running_job_ids or []),
        svc.settings.retain_disconnected_jobs,
        list(req.pending_job_ids or []),
    )
    # Only a heartbeat that moved a device asks for a pass: 1,000 workers send 100 a second.
    return Done(None, SCHEDULE if moved else Wake())


async def append_log(svc: Services, job_id: str, epoch: str | None, chunk: bytes) -> Done[None]:
    """Store a chunk of the job's output; a stale lease epoch is refused."""
    if epoch is not None:
        job = await svc.db(svc.store.views.job, job_id)
        # ASCII digits only, and short: int() refuses "²" and 5,000-digit text.
        current = epoch.isascii() and epoch.isdigit() and len(epoch) <= 20
        # A queued job's newest lease is an earlier attempt's (EXT-RETRY-2).
        if not current or int(epoch) != job.lease_epoch or job.queued:
            raise errors.StaleLease(f"lease epoch {epoch} is not job {job_id}'s current lease")
    await svc.log_store(svc.logs.append, job_id, chunk)
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
        # The checks, the change and its pass are one transaction, so the freed device goes on (to a
        # waiting poll in the same commit); a failed pass is left to the loop. Claimed polls are
        # answered here.
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
    requeued = attempts.requeues(before, req.state)
    # Repeats publish again; a requeue's ``queued`` is announced with its marker.
    announce = Wake() if requeued else Wake.job(job_id, req.state)
    if not device_id:
        return Done(None, announce)
    # A first terminal report of a non-hold job whose reason is a watchdog's.
    trip = (
        before.state not in TERMINAL
        and before.kind != Kind.HOLD
        and (req.reason or "").startswith(webhooks.WATCHDOG_PREFIXES)
    )
    if trip:
        at, reason = svc.clock.now(), req.reason or ""
        notice = webhooks.Notice(webhooks.WATCHDOG_TRIP, at, device_id, job_id, reason)
        announce |= Wake(notices=(notice,))
    # A job ending is an event; its start is the worker's to log.
    log.info(
        "job %s %s on %s%s",
        job_id,
        req.state,
        device_id,
        f" (exit {req.exit_code})" if req.exit_code is not None else "",
    )
    # A pass that assigned is announced, as the scheduler loop does.
    passed = SCHEDULE if done is None else Wake(scheduled=True) | Wake.of_pass(done)
    if requeued:
        return Done(None, await service.mark_requeued(svc, [job_id]) | passed | announce)
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
