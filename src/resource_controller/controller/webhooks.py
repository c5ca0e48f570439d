"""Webhook notifications, best effort: raising one never blocks or fails its caller."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from resource_controller import errors
from resource_controller.controller.events import stamp
from resource_controller.controller.metrics import Metrics
from resource_controller.core import states
from resource_controller.h1 import aio, core

log = logging.getLogger(__name__)

QUEUE = 256
ATTEMPTS = 3
FIRST_BACKOFF = 1.0
POST_TIMEOUT = 10.0
DRAIN = 5.0
RESPONSE_DRAIN = 64 * 1024

WATCHDOG_TRIP = "watchdog_trip"
VERIFY_FAILED = "verify_failed"
DEVICE_UNHEALTHY = "device_unhealthy"
WORKER_LOST = "worker_lost"
DEVICE_RECOVERED = "device_recovered"
JOB_LOST = "job_lost"
LEASE_EXPIRED = "lease_expired"
JOB_PREEMPTED = "job.preempted"  #: EXT-PREEMPT-3
#: The kinds, and no others.
KINDS = (
    WATCHDOG_TRIP,
    VERIFY_FAILED,
    DEVICE_UNHEALTHY,
    WORKER_LOST,
    DEVICE_RECOVERED,
    JOB_LOST,
    LEASE_EXPIRED,
    JOB_PREEMPTED,
)

#: A terminal reason that is a watchdog trip starts with one of these.
WATCHDOG_PREFIXES = ("max_runtime exceeded", "idle: no output for")
VERIFY_PREFIX = "verify failed: "


@dataclass(frozen=True)
class Notice:
    """One webhook event, stamped when raised."""

    event: str
    at: float
    device: str = ""
    job: str = ""
    reason: str = ""

    def body(self) -> dict[str, str]:
        return {
            "event": self.event,
            "device": self.device,
            "job": self.job,
            "reason": self.reason,
            "at": stamp(self.at),
        }


def fault_notice(at: float, device: str, job: str, reason: str) -> Notice:
    """A fault report: ``verify_failed`` by its prefix, else ``device_unhealthy``."""
    kind = VERIFY_FAILED if reason.startswith(VERIFY_PREFIX) else DEVICE_UNHEALTHY
    return Notice(kind, at, device=device, job=job, reason=reason)


def sweep_notices(
    at: float,
    devices_unhealthy: Iterable[str],
    jobs_lost: Iterable[str],
    leases_expired: Iterable[str],
    reasons: dict[str, str] | None,
    lease_devices: dict[str, str] | None,
) -> list[Notice]:
    """One committed sweep's events, HOOKN-020's order; None reads degrade them."""
    out: list[Notice] = []
    announced = dict.fromkeys(devices_unhealthy)  # an ordered set: each device said once
    for device in announced:
        category = (reasons or {}).get(device, "")
        if category == "worker_lost":
            out.append(Notice(WORKER_LOST, at, device=device, reason=states.Quarantine.WORKER_LOST))
        else:
            out.append(Notice(DEVICE_UNHEALTHY, at, device=device, reason=category))
    for job in jobs_lost:
        out.append(Notice(JOB_LOST, at, job=job, reason=states.REASON_WORKER_LOST))
    for lease in leases_expired:
        device = (lease_devices or {}).get(lease, "")
        out.append(
            Notice(LEASE_EXPIRED, at, device=device, job=lease, reason=states.REASON_LEASE_EXPIRED)
        )
        if device and device not in announced and (reasons or {}).get(device) == "lease_expired":
            announced[device] = None
            out.append(
                Notice(DEVICE_UNHEALTHY, at, device=device, reason=states.Quarantine.LEASE_EXPIRED)
            )
    return out


def _where(url: str) -> tuple[core.Endpoint | None, str]:
    """The endpoint and the request target (path and query, as given) of ``url``."""
    try:
        end = core.endpoint(url)
    except ValueError:
        return None, ""
    parts = urllib.parse.urlsplit(url.strip())
    query = "?" + parts.query if parts.query else ""
    return end._replace(prefix=""), (parts.path or "/") + query


def check_url(url: str, environ: Mapping[str, str]) -> str:
    """What is wrong with ``url`` as a webhook URL, or ``""``: not http(s), or meant
    for a proxy set in ``environ`` (none is supported: ``core.proxy_refusal``)."""
    try:
        end = core.endpoint(url)
    except ValueError as exc:
        return f"webhook URL {exc}"
    return core.proxy_refusal(end, environ)


class Notifier:
    """The bounded queue and its one delivery task."""

    def __init__(
        self,
        url: str,
        counters: Metrics | None = None,
        *,
        backoff: float = FIRST_BACKOFF,
        post_timeout: float = POST_TIMEOUT,
    ) -> None:
        self.url = url
        self.counters = counters or Metrics()  # a registry of its own when none is given
        self.backoff = backoff
        self.post_timeout = post_timeout
        self._queue: asyncio.Queue[Notice] = asyncio.Queue(maxsize=QUEUE)
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0
        self.delivered = 0

    def emit(self, notice: Notice) -> None:
        """Queue one event; never blocks, never raises."""
        if self._closed:
            self._drop(notice, "shutdown")
            return
        try:
            self._queue.put_nowait(notice)
        except asyncio.QueueFull:
            self._drop(notice, "queue_full")
            log.warning(
                "webhook queue full: dropped %s event device=%s", notice.event, notice.device
            )

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="webhooks")

    async def _run(self) -> None:
        client = aio.HttpClient({"Content-Type": "application/json"})
        try:
            while True:
                notice = await self._queue.get()
                try:
                    await self._deliver(client, notice)
                finally:
                    self._queue.task_done()
        finally:
            await client.aclose()

    async def _deliver(self, client: aio.HttpClient, notice: Notice) -> None:
        end, target = _where(self.url)
        wait = self.backoff
        for attempt in range(1, ATTEMPTS + 1):
            if attempt > 1:
                await asyncio.sleep(wait)
                wait *= 2
            if end is None:
                problem = "not an http:// or https:// URL"
                break
            body = json.dumps(notice.body()).encode()
            try:
                r = await client.request(
                    "POST", end, target, body, timeout=self.post_timeout, limit=RESPONSE_DRAIN
                )
                if r.is_success:
                    self.delivered += 1
                    self.counters.webhook_delivered.labels(notice.event).inc()
                    return
                problem = f"status {r.status_code}"
            except errors.TransportError as exc:
                problem = type(exc).__name__
            log.debug("webhook %s attempt %d failed: %s", notice.event, attempt, problem)
        self._drop(notice, "failed")
        log.warning(
            "webhook %s event dropped after %d attempts: %s", notice.event, ATTEMPTS, problem
        )

    def _drop(self, notice: Notice, why: str) -> None:
        self.dropped += 1
        self.counters.webhook_dropped.labels(notice.event, why).inc()

    async def close(self, bound: float = DRAIN) -> None:
        """Stop accepting events, deliver what is queued within ``bound`` s."""
        self._closed = True
        task = self._task
        if task is None:
            return
        try:
            async with asyncio.timeout(bound):
                await self._queue.join()
        except TimeoutError:
            left = self._queue.qsize() + 1
            log.warning("webhook drain gave up after %g s: %d event(s) abandoned", bound, left)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
