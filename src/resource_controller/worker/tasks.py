"""The worker's background tasks: started, tracked for shutdown, never lost silently.

A job-side task is registered in the same step as it is created, so the shutdown wait
always sees it; a task's failure is logged, never lost with the task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from resource_controller.core import durations

log = logging.getLogger("resource_controller.worker.agent")


async def guard(coro: Coroutine[Any, Any, None], what: str) -> None:
    """Run a background coroutine, logging a failure instead of losing it."""
    try:
        await coro
    except Exception:
        log.exception("%s failed", what, extra={"action": "task_failed"})


def background(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    return asyncio.create_task(guard(coro, name), name=name)


async def wait_or_stop(
    coro: Coroutine[Any, Any, Any], stop: asyncio.Event, name: str
) -> asyncio.Task[Any] | None:
    """Run ``coro`` until it ends or ``stop`` is set; ``None`` when stopped first."""
    work = asyncio.create_task(coro, name=name)
    stopping = asyncio.create_task(stop.wait(), name="stop-wait")
    try:
        await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not work.done():
            work.cancel()
            await asyncio.wait({work})
    return None if work.cancelled() else work


class Tracker:
    """The job-side tasks the shutdown must wait for, each with the job ID it serves."""

    def __init__(self) -> None:
        self._tasks: dict[asyncio.Task[None], str] = {}

    def track(self, coro: Coroutine[Any, Any, None], job_id: str) -> None:
        """Start a job-side task and register it in the same step."""
        task = asyncio.create_task(guard(coro, f"job {job_id}"), name=f"job-{job_id}")
        self._tasks[task] = job_id
        task.add_done_callback(self._tasks.pop)

    async def abandon(self, wait: float, tasks: list[asyncio.Task[None]] | None = None) -> None:
        """Cancel ``tasks`` (default: every one; each kills its process group on the way
        out), then wait ``wait`` s for them."""
        live = [t for t in (self._tasks if tasks is None else tasks) if not t.done()]
        for task in live:
            task.cancel()
        if live:
            await asyncio.wait(live, timeout=wait)

    async def wait(self, timeout: float, abandon_wait: float) -> None:
        """The shutdown's bounded wait for every task; the late ones are abandoned."""
        if not self._tasks:
            return
        log.info(
            "shutdown: waiting for %d job task(s)", len(self._tasks), extra={"action": "shutdown"}
        )
        _, pending = await asyncio.wait(list(self._tasks), timeout=timeout)
        if pending:
            # Outcomes already in the outbox are re-sent at the next start; jobs abandoned
            # before that are reconciled by the controller, which keeps the devices out.
            log.error(
                "shutdown: abandoned job(s) after %s: %s",
                durations.render_duration(timeout),
                ", ".join(sorted(self._tasks.get(t, "?") for t in pending)),
                extra={"action": "shutdown_abandoned"},
            )
            await self.abandon(abandon_wait, list(pending))
