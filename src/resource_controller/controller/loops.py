"""Background loops: the scheduler pass, kicked after every change that can place a job (the
periodic pass only catches a missed kick), and the reaper; errors are logged."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable
from typing import TypeVar

from resource_controller import errors
from resource_controller.controller import service, webhooks
from resource_controller.controller.deps import Services
from resource_controller.controller.wake import Done, Wake, apply, perform
from resource_controller.core import expiry
from resource_controller.store.records import SweepResult

log = logging.getLogger(__name__)

T = TypeVar("T")


async def scheduler(svc: Services) -> None:
    """Run scheduling passes on every kick, and every ``schedule_interval`` regardless."""
    kick = svc.hub.schedule
    while not svc.hub.shutting_down.is_set():
        kicked = False
        with contextlib.suppress(TimeoutError):
            kicked = await asyncio.wait_for(kick.wait(), svc.settings.schedule_interval)
        kick.clear()
        if not (kicked or svc.peers.leading):
            continue
        with svc.metrics.schedule_pass.time():
            await _logged(svc, "scheduling pass", service.schedule_pass(svc))


async def limits_on_hangup(svc: Services) -> None:
    """Read the limits file again on every SIGHUP, one reading at a time."""
    loop = asyncio.get_running_loop()
    hangup = asyncio.Event()
    try:
        loop.add_signal_handler(signal.SIGHUP, hangup.set)
    except (NotImplementedError, RuntimeError, ValueError):
        # Not the main thread (an embedding): the file is then read only at start-up.
        log.warning("SIGHUP cannot be handled here; the limits file is read at start-up only")
        return
    try:
        while True:
            await hangup.wait()
            hangup.clear()
            try:
                await perform(svc.hub, service.reload_limits(svc))
            except Exception:
                log.exception("reading the limits file again failed")
    finally:
        loop.remove_signal_handler(signal.SIGHUP)


async def _stopping(svc: Services, seconds: float) -> bool:
    """Sleep ``seconds`` unless shutdown begins first; True when it did."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(svc.hub.shutting_down.wait(), seconds)
    return svc.hub.shutting_down.is_set()


async def reaper(svc: Services, started: float, hold_off_until: float) -> None:
    """Sweep every ``sweep_interval``; ``started`` (the controller's start on its clock)
    seeds the stall guard, so a first pass far later than scheduled is caught too."""
    s = svc.settings
    guard = expiry.StallGuard(previous=started)
    while not await _stopping(svc, s.sweep_interval):
        now = svc.clock.now()
        gap = now - guard.previous if guard.previous is not None else 0.0
        guard = guard.after_pass(now, s.sweep_interval)
        # Read together: a sweep is judged, and fenced, by the term it began in.
        since, fence = svc.peers.since, svc.peers.fence
        if not svc.peers.leading or since is None:
            continue
        if guard.just_stalled:
            log.warning(
                "reaper pass started %g s after the previous one (interval %g s): the "
                "controller was paused or starved; no lease expires and no worker is written "
                "off until %d passes run on schedule",
                gap,
                s.sweep_interval,
                expiry.RESUME_PASSES,
            )
        if s.log_retention > 0:  # one bounded retention pass on the reaper's tick
            await _logged(svc, "log retention pass", service.prune_logs(svc, fence))
        rules = expiry.SweepRules(
            grace=s.grace,
            unhealthy_after=s.unhealthy_after,
            # A controller that began to lead later judges no silence it did not see.
            hold_off_until=max(hold_off_until, since + s.hold_off),
            retain=s.retain_disconnected_jobs,
            stalled=not guard.may_judge,
        )
        with svc.metrics.sweep.time():
            result = await _logged(svc, "sweep", service.sweep(svc, rules, fence))
        if result is not None:
            await _after_sweep(svc, result)


async def _logged(svc: Services, what: str, op: Awaitable[Done[T]]) -> T | None:
    """``perform(op)``; a failure is logged and answers None, so the loop carries on."""
    try:
        return await perform(svc.hub, op)
    except errors.NotLeading as exc:
        log.info("%s not run: %s", what, exc)
    except errors.RcError as exc:
        log.error("%s failed: %s", what, exc)
    except Exception:
        log.exception("%s failed", what)
    return None


async def _after_sweep(svc: Services, result: SweepResult) -> None:
    """Say what the sweep took out (its wake-ups were applied by ``perform``): log lines,
    then the webhook events of HOOKN-020 from reads made after the commit."""
    if result.devices_unknown:
        log.info("devices unknown (worker silent): %s", ", ".join(sorted(result.devices_unknown)))
    if not result.alarming:
        return
    if result.devices_unhealthy:
        log.warning(
            "devices quarantined, worker lost: %s", ", ".join(sorted(result.devices_unhealthy))
        )
    if result.jobs_lost:
        log.warning("jobs lost, worker lost: %s", ", ".join(sorted(result.jobs_lost)))
    where: dict[str, str] | None = {}
    if result.leases_expired:
        # A separate read after the sweep committed; failing, it only costs names.
        try:
            where = await svc.db(svc.store.views.lease_devices, result.leases_expired)
        except Exception:
            log.exception("reading the devices of expired leases failed")
            where = None
        log.warning(
            "leases expired, devices quarantined: %s",
            ", ".join(
                f"{i} on {(where or {}).get(i) or '?'}" for i in sorted(result.leases_expired)
            ),
        )
    if svc.hub.notifier is not None:
        await _notify_sweep(svc, result, where)


async def _notify_sweep(svc: Services, result: SweepResult, where: dict[str, str] | None) -> None:
    """HOOKN-020: categories read now, after the commit; unreadable ones degrade the events."""
    affected = sorted({*result.devices_unhealthy, *(where or {}).values()})
    reasons: dict[str, str] | None
    try:
        reasons = await svc.db(svc.store.views.quarantine_reasons, affected) if affected else {}
    except Exception:
        log.exception("reading the quarantine categories after a sweep failed")
        reasons = None
    notices = webhooks.sweep_notices(
        svc.clock.now(),
        sorted(result.devices_unhealthy),
        sorted(result.jobs_lost),
        sorted(result.leases_expired),
        reasons,
        where,
    )
    apply(svc.hub, Wake(notices=tuple(notices)))
