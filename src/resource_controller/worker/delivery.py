"""Delivering a report: what an answer means, and retrying until it is final.

Every attempt is bounded, the waits between them double up to ``outbox_backoff_max``,
and retrying never stops (EXT-OUTBOX-1): the answer that keeps a possibly-occupied
device out of the pool wins. ``logship`` judges its direct sends the same way.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Mapping
from typing import Any, Protocol

from resource_controller.h1 import core
from resource_controller.h1.aio import Answer
from resource_controller.worker import channel
from resource_controller.worker.outbox import FAULT, LOG, STATUS, Outbox, Report
from resource_controller.worker.timings import DEFAULT, Timings

log = logging.getLogger("resource_controller.worker.outbox")

#: How failed attempts are logged (``_log_failure``): retrying never stops.
LOUD_ATTEMPTS = 5
QUIET_EVERY = 30
#: What refuses a chunk of output for good: retrying it would never help.
LOG_REFUSALS = frozenset({400, 404, 409, 413, 422})


class Verdict(enum.Enum):
    DELIVERED = "delivered"
    REFUSED = "refused"
    RETRY = "retry"


def judge(resp: Answer, kind: str = STATUS) -> Verdict:
    """2xx delivers; 404, 409 ``stale_lease`` or a 409 with "terminal" in its code or
    message (no code is reserved for it), and ``LOG_REFUSALS`` for a chunk, refuse for
    good; anything else is retried."""
    if resp.is_success:
        return Verdict.DELIVERED
    if resp.status_code == 404 or (kind == LOG and resp.status_code in LOG_REFUSALS):
        return Verdict.REFUSED
    if resp.status_code == 409:
        code, message = core.error_body(resp.content)
        if code == "stale_lease" or "terminal" in f"{code} {message}".lower():
            return Verdict.REFUSED
    return Verdict.RETRY


async def attempt(
    send: Awaitable[Answer], kind: str, bound: float | None = None
) -> tuple[Verdict, str]:
    """One attempt's verdict and, unless delivered, what the answer (or its absence) said."""
    try:
        async with asyncio.timeout(bound):
            resp = await send
    except channel.TRANSPORT_ERRORS as exc:
        return Verdict.RETRY, channel.error_text(exc)
    verdict = judge(resp, kind)
    status = channel.status_line(resp)
    if verdict is Verdict.REFUSED:
        return verdict, f"{status}: {core.error_body(resp.content)[1] or 'no detail'}"
    return verdict, "" if verdict is Verdict.DELIVERED else f"controller returned {status}"


class Sender(Protocol):
    """Sends one attempt: the answer, or one of ``channel.TRANSPORT_ERRORS``."""

    async def status(self, job_id: str, body: Mapping[str, Any], timeout: float) -> Answer: ...

    async def fault(self, device_id: str, body: Mapping[str, Any], timeout: float) -> Answer: ...

    async def append_log(
        self, job_id: str, chunk: bytes, lease_epoch: int | None, timeout: float | None = None
    ) -> Answer: ...


def _send(report: Report, sender: Sender, timeout: float) -> Awaitable[Answer]:
    if report.kind == FAULT:
        return sender.fault(report.device_id, report.body, timeout)
    if report.kind == LOG:
        epoch = report.body.get("lease_epoch")
        epoch = epoch if isinstance(epoch, int) else None
        return sender.append_log(report.job_id, report.chunk, epoch, timeout)
    return sender.status(report.job_id, report.body, timeout)


def _log_failure(report: Report, problem: str) -> None:
    """A warning each time, an error at ``LOUD_ATTEMPTS``, then every ``QUIET_EVERY``-th."""
    extra = {"action": "outbox_retry", "job_id": report.job_id}
    n = report.attempts
    if n == LOUD_ATTEMPTS:
        log.error(
            "%s still not delivered after %d attempts (%s); it stays in the outbox and is "
            "retried until the controller answers",
            report.label,
            n,
            problem,
            extra=extra,
        )
    elif n < LOUD_ATTEMPTS or n % QUIET_EVERY == 0:
        log.warning("%s attempt %d failed: %s", report.label, n, problem, extra=extra)


async def deliver(
    box: Outbox, report: Report, sender: Sender, timings: Timings = DEFAULT
) -> Verdict:
    """Send once its predecessors are gone, until answered for good; cancelled, it stays."""
    for earlier in box.predecessors(report):
        await earlier.gone.wait()
    bound = timings.report_attempt_timeout
    delay = timings.outbox_backoff
    while True:
        report.attempts += 1
        verdict, problem = await attempt(_send(report, sender, bound), report.kind, bound)
        if verdict is not Verdict.RETRY:
            await box.discard(report)
            if verdict is Verdict.REFUSED:
                log.warning(
                    "%s refused for good by the controller (%s); dropped",
                    report.label,
                    problem,
                    extra={"action": "outbox_refused", "job_id": report.job_id},
                )
            elif report.attempts > 1:
                log.info(
                    "%s delivered at attempt %d",
                    report.label,
                    report.attempts,
                    extra={"action": "outbox_delivered", "job_id": report.job_id},
                )
            return verdict
        _log_failure(report, problem)
        await asyncio.sleep(delay)
        delay = min(delay * 2, timings.outbox_backoff_max)
