"""One job's life on this worker, step by step (WRK-072): check its GPU names, acquire,
report running, run and supervise, clear stragglers, verify, report, arm the release.

A job on several devices takes the per-device steps for each, in ID order (EXT-GANG);
a job task torn down kills its group and its stragglers on the way out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from resource_controller import wire
from resource_controller.clock import Clock
from resource_controller.core import mig
from resource_controller.core.states import JobState
from resource_controller.worker import (
    attached,
    channel,
    delivery,
    gpusample,
    hooks,
    logship,
    outbox,
    probes,
    recovery,
    runner,
    stragglers,
)
from resource_controller.worker import config as worker_config
from resource_controller.worker import verify as verify_pass
from resource_controller.worker.timings import Timings

log = logging.getLogger(__name__)

REASON_PREKILLED = "killed before this worker started it"
REASON_MIG_CONFLICT = "mig conflict: "
REASON_MIG_UNKNOWN = "mig device unknown: "

Track = Callable[[Coroutine[Any, Any, None], str], None]


@dataclass(eq=False)
class SupervisedJob:
    """One job under supervision: its assignment and its cancellation scope."""

    assignment: wire.Assignment
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    #: ``cancelled`` for a kill flag, the shutdown's own words when the worker stops.
    cancel_reason: str = runner.REASON_CANCELLED
    #: SIGTERM to SIGKILL for its kill flag, when the controller named one; else ``kill_grace``.
    kill_grace: float | None = None
    epochs: dict[str, int] = field(default_factory=dict)
    mig_uuids: dict[str, str] = field(default_factory=dict)
    gpu: dict[str, Any] = field(default_factory=dict)

    @property
    def job_id(self) -> str:
        return self.assignment.job_id

    @property
    def device_ids(self) -> tuple[str, ...]:
        return runner.device_ids_of(self.assignment)

    @property
    def submitter(self) -> str:
        return self.assignment.submitter or ""


class Lifecycle:
    """Runs jobs from acquisition to release, and owns the set of supervised jobs."""

    def __init__(
        self,
        *,
        to_controller: channel.Channel,
        box: outbox.Outbox,
        clock: Clock,
        timings: Timings,
        track: Track,
        config: worker_config.WorkerConfig,
        base_env: Mapping[str, str] = os.environ,
        gpus: probes.Prober | None = None,
        journal: recovery.Journal | None = None,
    ) -> None:
        self.channel = to_controller
        self.box = box
        self.clock = clock
        self.timings = timings
        self._track = track
        self.config = config
        self.base_env = base_env
        #: The host's GPUs as probed, and the recovery journal; ``None``: not kept.
        self.gpus = gpus
        self.journal = journal
        self.hooks = hooks.Hooks(
            config,
            clock=clock,
            timings=timings,
            base_env=base_env,
            mig_uuids=gpus.mig_uuids if gpus is not None else dict,
        )
        #: Each device's labels, declared and detected: what GPU sampling names it by.
        self.declared = {d.name: dict(d.labels) for d in config.devices}
        self.detected: Mapping[str, Mapping[str, str]] = {}
        self.sample_run: probes.RunProbe = functools.partial(
            probes.run_probe, grace=timings.kill_grace
        )
        #: Jobs from before their acquire step until their terminal report is queued.
        self.jobs: dict[str, SupervisedJob] = {}

    def admit(self, assignment: wire.Assignment, *, cancelled: bool = False) -> SupervisedJob:
        """Enter the supervised set; the caller starts ``run`` at once."""
        job = SupervisedJob(assignment)
        if cancelled:
            job.cancel.set()
        self.jobs[assignment.job_id] = job
        return job

    async def run(self, job: SupervisedJob) -> None:
        """Every step of WRK-072 for one job, in order."""
        log.info(
            "job %s: starting on %s",
            job.job_id,
            ",".join(job.device_ids),
            extra={"action": "job_start", "job_id": job.job_id},
        )
        if self.journal is not None:
            self.journal.started(job.job_id)  # before a hook or the job carries its ID
        try:
            refused = await self.check_gpus(job)
            if refused:
                log.error(
                    "job %s: %s",
                    job.job_id,
                    refused,
                    extra={"action": "mig_refused", "job_id": job.job_id},
                )
                await self.end_unrun(job, JobState.FAILED, refused)
                return
            if not await self.acquire(job):
                return
            running = asyncio.create_task(self.report_running(job), name=f"running-{job.job_id}")
            output = self.output_of(job)
            sampler = self.sampler(job)
            try:
                outcome = await self.run_process(job, output)
            except asyncio.CancelledError:
                # Torn down: the runner SIGKILLed the group; escapees get the same at
                # once, and the output still buffered is dropped.
                running.cancel()
                stragglers.kill_now(job.job_id)
                await output.abandon()
                raise
            finally:
                # At once, never waiting for a reading in flight.
                job.gpu = sampler.stop() if sampler is not None else {}
            if outcome.reason == runner.REASON_CANCELLED:
                outcome = dataclasses.replace(outcome, reason=job.cancel_reason)
            await self.finish(job, outcome, output, running)
            await self.release(job)
        finally:
            self.jobs.pop(job.job_id, None)

    async def finish(
        self,
        job: SupervisedJob,
        outcome: runner.Outcome,
        output: logship.LogShipper,
        running: asyncio.Task[None],
    ) -> None:
        """Flush and sweep at once, verify, report; with verify work the report is queued
        only after the pass, so a fault it finds is ordered first (VERIFY-008)."""
        if not self.verify_has_work():
            report = self.queue_report(job, outcome)
            await asyncio.gather(
                output.close(), self.clear_stragglers(job), self.box.persist(report)
            )
            await running  # never let a late "running" trail the outcome
            await self.deliver(report)
            return
        await asyncio.gather(output.close(), self.clear_stragglers(job))
        await running
        for device_id in job.device_ids:
            await self.verify(job, device_id)
        await self.submit(self.queue_report(job, outcome))

    async def check_gpus(self, job: SupervisedJob) -> str:
        """Why the job must not run on its devices, ``""`` when it may; fills ``mig_uuids``."""
        names = [d.partition(":")[2] for d in job.device_ids]
        if self.gpus is None or not any(mig.parse(n) is not None for n in names):
            return ""
        instances = [n for n in names if mig.is_instance(n)]
        listed = self.gpus.inventory
        if instances:
            listed = await self.gpus.relist() or listed
        for name in names:
            why = listed.conflict(name) if listed is not None else ""
            if why:
                return f"{REASON_MIG_CONFLICT}{name}: {why}"
        for name in instances:
            found = listed.instance(name) if listed is not None else None
            if found is None:
                return f"{REASON_MIG_UNKNOWN}{name}: nvidia-smi -L does not list it"
            job.mig_uuids[name] = found.uuid
        return ""

    async def acquire(self, job: SupervisedJob) -> bool:
        """Every device before the job touches one; ``False``: reported, must not run (HOOK-012)."""
        a = job.assignment
        for device_id in job.device_ids:
            got = await self.hooks.acquire(device_id, a.job_id, job.submitter, job.cancel)
            if isinstance(got, int):
                job.epochs[device_id] = got
                continue
            await self.release(job)
            if not got.cancelled:
                log.error(
                    "job %s: %s",
                    a.job_id,
                    got.reason,
                    extra={"action": "acquire_failed", "job_id": a.job_id},
                )
                await self.report_fault(device_id, got.reason, a.job_id)
            state = JobState.KILLED if got.cancelled else JobState.FAILED
            await self.end_unrun(job, state, got.reason)
            return False
        return True

    async def end_unrun(self, job: SupervisedJob, state: JobState, reason: str) -> None:
        """Report a job that never ran: nothing of it is left, no exit code."""
        body = self.status_body(state, job.assignment, reason=reason)
        report = self.box.add_status(job.job_id, job.device_ids, body)
        self.jobs.pop(job.job_id, None)
        self.ended(job)
        await self.submit(report)

    async def report_running(self, job: SupervisedJob) -> None:
        """One attempt, failure only logged (WRK-113): the controller marked it at hand-out."""
        body = self.status_body(JobState.RUNNING, job.assignment)
        timeout = self.timings.report_attempt_timeout
        if problem := await self.channel.report_running(job.job_id, body, timeout):
            log.warning(
                "job %s: running report failed: %s",
                job.job_id,
                problem,
                extra={"action": "report_running", "job_id": job.job_id},
            )

    def status_body(self, state: JobState, a: wire.Assignment, **fields: Any) -> dict[str, Any]:
        return channel.status_body(
            self.channel.worker_id, state.value, lease_epoch=a.lease_epoch, **fields
        )

    def output_of(self, job: SupervisedJob) -> logship.LogShipper:
        """The job's output into log appends; what is not taken goes through the outbox."""
        a = job.assignment
        return logship.LogShipper(
            functools.partial(self.channel.append_log, a.job_id, lease_epoch=a.lease_epoch),
            functools.partial(self.keep_output, a),
            label=a.job_id,
            flush_after=self.timings.log_flush_after,
        )

    async def keep_output(self, a: wire.Assignment, chunk: bytes) -> asyncio.Event:
        """Durable in the outbox, delivered in order and before the terminal report."""
        report = self.box.add_log(a.job_id, chunk, a.lease_epoch)
        await self.box.persist(report)
        self._track(self.deliver(report), a.job_id)
        return report.gone

    def sampler(self, job: SupervisedJob) -> gpusample.Sampler | None:
        """Started sampling of the job's GPUs (EXT-ACCT-1); ``None`` when off or no GPU."""
        interval = self.config.gpu_sample_interval
        if interval <= 0:
            return None

        def labels(name: str) -> dict[str, str]:
            return {**self.declared.get(name, {}), **self.detected.get(name, {})}

        targets = gpusample.targets_of(job.device_ids, labels)
        if not targets:
            return None
        sampler = gpusample.Sampler(
            job.job_id,
            targets,
            interval=interval,
            timeout=self.config.probe_timeout,
            run=self.sample_run,
        )
        sampler.start()
        return sampler

    async def run_process(self, job: SupervisedJob, output: logship.LogShipper) -> runner.Outcome:
        """Spawn and supervise (§8), an attached job through its relay."""
        a = job.assignment
        if attached.is_attached(a):
            return await attached.run(
                a,
                to_controller=self.channel,
                on_log=output.write,
                cancel=job.cancel,
                clock=self.clock,
                timings=self.timings,
                base_env=self.base_env,
                mig_uuids=job.mig_uuids,
            )
        started = await runner.start_job(
            a, clock=self.clock, base_env=self.base_env, mig_uuids=job.mig_uuids
        )
        if isinstance(started, runner.Outcome):
            return started
        return await runner.supervise_job(
            a,
            started,
            on_output=output.write,
            cancel=job.cancel,
            clock=self.clock,
            timings=self.timings,
            kill_grace=lambda: job.kill_grace,
        )

    async def clear_stragglers(self, job: SupervisedJob) -> None:
        """End escapees carrying the job's ``RC_JOB_ID``: reported, never the outcome."""
        report = await stragglers.clear(job.job_id, self.timings)
        stragglers.log_report(job.job_id, report)
        if report.clean:
            self.ended(job)

    def ended(self, job: SupervisedJob) -> None:
        """Nothing carrying the job's ID is left: it no longer withholds a recovery proof."""
        if self.journal is not None:
            self.journal.ended(job.job_id)

    async def verify(self, job: SupervisedJob, device_id: str) -> None:
        """A failure is the device's fault, durable before the terminal report (VERIFY-008)."""
        cfg = self.config
        result = await verify_pass.verify_pass(
            cfg.verify_dir,
            device_id=device_id,
            job_id=job.job_id,
            submitter=job.submitter,
            timeout=cfg.verify_timeout,
            budget=cfg.verify_pass_budget,
            clock=self.clock,
            timings=self.timings,
            base_env=self.base_env,
            mig_uuids=job.mig_uuids,
        )
        if result.clean:
            return
        log.error(
            "device %s: job %s: %s",
            device_id,
            job.job_id,
            result.reason,
            extra={"action": "verify_failed", "job_id": job.job_id},
        )
        await self.report_fault(device_id, result.reason, job.job_id)

    def verify_has_work(self) -> bool:
        """A non-directory entry in verify_dir; an unreadable one is work (a failure to report)."""
        try:
            return bool(verify_pass.script_names(self.config.verify_dir))
        except FileNotFoundError:
            return False
        except OSError:
            return True

    def queue_report(self, job: SupervisedJob, outcome: runner.Outcome) -> outbox.Report:
        """Put the terminal report in the outbox (in memory); the job is then pending."""
        a = job.assignment
        log.info(
            "job %s: %s (exit %d)%s",
            a.job_id,
            outcome.state.value,
            outcome.exit_code,
            f": {outcome.reason}" if outcome.reason else "",
            extra={"action": "job_end", "job_id": a.job_id},
        )
        body = self.status_body(
            outcome.state, a, exit_code=outcome.exit_code, reason=outcome.reason, gpu=job.gpu
        )
        report = self.box.add_status(a.job_id, job.device_ids, body)
        self.jobs.pop(a.job_id, None)
        return report

    async def release(self, job: SupervisedJob) -> None:
        """Arm each acquired device's release with this job's acquire epoch (HOOK-020)."""
        for device_id, epoch in job.epochs.items():
            await self.hooks.release(device_id, epoch, job.job_id, job.submitter)

    def report_prekilled(self, assignment: wire.Assignment) -> None:
        """Killed, nothing ran (WRK-066); queued at once, so the outbox is never empty while
        it is owed (a re-registration would reap the job as lost)."""
        body = self.status_body(JobState.KILLED, assignment, reason=REASON_PREKILLED)
        report = self.box.add_status(assignment.job_id, runner.device_ids_of(assignment), body)
        self._track(self.submit(report), assignment.job_id)

    async def report_fault(self, device_id: str, reason: str, job_id: str = "") -> None:
        """Returns once the fault is durable: a terminal report queued later never overtakes it."""
        report = self.box.add_fault(device_id, reason, job_id)
        await self.box.persist(report)
        self._track(self.deliver(report), job_id or device_id)

    async def submit(self, report: outbox.Report) -> None:
        await self.box.persist(report)
        await self.deliver(report)

    async def deliver(self, report: outbox.Report) -> None:
        await delivery.deliver(self.box, report, self.channel, self.timings)
