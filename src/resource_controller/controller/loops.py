"""Background loops: the scheduler pass, woken by changes, with a periodic safety net.

A pass runs right after every change that can place a queued job (EXT-FAST-1); kicks
that arrive while a pass runs coalesce into the next one. The periodic pass (1 s)
only matters if a kick was somehow missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from resource_controller import errors
from resource_controller.controller.deps import Services

log = logging.getLogger(__name__)


async def scheduler(svc: Services) -> None:
    """Run scheduling passes on every kick, and every ``schedule_interval`` regardless."""
    kick = svc.hub.schedule
    while not svc.hub.shutting_down.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(kick.wait(), svc.settings.schedule_interval)
        kick.clear()
        try:
            assigned = await svc.db(svc.store.schedule)
        except errors.RcError as exc:
            log.error("scheduling pass failed: %s", exc)
            continue
        except Exception:
            log.exception("scheduling pass failed")
            continue
        for a in assigned:
            svc.hub.workers.wake(a.worker_id)
