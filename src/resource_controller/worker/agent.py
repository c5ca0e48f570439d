"""The worker agent: register, heartbeat, long-poll, run jobs, report, shut down.

The worker never accepts a connection; every exchange is a request it makes with one
``httpx.AsyncClient``. After registering it runs two loops: a heartbeat naming exactly
the jobs it supervises, and those whose outcome still waits in the outbox (the
controller renews only the leases named, WRK-051, EXT-OUTBOX-2), and a poll loop that
starts a task per job. Each job task owns its job from the ``running`` report to the
terminal report. Only the terminal report frees the device, so it goes through the
durable outbox (``outbox``: written to disk first, retried until the controller answers
for good) on a path that shutdown does not cancel (WRK-073): shutdown only *asks* jobs
to stop, through the same cancellation path as a kill flag.

Start-up (WRK-040, EXT-OUTBOX-3): open the state directory; deliver whatever the
previous run left in the outbox (registering first would reap those jobs as lost);
register with a recovery proof (``recovery``); then serve. Every answer from the
controller feeds the reconnection tracker (``reconnect``); when it says the controller
has forgotten us, the poll loop registers again, but only while nothing is supervised
and the outbox is empty (WRK-150). After each job the straggler sweep (``sweep``) ends
escapees that still carry its ``RC_JOB_ID`` (WRK-120).

The agent runs as its own process (``main``, ``run_worker``: signal handlers, exit
status) or inside a loop that also serves a controller (``Agent(config).run(stop)``,
for ``rc up``).

Not here yet: hooks, verify, probes beyond the built-in facts, sheets, attached stdio.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import random
import signal
import sys
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from resource_controller import wire
from resource_controller.clock import Clock, SystemClock
from resource_controller.core import durations
from resource_controller.core.states import JobState
from resource_controller.worker import (
    answers,
    logship,
    outbox,
    probes,
    procs,
    reconnect,
    recovery,
    runner,
    sweep,
    testhooks,
)
from resource_controller.worker import config as worker_config

log = logging.getLogger(__name__)

#: Overall bound on one non-streaming request (WRK-030).
HTTP_TIMEOUT = 120.0
#: Wait after a failed poll (WRK-061). *(test hook)*
POLL_ERROR_BACKOFF = 2.0
#: Minimum gap after a poll that started nothing and came back early (WRK-062,
#: EXT-FAST-4). *(test hook)*
IDLE_POLL_GAP = 0.25
#: How long shutdown waits for job tasks before abandoning them (WRK-130). *(test hook)*
SHUTDOWN_WAIT = 45.0
#: After abandoning, how long to wait for the cancelled tasks to kill their groups.
ABANDON_WAIT = 5.0

INSTANCE_HEADER = "Rc-Controller-Instance"
REASON_PREKILLED = "killed before this worker started it"


class StartupError(Exception):
    """The worker cannot start; the message is the ``rc: <message>`` line (WRK-002)."""


class RegisterError(StartupError):
    """Registration failed; the message is the ``register: ...`` line of WRK-045."""


class _LogSendError(Exception):
    """The controller refused a log chunk."""


@dataclass
class _Job:
    """One job under supervision: its assignment and its cancellation scope."""

    assignment: wire.Assignment
    cancel: asyncio.Event = field(default_factory=asyncio.Event)


def parse_poll_body(body: bytes) -> tuple[list[wire.Assignment], list[str]]:
    """Decode a 200 poll answer (WRK-060, WRK-064); raise ``ValueError`` if undecodable.

    Either list may be absent or null, and so may any list or map inside an assignment
    (``"env": null``, the reference controller's empty map: EXT-COMPAT-1). Unknown
    assignment fields are ignored, so a newer controller's additions never stop an
    older worker.
    """
    data = json.loads(body)
    if not isinstance(data, dict):
        raise ValueError("poll answer is not a JSON object")
    raw_assignments = data.get("assignments") or []
    raw_kills = data.get("kills") or []
    if not isinstance(raw_assignments, list) or not isinstance(raw_kills, list):
        raise ValueError("poll answer lists are not lists")
    known = wire.Assignment.model_fields
    assignments = []
    for item in raw_assignments:
        if not isinstance(item, dict):
            raise ValueError("an assignment is not a JSON object")
        fields = {
            k: wire.null_means_empty(known[k].annotation, v) for k, v in item.items() if k in known
        }
        assignments.append(wire.Assignment.model_validate(fields))
    if not all(isinstance(k, str) for k in raw_kills):
        raise ValueError("a kill is not a job ID string")
    return assignments, list(raw_kills)


class Agent:
    """One worker process's conversation with the controller."""

    def __init__(
        self,
        config: worker_config.WorkerConfig,
        clock: Clock | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        base_env: Mapping[str, str] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        #: Contact history and the re-registration debt (WRK-032, WRK-151).
        self.contact = reconnect.Reconnect(rng)
        #: Reports that must reach the controller; opened by ``run`` (EXT-OUTBOX).
        self.outbox: outbox.Outbox | None = None
        self._transport = transport
        self._base_env = base_env
        # EXT-PG-5 (several URLs, failover) is not implemented: the first one is used.
        self._base = config.controller_url.split(",")[0].strip()
        self._client: httpx.AsyncClient | None = None
        # Single-threaded asyncio: reads and writes of the worker ID never interleave
        # mid-update, which is all WRK-033 asks for.
        self._worker_id = ""
        #: Jobs under supervision, in start order (WRK-051).
        self._jobs: dict[str, _Job] = {}
        #: Every job ID this process started or pre-killed; never pruned (WRK-070).
        self._seen: set[str] = set()
        #: Tasks the shutdown must wait for (WRK-067), with the job ID each serves.
        self._tasks: dict[asyncio.Task[None], str] = {}
        self._shutting_down = False

    # ---- state read by tests and by the heartbeat ---------------------------------

    @property
    def worker_id(self) -> str:
        return self._worker_id

    @property
    def supervised_job_ids(self) -> list[str]:
        """The jobs this process supervises whose outcome is not yet in the outbox (WRK-051)."""
        pending = set(self.pending_job_ids)
        return [j for j in self._jobs if j not in pending]

    @property
    def pending_job_ids(self) -> list[str]:
        """Finished jobs whose terminal report waits in the outbox (EXT-OUTBOX-2)."""
        return self.outbox.pending_job_ids() if self.outbox is not None else []

    @property
    def _box(self) -> outbox.Outbox:
        assert self.outbox is not None, "the agent is not running"
        return self.outbox

    # ---- running -----------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Start, serve until ``stop`` is set, then shut down gracefully (§12).

        Raises ``StartupError`` when the state directory cannot be used, and
        ``RegisterError`` if the first registration fails (WRK-002); returns quietly if
        ``stop`` is set before registration completes. Reports still in the outbox when
        it returns stay on disk for the next start.
        """
        try:
            box = outbox.Outbox.open(self.config.state_dir, self.clock)
        except outbox.OutboxError as exc:
            raise StartupError(str(exc)) from exc
        self.outbox = box
        # A job whose outcome the previous run left here must never run again.
        self._seen.update(box.pending_job_ids())
        headers = {
            "Authorization": f"Bearer {self.config.token}",
            "Content-Type": "application/json",
        }
        try:
            async with httpx.AsyncClient(
                headers=headers, timeout=HTTP_TIMEOUT, transport=self._transport
            ) as client:
                self._client = client
                try:
                    if not await self._deliver_leftovers(stop):
                        return
                    if not await self._register_or_stop(stop):
                        return
                    await self._serve(stop)
                finally:
                    await self._abandon(list(self._tasks))
                    self._client = None
        finally:
            if not box.empty:
                log.warning(
                    "%d report(s) not delivered stay in %s and are re-sent at the next start",
                    len(box),
                    box.directory,
                    extra={"action": "outbox_kept"},
                )
            box.close()

    async def _wait_or_stop(
        self, coro: Coroutine[Any, Any, Any], stop: asyncio.Event, name: str
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

    async def _register_or_stop(self, stop: asyncio.Event) -> bool:
        registering = await self._wait_or_stop(self.register(), stop, "register")
        if registering is None:
            return False
        registering.result()  # raises RegisterError
        return True

    async def _deliver_leftovers(self, stop: asyncio.Event) -> bool:
        """Deliver what the previous run left in the outbox, before registering (EXT-OUTBOX-3).

        Registration reaps every job the controller thinks is in flight here, so an
        outcome still in the outbox would be recorded ``lost`` and its device
        quarantined. The controller derives the worker ID from the host, so the ID in
        the reports is ours too: it accepts them while the lease is live, and heartbeats
        under it keep naming the jobs as pending meanwhile. Returns ``False`` if
        ``stop`` came first (the reports stay on disk).
        """
        box = self._box
        if box.empty:
            return True
        log.info(
            "delivering %d report(s) from the previous run before registering",
            len(box),
            extra={"action": "outbox_resend"},
        )
        for report in box.reports():
            self._track(self._deliver(report), report.job_id or report.device_id)
        recorded = next(
            (
                str(r.body["worker_id"])
                for r in reversed(box.reports())
                if r.kind == outbox.STATUS and r.body.get("worker_id")
            ),
            "",
        )
        heartbeat: asyncio.Task[None] | None = None
        if recorded:
            self._worker_id = recorded
            heartbeat = asyncio.create_task(
                self._guard(self._heartbeat_loop(), "heartbeat"), name="heartbeat"
            )
        try:
            return await self._wait_or_stop(box.wait_empty(), stop, "outbox-drain") is not None
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
                await asyncio.gather(heartbeat, return_exceptions=True)

    async def _serve(self, stop: asyncio.Event) -> None:
        heartbeat = asyncio.create_task(
            self._guard(self._heartbeat_loop(), "heartbeat"), name="heartbeat"
        )
        poll = asyncio.create_task(self._guard(self._poll_loop(), "poll"), name="poll")
        stopping = asyncio.create_task(stop.wait(), name="stop-wait")
        try:
            await asyncio.wait({stopping, poll, heartbeat}, return_when=asyncio.FIRST_COMPLETED)
            if not stop.is_set():
                log.error("a worker loop ended on its own; shutting down")
        finally:
            await self._shutdown(poll, heartbeat, stopping)

    async def _shutdown(self, *loops: asyncio.Task[Any]) -> None:
        """Stop polling and heartbeats, cancel every job, wait a bounded time (WRK-130)."""
        self._shutting_down = True
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        for job in self._jobs.values():
            job.cancel.set()
        tasks = list(self._tasks)
        if not tasks:
            return
        log.info("shutdown: waiting for %d job task(s)", len(tasks), extra={"action": "shutdown"})
        _, pending = await asyncio.wait(tasks, timeout=SHUTDOWN_WAIT)
        if pending:
            # WRK-131: the window is a bound, not a promise. Outcomes already in the
            # outbox stay on disk and are re-sent at the next start; jobs abandoned
            # before that are reconciled by the controller, which keeps the devices out.
            log.error(
                "shutdown: abandoned job(s) after %s: %s",
                durations.render_duration(SHUTDOWN_WAIT),
                ", ".join(sorted(self._tasks.get(t, "?") for t in pending)),
                extra={"action": "shutdown_abandoned"},
            )
            await self._abandon(list(pending))

    async def _abandon(self, tasks: list[asyncio.Task[None]]) -> None:
        """Cancel tasks (each kills its process group on the way out) and wait briefly."""
        live = [t for t in tasks if not t.done()]
        for task in live:
            task.cancel()
        if live:
            await asyncio.wait(live, timeout=ABANDON_WAIT)

    async def _guard(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        """Run a background coroutine, logging a failure instead of losing it."""
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s failed", what, extra={"action": "task_failed"})

    def _track(self, coro: Coroutine[Any, Any, None], job_id: str) -> None:
        """Start a job-side task and register it for shutdown in the same step (WRK-067)."""
        task = asyncio.create_task(self._guard(coro, f"job {job_id}"), name=f"job-{job_id}")
        self._tasks[task] = job_id
        task.add_done_callback(self._untrack)

    def _untrack(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)

    # ---- HTTP --------------------------------------------------------------------

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content: bytes | None = None,
        params: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        """One request to ``controller_url + path``; any answer counts as contact (WRK-032)."""
        assert self._client is not None, "the agent is not running"
        async with asyncio.timeout(HTTP_TIMEOUT if timeout is None else timeout):
            resp = await self._client.request(
                method,
                self._base + path,
                json=body,
                content=content,
                params=params,
            )
        self.contact.observe(self.clock.monotonic(), resp.headers.get(INSTANCE_HEADER, ""))
        return resp

    async def _post(self, path: str, body: dict[str, Any], timeout: float) -> httpx.Response:
        """One bounded attempt of an outbox report."""
        return await self._request("POST", path, body=body, timeout=timeout)

    # ---- registration ------------------------------------------------------------

    def registration_body(self, proof: recovery.Claims | None = None) -> dict[str, Any]:
        """The body of ``POST /v1/workers/register`` (WRK-043).

        ``recovery`` is present only when the proof claims something (WRK-140).
        """
        cfg = self.config
        devices: list[dict[str, Any]] = []
        for d in cfg.devices:
            decl: dict[str, Any] = {"name": d.name}
            if d.max_runtime_seconds:
                decl["max_runtime_seconds"] = d.max_runtime_seconds
            devices.append(decl)
        body: dict[str, Any] = {"host": cfg.host}
        boot = procs.boot_id()
        if boot:
            body["boot_id"] = boot
        if proof:
            body["recovery"] = dict(proof)
        body["devices"] = devices
        # Explicit null when the pass found nothing: absent, null and {} differ.
        body["labels"] = probes.labels_payload(
            probes.builtin_facts(), (d.name for d in cfg.devices)
        )
        # Sent for every device, empty ones included, so removing a label clears it.
        body["declared_labels"] = {d.name: dict(d.labels) for d in cfg.devices}
        return body

    async def _proof(self) -> recovery.Claims:
        """The recovery proof, computed only while nothing is supervised (WRK-046).

        Both callers (start-up, idle re-registration) guarantee that; should a job be
        in hand anyway, the scan would find it, so nothing is claimed.
        """
        if self._jobs:
            return {}
        return await asyncio.to_thread(recovery.compute, self.config.require_manual_clear)

    async def register(self) -> str:
        """Register and store the worker ID; raise ``RegisterError`` on any failure.

        Success settles any re-registration debt (WRK-153): a fresh registration is
        exactly what the debt asked for.
        """
        body = self.registration_body(await self._proof())
        try:
            resp = await self._request("POST", "/v1/workers/register", body=body)
        except answers.TRANSPORT_ERRORS as exc:
            raise RegisterError(f"register: {answers.error_text(exc)}") from exc
        if resp.status_code != 200:
            raise RegisterError(f"register: controller returned {answers.status_line(resp)}")
        try:
            worker_id = wire.RegisterResponse.model_validate(resp.json()).worker_id
        except ValueError as exc:
            raise RegisterError(f"register: unreadable answer: {exc}") from exc
        self._worker_id = worker_id
        self.contact.settled()
        log.info(
            "registered as worker %s (host %s, %d device(s))",
            worker_id,
            self.config.host,
            len(self.config.devices),
            extra={"action": "registered"},
        )
        return worker_id

    # ---- heartbeat ---------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        """Every interval, name exactly the supervised jobs (WRK-050..052)."""
        loop = asyncio.get_running_loop()
        interval = self.config.heartbeat_interval
        next_at = loop.time() + interval
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            # Ticks keep their schedule; a slow heartbeat skips ticks, never bunches them.
            next_at += interval * max(1, int((loop.time() - next_at) // interval) + 1)
            await self.heartbeat()

    def heartbeat_body(self) -> dict[str, Any]:
        """Running and pending jobs, each list omitted when empty, never a job in both.

        Running: supervised, outcome not yet queued (WRK-050, WRK-051). Pending: outcome
        in the outbox, not yet answered for good (EXT-OUTBOX-2).
        """
        pending = self.pending_job_ids
        running = self.supervised_job_ids
        body: dict[str, Any] = {}
        if running:
            body["running_job_ids"] = running
        if pending:
            body["pending_job_ids"] = pending
        return body

    async def heartbeat(self) -> bool:
        """Send one heartbeat; a failure is a warning, never retried (WRK-052)."""
        body = self.heartbeat_body()
        try:
            resp = await self._request(
                "POST", f"/v1/workers/{self._worker_id}/heartbeat", body=body
            )
        except answers.TRANSPORT_ERRORS as exc:
            log.warning(
                "heartbeat failed: %s", answers.error_text(exc), extra={"action": "heartbeat"}
            )
            return False
        if not resp.is_success:
            log.warning(
                "heartbeat failed: controller returned %s",
                answers.status_line(resp),
                extra={"action": "heartbeat"},
            )
            return False
        return True

    # ---- poll loop ---------------------------------------------------------------

    async def _poll_loop(self) -> None:
        """Long-poll forever; errors back off 2 s, quick idle polls leave 250 ms (§6)."""
        wait = durations.render_duration(self.config.poll_wait)
        while True:
            asked = self.clock.monotonic()
            started = await self.poll_once(wait)
            if started is None:
                await asyncio.sleep(POLL_ERROR_BACKOFF)
            elif started == 0:
                took = self.clock.monotonic() - asked
                await self.maybe_reregister()  # WRK-062: before the idle gap
                gap = self.idle_gap(took)
                if gap > 0:
                    await asyncio.sleep(gap)

    def idle_gap(self, took: float) -> float:
        """The pause after a poll that started nothing and came back after ``took`` s.

        EXT-FAST-4 (refines WRK-062): at least ``IDLE_POLL_GAP`` only when the poll came
        back in less than half the wait it asked for (a controller or proxy answering at
        once, the case the pause exists for); a long poll that waited out its term is
        re-issued at once, or a device freed just as it ended would wait for nothing.
        """
        return IDLE_POLL_GAP if took < self.config.poll_wait / 2 else 0.0

    async def maybe_reregister(self) -> bool:
        """Register again if it is owed, due, and safe right now (WRK-150..153).

        Safe means nothing is supervised (registration reaps whatever the controller
        thinks runs here; declining for that is silent) and the outbox is empty
        (registration would mark those jobs lost, EXT-OUTBOX-3; its delivery tasks are
        already at work, so the debt simply waits for a later idle poll). Returns
        whether a registration succeeded.
        """
        now = self.clock.monotonic()
        if self._jobs or not self.contact.due(now):
            return False
        if not self._box.empty:
            log.debug(
                "re-registration waits for %d outbox report(s)",
                len(self._box),
                extra={"action": "reregister_wait"},
            )
            return False
        self.contact.attempting(now)
        log.info("re-registering with the controller", extra={"action": "reregister"})
        try:
            await self.register()
        except RegisterError as exc:
            log.warning(
                "re-registration failed: %s; retrying in %s at the earliest",
                exc,
                durations.render_duration(reconnect.REREGISTER_RETRY),
                extra={"action": "reregister"},
            )
            return False
        return True

    async def poll_once(self, wait: str) -> int | None:
        """One poll; the number of jobs it started, or ``None`` after a poll error."""
        path = f"/v1/workers/{self._worker_id}/assignments"
        try:
            resp = await self._request("GET", path, params={"wait": wait})
        except answers.TRANSPORT_ERRORS as exc:
            log.warning("poll failed: %s", answers.error_text(exc), extra={"action": "poll"})
            return None
        if resp.status_code == 204:
            return 0
        if resp.status_code != 200:
            log.warning(
                "poll failed: controller returned %s",
                answers.status_line(resp),
                extra={"action": "poll"},
            )
            return None
        try:
            assignments, kills = parse_poll_body(resp.content)
        except ValueError as exc:
            log.warning("poll failed: undecodable answer: %s", exc, extra={"action": "poll"})
            return None
        return self._dispatch(assignments, kills)

    def _dispatch(self, assignments: list[wire.Assignment], kills: list[str]) -> int:
        """Deliver kills, then accept assignments (WRK-065, WRK-066, WRK-070).

        Synchronous on purpose: every job enters the supervised set and the shutdown
        tracker before the poll loop can be interrupted.
        """
        for job_id in kills:
            job = self._jobs.get(job_id)
            if job is not None:
                job.cancel.set()  # idempotent: a re-delivered kill changes nothing
        killed = set(kills)
        started = 0
        for a in assignments:
            if a.job_id in self._seen:
                continue  # re-delivered: a job runs at most once per process
            self._seen.add(a.job_id)
            if a.job_id in killed:
                # Queued here, synchronously, so the outbox is never empty while this
                # report is owed (a re-registration would reap the job as lost).
                body = self._status_body(a, JobState.KILLED.value, reason=REASON_PREKILLED)
                report = self._box.add_status(a.job_id, self._device_ids(a), body)
                self._track(self._submit(report), a.job_id)
                continue
            job = _Job(a)
            if self._shutting_down:
                job.cancel.set()
            self._jobs[a.job_id] = job
            self._track(self._run_job(job), a.job_id)
            started += 1
        return started

    # ---- one job -----------------------------------------------------------------

    @staticmethod
    def _device_ids(a: wire.Assignment) -> tuple[str, ...]:
        return (a.device_id,)

    def _status_body(self, a: wire.Assignment, state: str, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"state": state, **extra, "worker_id": self._worker_id}
        if a.lease_epoch:
            body["lease_epoch"] = a.lease_epoch  # EXT-EPOCH-3
        return body

    async def _run_job(self, job: _Job) -> None:
        """WRK-072 for one job (hooks and verify are not done yet)."""
        a = job.assignment
        try:
            log.info(
                "job %s: starting on %s",
                a.job_id,
                a.device_id,
                extra={"action": "job_start", "job_id": a.job_id},
            )
            # Belt and braces only (the controller marked the job running at hand-out),
            # so it must not delay the start: one attempt, in the background (WRK-113).
            running_report = asyncio.create_task(
                self._report_running(a), name=f"running-{a.job_id}"
            )
            shipper = logship.LogShipper(functools.partial(self._append_log, a), label=a.job_id)
            try:
                outcome = await runner.run_job(
                    a,
                    on_output=shipper.write,
                    cancel=job.cancel,
                    clock=self.clock,
                    base_env=self._base_env,
                )
            except asyncio.CancelledError:
                # Abandoned: the runner has SIGKILLed the group; escapees get the same.
                running_report.cancel()
                sweep.kill_now(a.job_id)
                await shipper.abandon()
                raise
            await shipper.close()  # WRK-086: output lands before the outcome
            # WRK-072 step 7: reported and logged, never changing the outcome (WRK-122).
            sweep.log_report(a.job_id, await sweep.sweep(a.job_id))
            await running_report  # never let a late "running" trail the outcome
            extra: dict[str, Any] = {"exit_code": outcome.exit_code}
            if outcome.reason:
                extra["reason"] = outcome.reason
            log.info(
                "job %s: %s (exit %d)%s",
                a.job_id,
                outcome.state.value,
                outcome.exit_code,
                f": {outcome.reason}" if outcome.reason else "",
                extra={"action": "job_end", "job_id": a.job_id},
            )
            body = self._status_body(a, outcome.state.value, **extra)
            report = self._box.add_status(a.job_id, self._device_ids(a), body)
            # From here on the job is pending, no longer running (EXT-OUTBOX-2).
            self._jobs.pop(a.job_id, None)
            await self._submit(report)
        finally:
            self._jobs.pop(a.job_id, None)

    async def _submit(self, report: outbox.Report) -> None:
        """Make a queued report durable, then deliver it (EXT-OUTBOX-1)."""
        await self._box.persist(report)
        await self._deliver(report)

    async def _deliver(self, report: outbox.Report) -> None:
        await outbox.deliver(self._box, report, self._post)

    async def report_fault(self, device_id: str, reason: str, job_id: str = "") -> None:
        """Queue a device fault report (WRK-114) and deliver it in its own tracked task.

        Returns once the report is durable, so a terminal report queued afterwards can
        never reach the disk (or the controller) without it (VERIFY-008, HOOK-012).
        """
        report = self._box.add_fault(device_id, reason, job_id)
        await self._box.persist(report)
        self._track(self._deliver(report), job_id or device_id)

    async def _report_running(self, a: wire.Assignment) -> None:
        """Belt and braces: one attempt, failure only logged (WRK-113)."""
        body = self._status_body(a, JobState.RUNNING.value)
        try:
            resp = await self._request(
                "POST", f"/v1/jobs/{a.job_id}/status", body=body, timeout=outbox.ATTEMPT_TIMEOUT
            )
        except answers.TRANSPORT_ERRORS as exc:
            problem = answers.error_text(exc)
        else:
            if resp.is_success:
                return
            problem = f"controller returned {answers.status_line(resp)}"
        log.warning(
            "job %s: running report failed: %s",
            a.job_id,
            problem,
            extra={"action": "report_running", "job_id": a.job_id},
        )

    async def _append_log(self, a: wire.Assignment, chunk: bytes) -> None:
        """``POST /v1/jobs/{id}/logs`` with raw bytes, epoch echoed (WRK-083, EXT-EPOCH-3a)."""
        params = {"lease_epoch": str(a.lease_epoch)} if a.lease_epoch else None
        resp = await self._request(
            "POST", f"/v1/jobs/{a.job_id}/logs", content=chunk, params=params
        )
        if not resp.is_success:
            raise _LogSendError(f"controller returned {answers.status_line(resp)}")


# ---- as a process --------------------------------------------------------------


async def _serve_until_signal(config: worker_config.WorkerConfig, clock: Clock | None) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    watched = (signal.SIGINT, signal.SIGTERM)

    def first_signal(signum: int) -> None:
        # WRK-003: the handlers go the moment the first signal arrives, so a second
        # one takes the default action and ends the process at once.
        for s in watched:
            loop.remove_signal_handler(s)
            signal.signal(s, signal.SIG_DFL)
        log.info(
            "%s received: shutting down",
            signal.Signals(signum).name,
            extra={"action": "signal"},
        )
        stop.set()

    for s in watched:
        loop.add_signal_handler(s, first_signal, s)
    try:
        await Agent(config, clock).run(stop)
    except StartupError as exc:
        print(f"rc: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        for s in watched:
            loop.remove_signal_handler(s)
    return 0


def run_worker(config: worker_config.WorkerConfig, *, clock: Clock | None = None) -> int:
    """Run the worker in this process until a signal; the process exit status.

    1 when the state directory cannot be used or the first registration fails
    (WRK-002); 0 after a signal-initiated shutdown, even one that had to abandon jobs
    (WRK-004).

    Only this process path reads the end-to-end test hooks (``testhooks``): inside
    ``rc up`` the controller shares the process and owns ``RC_TEST_TIMINGS``.
    """
    try:
        testhooks.apply(os.environ)
    except testhooks.TestHookError as exc:
        print(f"rc: {exc}", file=sys.stderr, flush=True)
        return 1
    return asyncio.run(_serve_until_signal(config, clock))


#: Libraries that log every request at INFO; kept to their warnings (EXT-METRICS-2).
QUIET_LOGGERS = ("httpx", "httpcore")


def _setup_logging() -> None:
    """Readable text on stderr; at the default level, events only (EXT-METRICS-2).

    Registration, a job starting and ending, warnings: not every poll, heartbeat and
    report, so a quiet fleet writes almost nothing.
    """
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def main(config_path: str = worker_config.DEFAULT_PATH) -> int:
    """``rc worker -c PATH``: load the configuration and run; the exit status."""
    _setup_logging()
    try:
        cfg = worker_config.load_config(config_path)
    except worker_config.ConfigError as exc:
        print(f"rc: {exc}", file=sys.stderr, flush=True)
        return 1
    return run_worker(cfg)
