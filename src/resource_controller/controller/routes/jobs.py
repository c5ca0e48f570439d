"""Client job routes (controller-api.md §7.1-7.5): submit, history, view, kill, logs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse

from resource_controller import errors, wire
from resource_controller.controller import deps, views
from resource_controller.controller.deps import Services
from resource_controller.core import identity, selectors, states
from resource_controller.core.identity import Caller
from resource_controller.core.states import ACTIVE, ALL_JOB_STATES, JobState, Kind, Role, Stdio
from resource_controller.store.jobs import NewJob
from resource_controller.store.logs import MAX_OFFSET, READ_CHUNK, Snapshot
from resource_controller.store.records import Assigned, JobRecord

log = logging.getLogger(__name__)
router = APIRouter()
Svc = Annotated[Services, Depends(deps.services)]
Client = Depends(deps.require(Role.CLIENT))
ClientCaller = Annotated[Caller, Depends(deps.require(Role.CLIENT))]

#: Safety-net re-check of a followed job's state when no wake-up arrives (LOG-003 step 4).
FOLLOW_RECHECK = 1.0
#: Bytes per read of a log snapshot: large enough to be quick, small enough to stay bounded.
SNAPSHOT_CHUNK = 256 * 1024


def validate_submit(req: wire.SubmitRequest) -> NewJob:
    """API-041, in its order; the first failure wins."""
    kind = req.kind or Kind.JOB
    if kind not in (Kind.JOB, Kind.HOLD):
        raise errors.BadRequest(f"unknown kind {req.kind!r} (job or hold)")
    command = list(req.command or [])
    if kind == Kind.JOB and not command:
        raise errors.BadRequest("command must not be empty")
    if kind == Kind.HOLD:
        for bad, what in (
            (command, "a hold takes no command"),
            (req.cwd, "a hold takes no cwd"),
            (req.env, "a hold takes no env"),
            (req.idle_timeout_seconds, "a hold takes no idle timeout"),
            (req.max_runtime_seconds <= 0, "a hold needs max_runtime_seconds > 0 (its TTL)"),
            (req.stdio, "a hold cannot use tty or pipe stdio"),
        ):
            if bad:
                raise errors.BadRequest(what)
        command = ["hold"]
    if req.stdio not in {s.value for s in Stdio}:
        raise errors.BadRequest(f'unknown stdio {req.stdio!r} ("", tty or pipe)')
    if req.device_id and req.selector:
        raise errors.BadRequest("give device_id or selector, not both")
    if not req.submitter:
        raise errors.BadRequest("submitter must not be empty")
    if not -10 <= req.priority <= 10:
        raise errors.PriorityOutOfRange(f"priority {req.priority} is outside -10..10")
    if req.selector:
        try:
            selectors.parse(req.selector)
        except selectors.SelectorError as exc:
            raise errors.BadSelector(str(exc)) from None
    return NewJob(
        command=command,
        submitter=req.submitter,
        device_id=req.device_id,
        selector=req.selector,
        cwd=req.cwd,
        env=dict(req.env) if req.env else None,
        idempotency_key=req.idempotency_key,
        priority=req.priority,
        max_runtime=req.max_runtime_seconds,
        idle_timeout=req.idle_timeout_seconds,
        kind=kind,
        reason=req.reason,
        stdio=req.stdio,
    )


def wake_assigned(svc: Services, assigned: list[Assigned]) -> None:
    for a in assigned:
        svc.hub.workers.wake(a.worker_id)


@router.post("/v1/jobs", status_code=201, response_model=wire.Job, response_model_exclude_none=True)
async def submit(request: Request, svc: Svc, caller: ClientCaller) -> Response:
    """Enqueue, run one scheduling pass at once, answer with the job (API-042)."""
    req = await deps.body(request, wire.SubmitRequest)
    # EXT-WHO-2: a named token's submit is recorded under its name.
    req.submitter = identity.recorded_submitter(caller, req.submitter)
    new = validate_submit(req)

    def enqueue_and_schedule() -> tuple[JobRecord, list[Assigned]]:
        job = svc.store.enqueue(new)
        # API-042: whatever fails after the enqueue (a database error or anything
        # unexpected) cancels the just-queued job, so it never lingers half-submitted.
        try:
            assigned = svc.store.schedule()
        except Exception:
            log.exception("scheduling pass after submit of job %s failed", job.id)
            svc.store.cancel_queued(job.id, states.REASON_SUBMIT_SCHEDULE)
            raise errors.StoreError("could not schedule the job") from None
        try:
            return svc.store.job(job.id), assigned
        except Exception:
            log.exception("reading back job %s after submit failed", job.id)
            svc.store.cancel_queued(job.id, states.REASON_SUBMIT_READ)
            raise errors.StoreError("could not read the job back") from None

    job, assigned = await svc.db(enqueue_and_schedule)
    wake_assigned(svc, assigned)
    if req.no_wait and job.queued:
        if await svc.db(svc.store.cancel_queued, job.id, states.REASON_NO_WAIT):
            svc.hub.job_changed(job.id)
            target = new.device_id or new.selector or "any device"
            raise errors.NoDeviceAvailable(f"{target} is busy; the job was not queued")
        job = await svc.db(svc.store.job, job.id)
    body = views.job(job).model_dump_json(exclude_none=True)
    return Response(body, status_code=201, media_type="application/json")


def _limit(raw: str | None) -> int:
    if raw is None:
        return 20
    text = raw[1:] if raw[:1] in "+-" else raw
    if not text.isascii() or not text.isdigit():
        raise errors.BadRequest(f"limit must be an integer in 1..200, got {raw[:40]!r}")
    if len(text.lstrip("0")) > 3:  # int() refuses 5,000-digit text (EXT-LIMITS-5)
        raise errors.BadRequest(f"limit must be in 1..200, got {raw[:40]!r}")
    value = int(raw)
    if not 1 <= value <= 200:
        raise errors.BadRequest(f"limit must be in 1..200, got {value}")
    return value


@router.get("/v1/jobs", dependencies=[Client], response_model=wire.JobList)
async def list_jobs(request: Request, svc: Svc) -> Response:
    q = request.query_params
    limit = _limit(q.get("limit"))
    state = q.get("state") or ""
    if state and state not in ALL_JOB_STATES:
        valid = ", ".join(s.value for s in JobState)
        raise errors.BadRequest(f"unknown state {state!r} (valid states: {valid})")
    found = await svc.db(
        svc.store.list_jobs,
        limit,
        q.get("device") or "",
        q.get("submitter") or "",
        state,
        q.get("id_prefix") or "",  # EXT-CLI-7
    )
    out = wire.JobList(jobs=[views.job(j) for j in found])
    return Response(out.model_dump_json(exclude_none=True), media_type="application/json")


@router.get("/v1/jobs/{job_id}", dependencies=[Client], response_model=wire.JobView)
async def get_job(job_id: str, svc: Svc) -> Response:
    job, position = await svc.db(svc.store.job_with_position, job_id)
    out = wire.JobView(job=views.job(job), queue_position=position or None)
    return Response(out.model_dump_json(exclude_none=True), media_type="application/json")


@router.post("/v1/jobs/{job_id}/kill")
async def kill(job_id: str, request: Request, svc: Svc, caller: ClientCaller) -> Response:
    """Cancel a queued job or flag an active one for its worker (API-046, EXT-WHO-2)."""
    req = await deps.body(request, wire.KillRequest, empty_ok=False)
    job = await svc.db(svc.store.job, job_id)
    if not identity.may_end(caller, job.submitter, req.submitter):
        who = f"the token of {caller.owner!r}" if caller.owner else repr(req.submitter)
        raise errors.NotJobOwner(f"job {job_id} belongs to {job.submitter!r}, not {who}")
    # A named token's reason names who it is, as its submits do (EXT-WHO-2).
    submitter = identity.recorded_submitter(caller, req.submitter)
    reason = states.kill_reason(submitter, admin=caller.admin)
    if job.state == JobState.QUEUED:
        if not await svc.db(svc.store.cancel_queued, job_id, reason):
            raise errors.NotCancellable(f"job {job_id} already started")
        svc.hub.job_changed(job_id)
        svc.hub.kick_scheduler()
        return Response(status_code=200)
    if job.state not in ACTIVE:
        raise errors.NotCancellable(f"job {job_id} already finished")
    outcome = await svc.db(
        svc.store.request_kill, job_id, reason, svc.settings.retain_disconnected_jobs
    )
    if outcome == "not_cancellable":
        raise errors.NotCancellable(f"job {job_id} already finished")
    if outcome == "finalized":
        svc.hub.job_changed(job_id)
        svc.hub.kick_scheduler()
    svc.hub.workers.wake(job.worker_id)
    return Response(status_code=200)


def _follow_param(request: Request) -> bool:
    values = request.query_params.getlist("follow")
    if not values:
        return True
    if len(values) > 1 or values[0] not in ("true", "false"):
        raise errors.BadRequest("follow must be exactly one of true or false")
    return values[0] == "true"


def _offset_param(request: Request) -> int:
    """A byte count in 0..2^63-1 (EXT-CLI-5, EXT-LIMITS-1); anything else is 400."""
    raw = request.query_params.get("offset")
    if raw is None:
        return 0
    if not raw.isascii() or not raw.isdigit() or len(raw.lstrip("0")) > 19:
        raise errors.BadRequest(f"offset must be a byte count in 0..{MAX_OFFSET}, got {raw[:40]!r}")
    value = int(raw.lstrip("0") or "0")
    if value > MAX_OFFSET:
        raise errors.BadRequest(f"offset must be a byte count in 0..{MAX_OFFSET}, got {value}")
    return value


TEXT_HEADERS = {"X-Content-Type-Options": "nosniff"}


@router.get("/v1/jobs/{job_id}/logs", dependencies=[Client])
async def logs(job_id: str, request: Request, svc: Svc) -> Response:
    """Snapshot, or replay-then-follow until the job is terminal (LOG-003, EXT-FAST-2)."""
    follow = _follow_param(request)
    offset = _offset_param(request)
    job = await svc.db(svc.store.job, job_id)
    if job.stdio in (Stdio.TTY, Stdio.PIPE):
        raise errors.LogsNotStored(f"logs are not stored for attached ({job.stdio}) jobs")
    media = "text/plain; charset=utf-8"
    if not follow:
        snap = await asyncio.to_thread(svc.logs.snapshot, job_id, offset)
        return StreamingResponse(_stream(snap), media_type=media, headers=TEXT_HEADERS)
    svc.logs.touch(job_id)
    return StreamingResponse(_follow(svc, job_id, offset), media_type=media, headers=TEXT_HEADERS)


async def _stream(snap: Snapshot, chunk: int = SNAPSHOT_CHUNK) -> AsyncIterator[bytes]:
    """A snapshot's bytes, one bounded read at a time, each off the event loop (EXT-LIMITS-4)."""
    try:
        while data := await asyncio.to_thread(snap.read, chunk):
            yield data
    finally:
        snap.close()


async def _follow(svc: Services, job_id: str, offset: int) -> AsyncIterator[bytes]:
    """Send every stored byte, then new bytes as they land; end once the job is terminal."""
    # Open with an empty chunk so the status line and headers flush at once (LOG-003).
    yield b""
    while True:
        woken = svc.hub.logs.waiter(job_id)
        job = await svc.db(svc.store.job, job_id)
        # Read after the state: every chunk appended before a terminal commit is sent.
        snap = await asyncio.to_thread(svc.logs.snapshot, job_id, offset)
        async for chunk in _stream(snap, READ_CHUNK):
            offset += len(chunk)
            yield chunk
        if job.terminal or svc.hub.shutting_down.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), FOLLOW_RECHECK)
