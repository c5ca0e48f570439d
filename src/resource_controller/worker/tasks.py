"""The worker's background tasks: started, tracked for shutdown, never lost silently.

Every task the poll loop starts for a job (its lifecycle, a pre-killed report, a fault
report's delivery) is registered with the shutdown tracker in the same step as it is
created, so the shutdown wait always sees it. A task's failure is logged,
never lost with the task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("resource_controller.worker.agent")


async def guard(coro: Coroutine[Any, Any, None], what: str) -> None:
    """Run a background coroutine, logging a failure instead of losing it."""
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("%s failed", what, extra={"action": "task_failed"})


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
        task.add_done_callback(self._untrack)

    def _untrack(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)

    def live(self) -> list[asyncio.Task[None]]:
        return list(self._tasks)

    def job_of(self, task: asyncio.Task[None]) -> str:
        return self._tasks.get(task, "?")

    async def abandon(self, tasks: list[asyncio.Task[None]], wait: float) -> None:
        """Cancel tasks (each kills its process group on the way out); wait ``wait`` s."""
        live = [t for t in tasks if not t.done()]
        for task in live:
            task.cancel()
        if live:
            await asyncio.wait(live, timeout=wait)
