"""The worker agent: one process's life: start, register, heartbeat, poll, shut down.

What the previous run left in the outbox is delivered before registering, which would
reap those jobs as lost (WRK-040); each polled job runs in a ``lifecycle`` task of its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Mapping
from typing import Any, NamedTuple

from resource_controller import wire
from resource_controller.clock import Clock, SystemClock
from resource_controller.core import durations
from resource_controller.h1 import aio
from resource_controller.worker import (
    channel,
    labelsources,
    lifecycle,
    outbox,
    probes,
    procs,
    reconnect,
    runner,
    sheets,
)
from resource_controller.worker import config as worker_config
from resource_controller.worker import recovery as recovery_proof
from resource_controller.worker.channel import RegisterError, StartupError
from resource_controller.worker.tasks import Tracker, background, wait_or_stop
from resource_controller.worker.timings import DEFAULT, Timings

__all__ = ["Agent", "RegisterError", "StartupError"]

log = logging.getLogger(__name__)


class HostFacts(NamedTuple):
    """What a registration or a push reports beyond the configuration: one pass, one read."""

    labels: labelsources.LabelsPayload
    sheets: sheets.Sheets


class Agent:
    """One worker process's conversation with the controller."""

    def __init__(
        self,
        config: worker_config.WorkerConfig,
        clock: Clock | None = None,
        *,
        connect: aio.Connect = aio.open_tcp,
        base_env: Mapping[str, str] | None = None,
        rng: random.Random | None = None,
        timings: Timings = DEFAULT,
    ) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.timings = timings
        self.contact = reconnect.Reconnect(rng, timings)
        self.channel = channel.Channel(
            config.controller_url,
            config.token,
            self.clock,
            self.contact,
            connect=connect,
            timings=timings,
        )
        #: The outbox, the recovery journal and each job's life: built by ``run``.
        self.outbox: outbox.Outbox | None = None
        self.journal: recovery_proof.Journal | None = None
        self.life: lifecycle.Lifecycle | None = None
        self._base_env = os.environ if base_env is None else base_env
        #: Every (job, lease epoch) this process started or pre-killed; never pruned.
        self._seen: set[tuple[str, int | None]] = set()
        self._declined: set[str] = set()  #: re-offered jobs this process had
        self._tasks = Tracker()
        self._shutting_down = False
        #: The jobs the shutdown cancelled, for whoever stopped this worker to report.
        self.stopped_jobs: list[str] = []
        #: With ``devices: auto``, what the latest registration's pass found.
        self.devices: tuple[worker_config.DeviceConfig, ...] = config.devices
        self.prober = probes.Prober(
            [d.name for d in config.devices],
            config.probe_dir,
            config.probe_timeout,
            clock=self.clock,
            timings=timings,
        )
        #: Held around a pass and its request: registrations and pushes never overlap.
        self._facts_lock = asyncio.Lock()

    @property
    def worker_id(self) -> str:
        return self.channel.worker_id

    @property
    def supervised_job_ids(self) -> list[str]:
        """The jobs supervised whose outcome is not yet in the outbox."""
        pending = set(self.pending_job_ids)
        jobs = self.life.jobs if self.life is not None else {}
        return [j for j in jobs if j not in pending]

    @property
    def pending_job_ids(self) -> list[str]:
        """Finished jobs whose terminal report waits in the outbox."""
        return self.outbox.pending_job_ids() if self.outbox is not None else []

    @property
    def _life(self) -> lifecycle.Lifecycle:
        assert self.life is not None, "the agent is not running"
        return self.life

    async def run(self, stop: asyncio.Event) -> None:
        """Start, serve until ``stop`` is set, then shut down (§12); ``StartupError`` when
        the state directory or the first registration fails (WRK-002)."""
        fresh = not os.path.isdir(self.config.state_dir)
        try:
            box = outbox.Outbox.open(self.config.state_dir, self.clock)
        except outbox.OutboxError as exc:
            raise StartupError(str(exc)) from exc
        self.outbox = box
        self.journal = recovery_proof.Journal.open(self.config.state_dir, fresh=fresh)
        self.life = lifecycle.Lifecycle(
            to_controller=self.channel,
            box=box,
            clock=self.clock,
            timings=self.timings,
            track=self._tasks.track,
            base_env=self._base_env,
            config=self.config,
            gpus=self.prober,
            journal=self.journal,
        )
        # A job whose outcome the previous run left here must never run again.
        self._seen.update(box.pending_attempts())
        try:
            async with self.channel.open():
                try:
                    if not await self._deliver_leftovers(stop):
                        return
                    registering = await wait_or_stop(self.register(), stop, "register")
                    if registering is None:
                        return
                    registering.result()  # raises RegisterError
                    await self._serve(stop)
                finally:
                    await self._tasks.abandon(self.timings.abandon_wait)
                    await self._life.hooks.close()
        finally:
            if not box.empty:
                log.warning(
                    "%d report(s) not delivered stay in %s and are re-sent at the next start",
                    len(box),
                    box.directory,
                    extra={"action": "outbox_kept"},
                )
            box.close()

    async def _deliver_leftovers(self, stop: asyncio.Event) -> bool:
        """Deliver the previous run's reports (EXT-OUTBOX-3), heartbeating under the worker
        ID they carry so their jobs stay pending; ``False`` if ``stop`` came first."""
        box = self._life.box
        if box.empty:
            return True
        log.info(
            "delivering %d report(s) from the previous run before registering",
            len(box),
            extra={"action": "outbox_resend"},
        )
        for report in box.reports():
            self._tasks.track(self._life.deliver(report), report.job_id or report.device_id)
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
            self.channel.worker_id = recorded
            heartbeat = background(self._heartbeat_loop(), "heartbeat")
        try:
            return await wait_or_stop(box.emptied.wait(), stop, "outbox-drain") is not None
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
                await asyncio.gather(heartbeat, return_exceptions=True)

    async def _serve(self, stop: asyncio.Event) -> None:
        heartbeat = background(self._heartbeat_loop(), "heartbeat")
        probing = background(self._probe_loop(), "probe")
        poll = background(self._release_then_poll(), "poll")
        stopping = asyncio.create_task(stop.wait(), name="stop-wait")
        try:
            await asyncio.wait(
                {stopping, poll, heartbeat, probing}, return_when=asyncio.FIRST_COMPLETED
            )
            if not stop.is_set():
                log.error("a worker loop ended on its own; shutting down")
        finally:
            await self._shutdown(poll, heartbeat, probing, stopping)

    async def _release_then_poll(self) -> None:
        """One task, so that shutdown cancels a start-up release pass still running."""
        await self._life.hooks.startup_pass()
        await self._poll_loop()

    async def _shutdown(self, *loops: asyncio.Task[Any]) -> None:
        """Stop the loops, cancel every job, wait a bounded time, fire armed releases."""
        self._shutting_down = True
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        self.stopped_jobs = list(self._life.jobs)
        for job in self._life.jobs.values():
            job.cancel_reason = runner.REASON_SHUTDOWN
            job.cancel.set()
        await self._tasks.wait(self.timings.shutdown_wait, self.timings.abandon_wait)
        await self._life.hooks.drain()

    async def gather_facts(self, *, registering: bool = False) -> HostFacts:
        """One probe pass and a fresh read of the sheets, under ``_facts_lock``; registering
        with ``devices: auto``, the pass decides the devices (``RegisterError`` for none)."""
        discover = registering and self.config.devices_auto
        found = await self.prober.run_pass(discover=discover)
        if discover:
            self._take_discovered()
        if self.life is not None:
            # What GPU sampling names a device by; one this pass could not confirm keeps
            # what was found before.
            before = self.life.detected
            self.life.detected = {
                name: {**before.get(name, {}), **facts} if name in found.unconfirmed else facts
                for name, facts in found.devices.items()
            }
        names = [d.name for d in self.devices]
        read = await asyncio.to_thread(sheets.read_sheets, self.config.sheet_dir, names)
        return HostFacts(found.labels, read)

    def _take_discovered(self) -> None:
        listed = self.prober.inventory
        if listed is None or not listed.gpus:
            raise RegisterError(
                "devices: auto: nvidia-smi lists no GPU"
                + ("" if listed is not None else " (not found, or it failed: see above)")
            )
        names = self.prober.device_names
        self.devices = tuple(
            worker_config.DeviceConfig(
                name=n,
                timeout=self.config.hooks.timeout,
                release_linger=self.config.hooks.release_linger,
            )
            for n in names
        )

    def _layout_changed(self) -> None:
        """``devices: auto``: owe a re-registration when nvidia-smi lists other devices."""
        listed = self.prober.inventory
        if not self.config.devices_auto or listed is None or not listed.gpus:
            return
        now = listed.device_names()
        if now != [d.name for d in self.devices]:
            self.contact.arm(
                self.clock.monotonic(), "devices: auto: nvidia-smi lists " + ", ".join(now)
            )

    def _facts(self, facts: HostFacts) -> dict[str, Any]:
        """The fields a registration and a labels push share (WRK-043, WRK-044)."""
        return {
            "host": self.config.host,
            "labels": facts.labels,
            "declared_labels": {d.name: dict(d.labels) for d in self.devices},
            "sheet": facts.sheets.sheet,
            "device_sheets": facts.sheets.device_sheets,
        }

    def registration(
        self, facts: HostFacts, proof: recovery_proof.Claims | None = None
    ) -> wire.RegisterRequest:
        """What ``POST /v1/workers/register`` says (WRK-043)."""
        return wire.RegisterRequest(
            boot_id=procs.boot_id(),
            recovery=wire.RecoveryProof.model_validate(proof) if proof else None,
            devices=[
                wire.DeviceDecl(name=d.name, max_runtime_seconds=d.max_runtime_seconds or None)
                for d in self.devices
            ],
            **self._facts(facts),
        )

    def labels_push(self, facts: HostFacts) -> wire.LabelsPush:
        """What ``POST /v1/workers/{id}/labels`` says (PROBE-050)."""
        return wire.LabelsPush(devices=[d.name for d in self.devices], **self._facts(facts))

    async def _proof(self) -> recovery_proof.Claims:
        """Claimed only while nothing is supervised (WRK-046): the scan would find the job."""
        if self._life.jobs or self.journal is None:
            return {}
        return await asyncio.to_thread(
            recovery_proof.compute, self.config.require_manual_clear, self.journal
        )

    async def register(self) -> str:
        """Register and settle any re-registration debt; ``RegisterError`` on any failure."""
        proof = await self._proof()
        async with self._facts_lock:
            request = self.registration(await self.gather_facts(registering=True), proof)
            worker_id = await self.channel.register(request)
        self.contact.settled()
        log.info(
            "registered as worker %s (host %s, %d device(s): %s)",
            worker_id,
            self.config.host,
            len(self.devices),
            ", ".join(d.name for d in self.devices),
            extra={"action": "registered"},
        )
        return worker_id

    async def _probe_loop(self) -> None:
        """Counted from the end of the last push, so passes never pile up (PROBE-002)."""
        while True:
            await asyncio.sleep(self.config.probe_interval)
            await self.push_facts()

    async def push_facts(self) -> bool:
        """One pass pushed on the labels route, never the registration's (PROBE-050)."""
        async with self._facts_lock:
            request = self.labels_push(await self.gather_facts())
            problem = await self.channel.push_labels(request)
            self._layout_changed()
        if problem:
            log.warning("labels push failed: %s", problem, extra={"action": "labels_push"})
        return not problem

    async def _heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.config.heartbeat_interval
        next_at = loop.time() + interval
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            # Ticks keep their schedule; a slow heartbeat skips ticks, never bunches them.
            next_at += interval * max(1, int((loop.time() - next_at) // interval) + 1)
            await self.heartbeat()

    async def heartbeat(self) -> bool:
        """One heartbeat naming the running and pending jobs (WRK-050..052)."""
        problem = await self.channel.heartbeat(self.supervised_job_ids, self.pending_job_ids)
        if problem:
            log.warning("heartbeat failed: %s", problem, extra={"action": "heartbeat"})
        return not problem

    # ---- poll loop -------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        """Long-poll forever; quick idle polls leave 250 ms (§6), and a poll error backs
        off 2 s: with several controllers, only once each of them failed it in turn."""
        while True:
            asked = self.clock.monotonic()
            started = await self.poll_once(self.config.poll_wait)
            if started is None:
                await asyncio.sleep(self.timings.poll_error_backoff)
            elif started == 0:
                took = self.clock.monotonic() - asked
                await self.maybe_reregister()  # Before the idle gap
                gap = self.idle_gap(took)
                if gap > 0:
                    await asyncio.sleep(gap)

    def idle_gap(self, took: float) -> float:
        """The pause after a poll that started nothing and came back after ``took`` s:
        ``idle_poll_gap`` only when it came back in under half its wait (EXT-FAST-4)."""
        return self.timings.idle_poll_gap if took < self.config.poll_wait / 2 else 0.0

    async def maybe_reregister(self) -> bool:
        """Register again if owed, due and safe: nothing supervised (WRK-150, silently)
        and the outbox empty (EXT-OUTBOX-3); whether a registration succeeded."""
        now = self.clock.monotonic()
        if self._life.jobs or not self.contact.due(now):
            return False
        box = self._life.box
        if not box.empty:
            log.debug(
                "re-registration waits for %d outbox report(s)",
                len(box),
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
                durations.render_duration(self.timings.reregister_retry),
                extra={"action": "reregister"},
            )
            return False
        return True

    async def poll_once(self, wait: float) -> int | None:
        """One poll; the number of jobs it started, or ``None`` after a poll error."""
        have = {*self._life.jobs, *self.pending_job_ids, *self._declined}
        answer = await self.channel.poll(wait, sorted(have))
        if isinstance(answer, str):
            log.warning("poll failed: %s", answer, extra={"action": "poll"})
            return None
        return self._dispatch(answer)

    def _dispatch(self, answer: channel.PollAnswer) -> int:
        """Deliver kills, then accept assignments (WRK-065..067, WRK-070); synchronous,
        so every job is tracked before the poll loop can be interrupted."""
        life = self._life
        for job_id in answer.kills:
            job = life.jobs.get(job_id)
            if job is not None:
                own = getattr(answer.kills, "grace", {})  # a preemption's (EXT-PREEMPT-2)
                job.kill_grace = own.get(job_id, job.kill_grace)
                job.cancel.set()  # idempotent: a re-delivered kill changes nothing
        killed = set(answer.kills)
        started = 0
        for a in answer.assignments:
            # By lease epoch: a retried job (EXT-RETRY-2) comes back as a new lease.
            attempt = (a.job_id, a.lease_epoch)
            if attempt in self._seen:
                # Re-delivered: a job runs at most once per process. One it no longer
                # has (its report refused for good) is named in every poll from now on.
                if a.job_id not in life.jobs and a.job_id not in self.pending_job_ids:
                    self._declined.add(a.job_id)
                continue
            self._seen.add(attempt)
            self._declined.discard(a.job_id)
            if a.job_id in killed:
                life.report_prekilled(a)
                continue
            job = life.admit(a, cancelled=self._shutting_down)
            self._tasks.track(life.run(job), a.job_id)
            started += 1
        return started
