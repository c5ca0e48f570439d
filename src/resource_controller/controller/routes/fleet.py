"""Client and admin fleet routes (controller-api.md §7.6-7.12)."""

from __future__ import annotations

from starlette.responses import Response

from resource_controller import errors, wire
from resource_controller.controller import answers, render, service
from resource_controller.controller.answers import JSON
from resource_controller.controller.deps import RouteCall
from resource_controller.controller.wake import perform
from resource_controller.core import identity, limits, selectors
from resource_controller.core import usage as acct
from resource_controller.store.records import DeviceRecoveries


async def devices(call: RouteCall) -> Response:
    svc = call.svc
    snaps = await svc.db(svc.store.views.devices)
    now = svc.now()
    body = render.json_body([render.device_view_body(s, now) for s in snaps])
    return Response(body, media_type=JSON)


async def state(call: RouteCall) -> Response:
    svc = call.svc
    snaps, active, queued, waits = await svc.db(svc.store.views.state_view)
    now = svc.now()
    # wire.State's fields in its order, parts unvalidated, device views plain objects.
    out: dict[str, object] = {
        "devices": [render.device_view_body(s, now) for s in snaps],
        "jobs": [render.job(j) for j in active],
        "queued": [render.job(j) for j in queued],
    }
    if queued:
        out["queued_waiting_seconds"] = {
            j.id: now - (j.queued_at or j.submitted_at) for j in queued
        }
        out["queued_waiting_for"] = {  # EXT-WHY-1a
            j.id: render.waiting_for(waits.get(j.id, [])) for j in queued
        }
    return Response(render.json_body(out), media_type=JSON)


def _recoveries(h: DeviceRecoveries) -> wire.RecoveryHistory:
    """The flap-guard history describe carries beside its base fields."""
    return wire.RecoveryHistory(
        recoveries=[wire.Recovery(at=render.ts(r.at) or "", reason=r.reason) for r in h.recoveries],
        remaining=h.remaining,
        limit=h.limit,
        window_seconds=h.window,
    )


async def describe(call: RouteCall) -> Response:
    svc, device_id = call.svc, call.param
    found = await svc.db(svc.store.views.describe, device_id)
    if found is None:
        raise errors.DeviceNotFound(f"no such device: {device_id}")
    snap, sheet, recent = found.snapshot, found.sheet, found.recent_jobs
    now = svc.now()
    view = render.device_view(snap, now)
    out = wire.Describe(
        device=view.device,
        holder=view.holder,
        job_id=view.job_id,
        elapsed_seconds=view.elapsed_seconds,
        heartbeat_age_seconds=view.heartbeat_age_seconds,
        quarantine_reason=view.quarantine_reason,
        labels=view.device.labels,
        label_age_seconds={f"{lb.key}/{lb.source}": now - lb.updated_at for lb in snap.labels}
        or None,
        sheet=sheet.body or None,
        sheet_updated_at=render.ts(sheet.updated_at) or render.ZERO_INSTANT,
        sheet_age_seconds=now - sheet.updated_at if sheet.body and sheet.updated_at else None,
        sheet_is_host_wide=True if sheet.host_wide else None,
        recent_jobs=[render.job(j) for j in recent] or None,
        recoveries=_recoveries(found.recoveries),
    )
    return answers.json(out)


async def explain(call: RouteCall) -> Response:
    svc, request = call.svc, call.request
    text = request.query_params.get("selector") or ""
    if not text:
        raise errors.BadRequest("selector is required")
    if limits.utf8_len(text) > limits.SELECTOR.size:  # as on submit
        raise errors.BadRequest(f"selector: at most {limits.SELECTOR.size} bytes")
    try:
        selectors.validate(text)
    except selectors.SelectorError as exc:
        raise errors.BadSelector(str(exc)) from None
    asserted = request.query_params.get("submitter") or ""
    if limits.utf8_len(asserted) > limits.SUBMITTER.size:
        raise errors.BadRequest(f"submitter: at most {limits.SUBMITTER.size} bytes")
    ex = await svc.db(svc.store.views.explain, text)
    out = wire.Explain(
        selector=ex.selector,
        matching=ex.matching,
        free=ex.free,
        queue_depth=ex.queue_depth,
        hint=ex.hint or None,
    )
    # The asking submitter's limit, under the name a submit would count.
    caller = call.who
    share = identity.share_name(caller, identity.recorded_submitter(caller, asserted))
    limit = svc.store.limits.of(share) if share else None
    if limit is not None:
        held = await svc.db(svc.store.views.held_by_share)
        out.submitter, out.submitter_limit = share, limit
        out.submitter_held = held.get(share, 0)
    return answers.json(out)


async def usage(call: RouteCall) -> Response:
    """Who held what over a window, per group: ``since`` (default 7d),
    ``by`` (submitter, device or host), ``limit`` groups at most (default 1000)."""
    q = call.request.query_params
    window = await perform(
        call.svc.hub,
        service.usage(
            call.svc,
            q.get("by") or acct.DEFAULT_BY,
            q.get("since") or acct.DEFAULT_SINCE,
            _usage_limit(q.get("limit")),
        ),
    )
    return answers.json(render.usage(window))


def _usage_limit(raw: str | None) -> int:
    """``limit``: ASCII digits only, and short; the range is the service's."""
    if not raw:
        return acct.MAX_GROUPS
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9:
        raise errors.BadRequest(f"limit: must be an integer in 1..{acct.MAX_GROUPS}")
    return int(raw)


async def whoami(call: RouteCall) -> Response:
    """The caller's role, and its name when the token has one."""
    return answers.json(wire.Whoami(role=call.who.role.value, name=call.who.name))


async def clear(call: RouteCall) -> Response:
    await perform(call.svc.hub, service.clear(call.svc, call.param))
    return Response(status_code=200)


async def drain(call: RouteCall) -> Response:
    """EXT-DRAIN-3a: 200 with an empty body; draining again replaces who, when and why."""
    await perform(call.svc.hub, service.drain(call.svc, call.who, call.param, call.body))
    return Response(status_code=200)


async def undrain(call: RouteCall) -> Response:
    """EXT-DRAIN-3a: no body; a device that is not draining is left as it is."""
    await perform(call.svc.hub, service.undrain(call.svc, call.param))
    return Response(status_code=200)


async def retire(call: RouteCall) -> Response:
    await perform(call.svc.hub, service.retire(call.svc, call.param))
    return answers.json(
        wire.Retired(
            retired=call.param,
            note="a worker that still declares this device will recreate it on its next registration",
        )
    )
