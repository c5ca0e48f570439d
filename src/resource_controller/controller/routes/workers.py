"""Worker routes (controller-api.md §6): register, facts, long poll, heartbeat, output, status."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from resource_controller import errors, wire
from resource_controller.controller import deps
from resource_controller.controller.deps import Services
from resource_controller.core import durations, expiry
from resource_controller.core.identity import Caller
from resource_controller.core.states import TERMINAL, DeviceState, JobState, Role
from resource_controller.store.records import AutoRecovery, JobRecord, Registration

log = logging.getLogger(__name__)
router = APIRouter()
Svc = Annotated[Services, Depends(deps.services)]
Worker = Depends(deps.require(Role.WORKER))
WorkerCaller = Annotated[Caller, Depends(deps.require(Role.WORKER))]

SHEET_CAP = 65536
HEARTBEAT_CAP = 65536
CHUNK_CAP = 1024 * 1024
DEFAULT_WAIT = 30.0
MAX_WAIT = 60.0


def _check_sheets(sheet: str | None, device_sheets: dict[str, str] | None) -> None:
    """Refuse the whole request when any sheet is over 64 KiB (STORE-152)."""
    if sheet is not None and len(sheet.encode()) > SHEET_CAP:
        raise errors.TooLarge("host sheet exceeds 65536 bytes", code="sheet_too_large")
    for name, text in (device_sheets or {}).items():
        if len(text.encode()) > SHEET_CAP:
            raise errors.TooLarge(
                f"sheet of device {name} exceeds 65536 bytes", code="sheet_too_large"
            )


@router.post("/v1/workers/register", response_model=wire.RegisterResponse)
async def register(request: Request, svc: Svc, caller: WorkerCaller) -> wire.RegisterResponse:
    req = await deps.body(request, wire.RegisterRequest)
    if not req.host:
        raise errors.BadRequest("host must not be empty")
    # EXT-WHO-3: a named worker token speaks only for its own host. An admin token
    # (which satisfies worker routes, AUTH-002) keeps its override, named or not.
    if caller.role == Role.WORKER and caller.name is not None and req.host != caller.name:
        raise errors.NotThisHost(
            f"a worker token named {caller.name!r} cannot register host {req.host!r}"
        )
    _check_sheets(req.sheet, req.device_sheets)
    declared = [(d.name, max(0, d.max_runtime_seconds or 0)) for d in req.devices]
    names = [d.name for d in req.devices]
    proof = _proof(req.recovery)

    def apply() -> tuple[Registration, AutoRecovery]:
        # STORE-113: upsert (with ceilings) -> auto-recovery -> labels and sheets, each
        # its own transaction. Recovery comes after the upsert because it most often
        # lifts the ``registration`` quarantine the upsert itself has just written.
        reg = svc.store.register(req.host, req.boot_id, declared)
        try:
            recovery = svc.store.auto_recover(reg.worker_id, proof)
        except Exception:
            # API-031 step 6: logged, never fails the registration; the devices simply
            # stay quarantined, which nothing schedules onto.
            log.exception("automatic recovery for worker %s failed", req.host)
            recovery = AutoRecovery()
        svc.store.apply_facts(
            req.host, names, req.labels, req.declared_labels, req.sheet, req.device_sheets
        )
        return reg, recovery

    reg, recovery = await svc.db(apply)
    for job_id in reg.reaped:
        log.warning("job %s lost: worker %s re-registered", job_id, req.host)
        svc.hub.job_changed(job_id)
    for r in recovery.recovered:
        log.info(
            "device %s returned to the pool: was quarantined for %s; %s",
            r.device_id,
            r.reason,
            proof.summary if proof else "",
        )
    for device_id in recovery.held_back:
        log.warning(
            "device %s stays quarantined: it recovered automatically %d times within %d s; "
            "an operator must clear it",
            device_id,
            expiry.FLAP_LIMIT,
            expiry.FLAP_WINDOW,
        )
    svc.hub.kick_scheduler()
    return wire.RegisterResponse(worker_id=reg.worker_id)


def _proof(recovery: wire.RecoveryProof | None) -> expiry.Proof | None:
    """The registration's recovery proof; absent means none (API-030, STORE-120)."""
    if recovery is None:
        return None
    return expiry.Proof(
        isolated=recovery.isolated,
        survivors_checked=recovery.survivors_checked,
        survivors_found=recovery.survivors_found,
    )


@router.post("/v1/workers/{worker_id}/labels", dependencies=[Worker])
async def push_labels(worker_id: str, request: Request, svc: Svc) -> Response:
    req = await deps.body(request, wire.LabelsPush)
    if not req.host:
        raise errors.BadRequest("host must not be empty")
    host = await svc.db(svc.store.worker_host, worker_id)
    if host != req.host:
        raise errors.BadRequest(f"worker {worker_id} is registered as {host!r}, not {req.host!r}")
    _check_sheets(req.sheet, req.device_sheets)
    await svc.db(
        svc.store.apply_facts,
        req.host,
        req.devices,
        req.labels,
        req.declared_labels,
        req.sheet,
        req.device_sheets,
    )
    return Response(status_code=200)


def parse_wait(raw: str | None) -> float:
    """The long-poll wait: honoured only in (0, 1 min], else 30 s (API-034)."""
    if raw is None:
        return DEFAULT_WAIT
    try:
        wait = durations.parse_duration(raw)
    except durations.DurationError:
        return DEFAULT_WAIT
    return wait if 0 < wait <= MAX_WAIT else DEFAULT_WAIT


def _assignment(job: JobRecord) -> wire.Assignment:
    return wire.Assignment(
        job_id=job.id,
        device_id=job.device_id,
        command=job.command,
        cwd=job.cwd or None,
        env=job.env or None,
        max_runtime_seconds=job.max_runtime or None,
        idle_timeout_seconds=job.idle_timeout or None,
        submitter=job.submitter or None,
        kind=job.kind or None,
        stdio=job.stdio or None,
        lease_epoch=job.lease_epoch or None,
    )


@router.get(
    "/v1/workers/{worker_id}/assignments",
    dependencies=[Worker],
    response_model=wire.AssignmentsResponse,
    response_model_exclude_none=True,
    responses={204: {"description": "nothing to do before the wait ran out"}},
)
async def assignments(worker_id: str, request: Request, svc: Svc) -> Response:
    """Long poll (API-034): hand out assignments and due kills, or wait to be woken."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + parse_wait(request.query_params.get("wait"))
    disconnected = asyncio.ensure_future(_disconnect(request))
    try:
        while True:
            woken = svc.hub.workers.waiter(worker_id)
            if disconnected.done():
                return Response(status_code=204)
            handed, kills = await svc.db(svc.store.take_work, worker_id)
            if handed or kills:
                out = wire.AssignmentsResponse(
                    assignments=[_assignment(j) for j in handed], kills=kills or None
                )
                return Response(
                    out.model_dump_json(exclude_none=True), media_type="application/json"
                )
            remaining = deadline - loop.time()
            if remaining <= 0 or svc.hub.shutting_down.is_set():
                return Response(status_code=204)
            wake = asyncio.ensure_future(woken.wait())
            stop = asyncio.ensure_future(svc.hub.shutting_down.wait())
            await asyncio.wait(
                {wake, stop, disconnected}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            wake.cancel()
            stop.cancel()
    finally:
        disconnected.cancel()


async def _disconnect(request: Request) -> None:
    """Return once the client has gone away."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


@router.post("/v1/workers/{worker_id}/heartbeat", dependencies=[Worker])
async def heartbeat(worker_id: str, request: Request, svc: Svc) -> Response:
    raw = await deps.read_capped(request, HEARTBEAT_CAP, "heartbeat body")
    req = deps.parse_model(raw, wire.HeartbeatRequest)
    # Pending jobs (finished, report still in the worker's outbox) keep their leases and
    # their devices busy until the report lands (EXT-OUTBOX-2).
    await svc.db(
        svc.store.heartbeat,
        worker_id,
        list(req.running_job_ids or []),
        svc.settings.retain_disconnected_jobs,
        list(req.pending_job_ids or []),
    )
    svc.hub.kick_scheduler()  # a device back from unknown may place a queued job (EXT-FAST-1)
    return Response(status_code=200)


@router.post("/v1/jobs/{job_id}/logs", dependencies=[Worker])
async def append_log(job_id: str, request: Request, svc: Svc) -> Response:
    chunk = await deps.read_capped(request, CHUNK_CAP, "log chunk", code="chunk_too_large")
    epoch = request.query_params.get("lease_epoch")
    if epoch is not None:
        job = await svc.db(svc.store.job, job_id)
        # ASCII digits only, and short: int() refuses "²" and 5,000-digit text (EXT-LIMITS-5).
        current = epoch.isascii() and epoch.isdigit() and len(epoch) <= 20
        if not current or int(epoch) != job.lease_epoch:
            raise errors.StaleLease(f"lease epoch {epoch} is not job {job_id}'s current lease")
    svc.logs.append(job_id, chunk)
    svc.hub.logs.wake(job_id)
    return Response(status_code=200)


@router.post("/v1/jobs/{job_id}/status", dependencies=[Worker])
async def status(job_id: str, request: Request, svc: Svc) -> Response:
    """A worker reports ``running`` or the outcome (API-037/038)."""
    req = await deps.body(request, wire.StatusReport)
    job = await svc.db(svc.store.job, job_id)
    if not req.worker_id or req.worker_id != job.worker_id:
        raise errors.NotJobOwner(f"job {job_id} is not assigned to worker {req.worker_id!r}")
    if req.lease_epoch is not None and req.lease_epoch != job.lease_epoch:
        raise errors.StaleLease(
            f"lease epoch {req.lease_epoch} is not job {job_id}'s current lease ({job.lease_epoch})"
        )
    if req.state == JobState.RUNNING:
        await svc.db(svc.store.mark_running, job_id)
        return Response(status_code=200)
    if req.state not in TERMINAL:
        raise errors.BadRequest(f"state must be running or terminal, got {req.state!r}")
    await svc.db(svc.store.release, job_id, req.state, req.exit_code, req.reason)
    svc.hub.job_changed(job_id)
    svc.hub.kick_scheduler()
    return Response(status_code=200)


@router.post("/v1/devices/{device_id}/fault", dependencies=[Worker])
async def fault(device_id: str, request: Request, svc: Svc) -> Response:
    """The host takes a device out itself (API-039); only an admin clears a fault."""
    req = await deps.body(request, wire.FaultReport)
    if not req.reason:
        raise errors.BadRequest("reason must not be empty")
    await svc.db(svc.store.set_device_state, device_id, DeviceState.UNHEALTHY, req.reason)
    log.warning("device %s quarantined by its host: %s", device_id, req.reason)
    return Response(status_code=200)
