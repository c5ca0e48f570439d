"""Worker routes (controller-api.md §6): register, facts, long poll, heartbeat, output, status."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response

from resource_controller import wire
from resource_controller.controller import deps, service
from resource_controller.controller.deps import Services
from resource_controller.controller.wake import perform
from resource_controller.core import durations
from resource_controller.core.identity import Caller
from resource_controller.core.states import Role
from resource_controller.store.records import JobRecord

router = APIRouter()
Svc = Annotated[Services, Depends(deps.services)]
Worker = Depends(deps.require(Role.WORKER))
WorkerCaller = Annotated[Caller, Depends(deps.require(Role.WORKER))]

HEARTBEAT_CAP = 65536
CHUNK_CAP = 1024 * 1024
DEFAULT_WAIT = 30.0
MAX_WAIT = 60.0


@router.post("/v1/workers/register", response_model=wire.RegisterResponse)
async def register(request: Request, svc: Svc, caller: WorkerCaller) -> wire.RegisterResponse:
    req = await deps.body(request, wire.RegisterRequest)
    reg = await perform(svc.hub, service.register(svc, caller, req))
    return wire.RegisterResponse(worker_id=reg.worker_id)


@router.post("/v1/workers/{worker_id}/labels", dependencies=[Worker])
async def push_labels(worker_id: str, request: Request, svc: Svc) -> Response:
    req = await deps.body(request, wire.LabelsPush)
    await perform(svc.hub, service.push_labels(svc, worker_id, req))
    return Response(status_code=200)


def parse_wait(raw: str | None) -> float:
    """The long-poll wait: honoured only in (0, 1 min], else 30 s."""
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
        max_runtime_seconds=job.max_runtime_seconds or None,
        idle_timeout_seconds=job.idle_timeout or None,
        submitter=job.submitter or None,
        kind=job.kind or None,
        stdio=job.stdio or None,
        lease_epoch=job.lease_epoch or None,
        device_ids=list(job.devices),
    )


@router.get(
    "/v1/workers/{worker_id}/assignments",
    dependencies=[Worker],
    response_model=wire.AssignmentsResponse,
    response_model_exclude_none=True,
    responses={204: {"description": "nothing to do before the wait ran out"}},
)
async def assignments(worker_id: str, request: Request, svc: Svc) -> Response:
    """Long poll: hand out assignments and due kills, or wait to be woken."""
    wait = parse_wait(request.query_params.get("wait"))
    disconnected = asyncio.ensure_future(_disconnect(request))
    try:
        handed, kills = await perform(svc.hub, service.poll(svc, worker_id, wait, disconnected))
    finally:
        disconnected.cancel()
    if not (handed or kills):
        return Response(status_code=204)
    out = wire.AssignmentsResponse(
        assignments=[_assignment(j) for j in handed], kills=kills or None
    )
    return Response(out.model_dump_json(exclude_none=True), media_type="application/json")


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
    await perform(svc.hub, service.heartbeat(svc, worker_id, req))
    return Response(status_code=200)


@router.post("/v1/jobs/{job_id}/logs", dependencies=[Worker])
async def append_log(job_id: str, request: Request, svc: Svc) -> Response:
    chunk = await deps.read_capped(request, CHUNK_CAP, "log chunk", code="chunk_too_large")
    epoch = request.query_params.get("lease_epoch")
    await perform(svc.hub, service.append_log(svc, job_id, epoch, chunk))
    return Response(status_code=200)


@router.post("/v1/jobs/{job_id}/status", dependencies=[Worker])
async def status(job_id: str, request: Request, svc: Svc) -> Response:
    """A worker reports ``running`` or the outcome."""
    req = await deps.body(request, wire.StatusReport)
    await perform(svc.hub, service.report_status(svc, job_id, req))
    return Response(status_code=200)


@router.post("/v1/devices/{device_id}/fault", dependencies=[Worker])
async def fault(device_id: str, request: Request, svc: Svc) -> Response:
    """The host takes a device out itself; only an admin clears a fault."""
    req = await deps.body(request, wire.FaultReport)
    await perform(svc.hub, service.fault(svc, device_id, req))
    return Response(status_code=200)
