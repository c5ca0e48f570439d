"""Worker routes (controller-api.md §6): register, facts, long poll, heartbeat, output, status."""

from __future__ import annotations

import asyncio

from starlette.responses import Response

from resource_controller import wire
from resource_controller.controller import answers, deps, workerops
from resource_controller.controller.deps import RouteCall
from resource_controller.controller.wake import perform
from resource_controller.core import durations, preempt
from resource_controller.store.records import JobRecord

HEARTBEAT_CAP = 65536
CHUNK_CAP = 1024 * 1024
DEFAULT_WAIT = 30.0
MAX_WAIT = 60.0


async def register(call: RouteCall) -> Response:
    reg = await perform(call.svc.hub, workerops.register(call.svc, call.who, call.body))
    return answers.json(wire.RegisterResponse(worker_id=reg.worker_id))


async def push_labels(call: RouteCall) -> Response:
    await perform(call.svc.hub, workerops.push_labels(call.svc, call.param, call.body))
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


async def assignments(call: RouteCall) -> Response:
    """Long poll: hand out assignments and due kills, or wait to be woken."""
    svc, request = call.svc, call.request
    wait = parse_wait(request.query_params.get("wait"))
    have = request.query_params.get("have")
    known = None if have is None else [job_id for job_id in have.split(",") if job_id]
    disconnected = asyncio.ensure_future(deps.disconnected(request.receive))
    try:
        poll = workerops.poll(svc, call.param, wait, disconnected, known)
        handed, kills = await perform(svc.hub, poll)
    finally:
        disconnected.cancel()
    if not (handed or kills):
        return Response(status_code=204)
    own: dict[str, int] = getattr(kills, "grace", {})  # EXT-PREEMPT-2: a victim's grace
    grace = {j: preempt.grace(g, svc.settings.preempt_grace) for j, g in own.items()}
    return answers.json(
        wire.AssignmentsResponse(
            assignments=[_assignment(j) for j in handed],
            kills=kills or None,
            kill_grace=grace or None,
        )
    )


async def heartbeat(call: RouteCall) -> Response:
    await perform(call.svc.hub, workerops.heartbeat(call.svc, call.param, call.body))
    return Response(status_code=200)


async def append_log(call: RouteCall) -> Response:
    request = call.request
    chunk = await deps.read_capped(request, CHUNK_CAP, "log chunk", code="chunk_too_large")
    epoch = request.query_params.get("lease_epoch")
    await perform(call.svc.hub, workerops.append_log(call.svc, call.param, epoch, chunk))
    return Response(status_code=200)


async def status(call: RouteCall) -> Response:
    """A worker reports ``running`` or the outcome."""
    await perform(call.svc.hub, workerops.report_status(call.svc, call.param, call.body))
    return Response(status_code=200)


async def fault(call: RouteCall) -> Response:
    """The host takes a device out itself; only an admin clears a fault."""
    await perform(call.svc.hub, workerops.fault(call.svc, call.param, call.body))
    return Response(status_code=200)
