"""Client job routes (controller-api.md §7.1-7.5): submit, history, view, kill, logs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.datastructures import QueryParams
from starlette.responses import Response, StreamingResponse

from resource_controller import errors, wire
from resource_controller.controller import answers, render, service
from resource_controller.controller.deps import RouteCall, Services
from resource_controller.controller.wake import perform
from resource_controller.core.states import ALL_JOB_STATES, JobState, Stdio
from resource_controller.store.logs import MAX_OFFSET, READ_CHUNK, Snapshot

log = logging.getLogger(__name__)

#: Safety-net re-check of a followed job's state when no wake-up arrives.
FOLLOW_RECHECK = 1.0
#: Bytes per read of a log snapshot: large enough to be quick, small enough to stay bounded.
SNAPSHOT_CHUNK = 256 * 1024


async def submit(call: RouteCall) -> Response:
    """Enqueue, run one scheduling pass at once, answer with the job (with ``array``, the array:
    EXT-ARRAY-1)."""
    if call.body.array:
        found = await perform(call.svc.hub, service.submit_array(call.svc, call.who, call.body))
        return answers.json(render.array(*found), 201)
    job = await perform(call.svc.hub, service.submit(call.svc, call.who, call.body))
    return answers.json(render.job(job), 201)


async def get_array(call: RouteCall) -> Response:
    """EXT-ARRAY-3: the array's counts and its tasks in index order."""
    svc = call.svc
    return answers.json(render.array(*await svc.db(svc.store.arrays.view, call.param)))


def _limit(raw: str | None) -> int:
    if raw is None:
        return 20
    text = raw[1:] if raw[:1] in "+-" else raw
    if not text.isascii() or not text.isdigit():
        raise errors.BadRequest(f"limit must be an integer in 1..200, got {raw[:40]!r}")
    if len(text.lstrip("0")) > 3:  # int() refuses 5,000-digit text
        raise errors.BadRequest(f"limit must be in 1..200, got {raw[:40]!r}")
    value = int(raw)
    if not 1 <= value <= 200:
        raise errors.BadRequest(f"limit must be in 1..200, got {value}")
    return value


async def list_jobs(call: RouteCall) -> Response:
    svc, q = call.svc, call.request.query_params
    limit = _limit(q.get("limit"))
    state = q.get("state") or ""
    if state and state not in ALL_JOB_STATES:
        valid = ", ".join(s.value for s in JobState)
        raise errors.BadRequest(f"unknown state {state!r} (valid states: {valid})")
    found = await svc.db(
        svc.store.views.list_jobs,
        limit,
        q.get("device") or "",
        q.get("submitter") or "",
        state,
        q.get("id_prefix") or "",  # EXT-CLI-7
        q.get("before") or "",  # the next page: the jobs after this one (docs/agents.md)
    )
    return answers.json(wire.JobList(jobs=[render.job(j) for j in found]))


async def get_job(call: RouteCall) -> Response:
    svc = call.svc
    job, position, waits = await svc.db(svc.store.queue.job_view, call.param)
    past = await svc.db(svc.store.views.attempts, job.id) if job.attempt > 1 else []
    out = wire.JobView(
        job=render.job(job, past),
        queue_position=position or None,
        waiting_for=None if waits is None else render.waiting_for(waits),  # EXT-WHY-1a
    )
    return answers.json(out)


async def kill(call: RouteCall) -> Response:
    """Cancel a queued job or flag an active one for its worker."""
    await perform(call.svc.hub, service.kill(call.svc, call.who, call.param, call.body))
    return Response(status_code=200)


def _follow_param(query: QueryParams) -> bool:
    values = query.getlist("follow")
    if not values:
        return True
    if len(values) > 1 or values[0] not in ("true", "false"):
        raise errors.BadRequest("follow must be exactly one of true or false")
    return values[0] == "true"


def _offset_param(query: QueryParams) -> int:
    """A byte count in 0..2^63-1; anything else is 400."""
    raw = query.get("offset")
    if raw is None:
        return 0
    if not raw.isascii() or not raw.isdigit() or len(raw.lstrip("0")) > 19:
        raise errors.BadRequest(f"offset must be a byte count in 0..{MAX_OFFSET}, got {raw[:40]!r}")
    value = int(raw.lstrip("0") or "0")
    if value > MAX_OFFSET:
        raise errors.BadRequest(f"offset must be a byte count in 0..{MAX_OFFSET}, got {value}")
    return value


TEXT_HEADERS = {"X-Content-Type-Options": "nosniff"}


async def logs(call: RouteCall) -> Response:
    """Snapshot, or replay-then-follow until the job is terminal."""
    svc, job_id, query = call.svc, call.param, call.request.query_params
    follow = _follow_param(query)
    offset = _offset_param(query)
    job = await svc.db(svc.store.views.job, job_id)
    if job.stdio in (Stdio.TTY, Stdio.PIPE):
        raise errors.LogsNotStored(f"logs are not stored for attached ({job.stdio}) jobs")
    media = "text/plain; charset=utf-8"
    if not follow:
        snap = await asyncio.to_thread(svc.logs.snapshot, job_id, offset)
        return StreamingResponse(_stream(snap), media_type=media, headers=TEXT_HEADERS)
    await svc.log_store(svc.logs.touch, job_id)
    return StreamingResponse(_follow(svc, job_id, offset), media_type=media, headers=TEXT_HEADERS)


async def _stream(snap: Snapshot, chunk: int = SNAPSHOT_CHUNK) -> AsyncIterator[bytes]:
    """A snapshot's bytes, one bounded read at a time, each off the event loop."""
    try:
        while data := await asyncio.to_thread(snap.read, chunk):
            yield data
    finally:
        snap.close()


async def _follow(svc: Services, job_id: str, offset: int) -> AsyncIterator[bytes]:
    """Send every stored byte, then new bytes as they land; end once the job is terminal."""
    # Open with an empty chunk so the status line and headers flush at once.
    yield b""
    while True:
        woken = svc.hub.logs.waiter(job_id)
        job = await svc.db(svc.store.views.job, job_id)
        # Read after the state, so every chunk before a terminal commit is sent; while it runs only
        # bytes that never move (EXT-KEEP-1).
        snap = await asyncio.to_thread(svc.logs.snapshot, job_id, offset, settled=job.terminal)
        async for chunk in _stream(snap, READ_CHUNK):
            offset += len(chunk)
            yield chunk
        if job.terminal or svc.hub.shutting_down.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(woken.wait(), FOLLOW_RECHECK)
