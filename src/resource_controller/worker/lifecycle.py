"""One job's life on this worker, step by step.

``Lifecycle.run`` is the whole story of a job, in order:

0. **GPUs**: a job on a MIG instance gets its UUID from a
   fresh ``nvidia-smi -L`` (instances may have been created again since the last
   probe pass); a job on a device whose name conflicts with its GPU's MIG mode, or on
   an instance whose UUID nobody can tell, never runs: it ends ``failed`` with the
   reason, before any hook touches the device;
1. **acquire** the device: the acquire hook, inside the job's cancellation scope
  . On failure the job never runs: the fault is reported, then
   the job ``failed`` with ``acquire hook failed: ...``; interrupted by its
   own cancellation, the job is ``killed`` and nothing is faulted;
2. **report running**: one attempt, in the background;
3. **start**: the environment, the command, the spawn (``runner.start_job``); an
   attached job (``tty``, ``pipe``) first opens its relay streams (``attached``);
4. **supervise**: watchdogs, the cancellation path, output batched into log appends
   (``runner.supervise_job``, ``logship``), then the final flush; meanwhile
   the job's GPU devices are sampled in the background (``gpusample``),
   and the sampler is stopped, never waited for, the moment the process is over: its
   figures ride with the outcome;
5. **stragglers**: end escapees still carrying the job's ``RC_JOB_ID`` (``stragglers``),
   logged, never changing the outcome; this overlaps the final flush;
6. **verify** the device (``verify``, VERIFY-): on failure the device fault is reported
   (durable, and ordered before the terminal report by the outbox) so that the
   controller takes the device out of the pool before it frees it; the job's own
   outcome is unchanged;
7. **report** the outcome: queued in the outbox (the job is then *pending*, no longer
   *running*), made durable, delivered until the controller answers for
   good; with no verify script to run, it is queued and written while
   steps 4-5 end, and only its delivery waits for them;
8. **release** the device: the release is armed with this job's acquire epoch and
   runs after the device's linger (``hooks``);
9. leave the supervised set.

A job on several devices takes the per-device steps for each of its
devices, in ascending ID order: every acquire hook (a failure faults that device, the
ones already acquired are released, and the job fails), every verify pass (a failure
quarantines that device alone) and every release.

Holds take exactly the same steps. Only the job's cancellation scope (a kill
flag, a watchdog, shutdown) interrupts steps 1 and 3-4; steps 4-8 are never cut short
by shutdown, which only *asks* a job to stop. A job task that is itself torn
down (the shutdown window expired) kills its group and its stragglers on the way out.

Reports outside a job's run live here too: the terminal report of a job killed before
it started and device fault reports, both through the outbox.
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

#: A configuration with no device hooks, for a lifecycle built without one.
_NO_DEVICES = worker_config.WorkerConfig(controller_url="")

REASON_PREKILLED = "killed before this worker started it"
#: A job refused because a device's name conflicts with its GPU's MIG mode.
REASON_MIG_CONFLICT = "mig conflict: "
#: A job refused because a MIG instance's UUID is unknown.
REASON_MIG_UNKNOWN = "mig device unknown: "

#: Starts a job-side task and registers it with the shutdown tracker.
Track = Callable[[Coroutine[Any, Any, None], str], None]


@dataclass(eq=False)
class SupervisedJob:
    """One job under supervision: its assignment and its cancellation scope."""

    assignment: wire.Assignment
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    #: What a cancellation is reported as: ``cancelled`` for a kill flag, the shutdown's
    #: own words when the worker is stopping, so the job's owner learns which it was.
    cancel_reason: str = runner.REASON_CANCELLED
    #: Each device's acquire epoch, which its release must match.
    epochs: dict[str, int] = field(default_factory=dict)
    #: The MIG UUID of each of its devices that is a MIG instance.
    mig_uuids: dict[str, str] = field(default_factory=dict)
    #: What its GPUs did while it ran, the terminal report's fields.
    gpu: dict[str, Any] = field(default_factory=dict)

    @property
    def job_id(self) -> str:
        return self.assignment.job_id

    @property
    def device_ids(self) -> tuple[str, ...]:
        """Every device of the job; a controller that sends no list means one."""
        return device_ids_of(self.assignment)

    @property
    def submitter(self) -> str:
        return self.assignment.submitter or ""


def device_ids_of(assignment: wire.Assignment) -> tuple[str, ...]:
    """The assignment's devices: its ``device_ids``, or its one ``device_id``."""
    return tuple(assignment.device_ids or [assignment.device_id])


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
        base_env: Mapping[str, str] | None = None,
        config: worker_config.WorkerConfig | None = None,
        gpus: probes.Prober | None = None,
        journal: recovery.Journal | None = None,
    ) -> None:
        self.channel = to_controller
        #: Where each job is recorded as this worker's until nothing of it is left, for
        #: the recovery proof; ``None``: not recorded.
        self.journal = journal
        #: What the probes know of the host's GPUs; ``None``: nothing to check.
        self.gpus = gpus
        self.box = box
        self.clock = clock
        self.timings = timings
        self._track = track
        self._base_env = base_env
        #: Where the verify pass looks, and its bounds;
        #: ``None`` turns the pass off (a lifecycle built without a configuration).
        self.verify_dir = config.verify_dir if config is not None else None
        self.verify_timeout = config.verify_timeout if config is not None else 0.0
        self.verify_budget = config.verify_pass_budget if config is not None else 0.0
        #: Every device's hooks and held state (§18); empty without a configuration.
        self.hooks = hooks.Hooks(
            config or _NO_DEVICES,
            clock=clock,
            timings=timings,
            base_env=base_env,
            mig_uuids=gpus.mig_uuids if gpus is not None else None,
        )
        #: GPU sampling while a job runs: its period (0: off), the bound on
        #: each reading, and each device's labels, declared and (``detected``, kept
        #: current by the agent's probe passes) found, which say what ``-i`` names.
        self.gpu_interval = config.gpu_sample_interval if config is not None else 0.0
        self.gpu_timeout = config.probe_timeout if config is not None else 0.0
        self.declared = {d.name: dict(d.labels) for d in config.devices} if config else {}
        self.detected: Mapping[str, Mapping[str, str]] = {}
        self.sample_run: probes.RunProbe = functools.partial(
            probes.run_probe, grace=timings.kill_grace
        )
        #: Jobs under supervision whose outcome is not queued yet, in start order
        #:. A job enters before its acquire step and leaves the moment its
        #: terminal report is queued.
        self.jobs: dict[str, SupervisedJob] = {}

    def admit(self, assignment: wire.Assignment, *, cancelled: bool = False) -> SupervisedJob:
        """Enter the supervised set; the caller starts ``run`` at once."""
        job = SupervisedJob(assignment)
        if cancelled:
            job.cancel.set()
        self.jobs[assignment.job_id] = job
        return job

    # ---- the story of one job --------------------------------------------------------

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
                await self.refuse(job, refused)
                return
            if not await self.acquire(job):
                return
            running = asyncio.create_task(self.report_running(job), name=f"running-{job.job_id}")
            output = self.output_of(job)
            sampler = self.sampler(job)
            try:
                if attached.is_attached(job.assignment):
                    outcome = await self.run_attached(job, output)
                else:
                    started = await self.start(job)
                    outcome = await self.supervise(job, started, output)
            except asyncio.CancelledError:
                await self.abandon(job, running, output)
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
        """Steps 6-10 of WRK-072 once the process is over: flush, sweep, verify, report.

        The final flush and the sweep overlap: one waits on the controller, the other
        reads ``/proc``, and neither sends anything the other must precede. Both end
        before the outcome is delivered. When the verify directory
        holds nothing to run, the pass is clean whenever it would run, so the report
        is queued and written to disk meanwhile, and only its delivery waits; with
        scripts present, the pass runs after the sweep and before the report is
        queued, so a fault it finds is ordered first.
        """
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
        await self.verify(job, outcome)
        await self.report(job, outcome)

    async def check_gpus(self, job: SupervisedJob) -> str:
        """Why the job must not run on its devices, ``""`` when it may; fills
        in ``job.mig_uuids``.

        Only names of GPUs and MIG instances are looked at. An instance's UUID comes
        from a fresh ``nvidia-smi -L`` (the latest one when that fails); a whole GPU's
        conflict from the latest listing. Without nvidia-smi ever listing anything,
        a whole GPU runs as it always did, and an instance cannot.
        """
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

    async def refuse(self, job: SupervisedJob, reason: str) -> None:
        """End a job that must not touch its devices: ``failed`` with ``reason``, nothing
        acquired, nothing released, no fault (the device is not broken; its name is)."""
        a = job.assignment
        log.error(
            "job %s: %s", a.job_id, reason, extra={"action": "mig_refused", "job_id": a.job_id}
        )
        body = channel.status_body(
            self.channel.worker_id, JobState.FAILED.value, reason=reason, lease_epoch=a.lease_epoch
        )
        report = self.box.add_status(a.job_id, job.device_ids, body)
        self.jobs.pop(a.job_id, None)
        self.ended(job)
        await self.submit(report)

    async def acquire(self, job: SupervisedJob) -> bool:
        """Acquire the device before the job touches it.

         ``False`` when the job must not run; its reports are then already queued: for
         a failed hook the fault first, then the job ``failed`` without an exit code
        ; for a hook our own cancellation interrupted, the job ``killed`` and
         no fault. Neither schedules a release: nothing is held.
        """
        a = job.assignment
        failed: tuple[str, hooks.AcquireFailed] | None = None
        for device_id in job.device_ids:
            got = await self.hooks.acquire(device_id, a.job_id, job.submitter, job.cancel)
            if isinstance(got, hooks.AcquireFailed):
                failed = (device_id, got)
                break
            job.epochs[device_id] = got
        if failed is None:
            return True
        # The devices acquired before the failure are given back.
        await self.release(job)
        device_id, got = failed
        reason = got.reason
        if got.cancelled:
            state = JobState.KILLED
        else:
            state = JobState.FAILED
            log.error(
                "job %s: %s",
                a.job_id,
                reason,
                extra={"action": "acquire_failed", "job_id": a.job_id},
            )
            await self.report_fault(device_id, reason, a.job_id)
        body = channel.status_body(
            self.channel.worker_id, state.value, reason=reason, lease_epoch=a.lease_epoch
        )
        report = self.box.add_status(a.job_id, job.device_ids, body)
        self.jobs.pop(a.job_id, None)
        self.ended(job)
        await self.submit(report)
        return False

    async def report_running(self, job: SupervisedJob) -> None:
        """Belt and braces: one attempt, failure only logged.

        The controller marked the job running at hand-out, so this must not delay the
        start: it runs in its own task.
        """
        a = job.assignment
        body = channel.status_body(
            self.channel.worker_id, JobState.RUNNING.value, lease_epoch=a.lease_epoch
        )
        try:
            resp = await self.channel.status(a.job_id, body, self.timings.report_attempt_timeout)
        except channel.TRANSPORT_ERRORS as exc:
            problem = channel.error_text(exc)
        else:
            if resp.is_success:
                return
            problem = f"controller returned {channel.status_line(resp)}"
        log.warning(
            "job %s: running report failed: %s",
            a.job_id,
            problem,
            extra={"action": "report_running", "job_id": a.job_id},
        )

    def output_of(self, job: SupervisedJob) -> logship.LogShipper:
        """The job's output, batched into log appends echoing its epoch; what the
        controller does not take goes through the outbox."""
        a = job.assignment
        return logship.LogShipper(
            functools.partial(self.channel.append_log, a.job_id, lease_epoch=a.lease_epoch),
            functools.partial(self.keep_output, a),
            label=a.job_id,
            flush_after=self.timings.log_flush_after,
        )

    async def keep_output(self, a: wire.Assignment, chunk: bytes) -> asyncio.Event:
        """A chunk the controller did not take: durable in the outbox, delivered in
        order and before the job's terminal report (WRK-072: the final flush first)."""
        report = self.box.add_log(a.job_id, chunk, a.lease_epoch)
        await self.box.persist(report)
        self._track(self.deliver(report), a.job_id)
        return report.gone

    def sampler(self, job: SupervisedJob) -> gpusample.Sampler | None:
        """Sample the job's GPU devices while it runs, started here; None
        when sampling is off or none of its devices is a GPU."""
        if self.gpu_interval <= 0:
            return None

        def labels(name: str) -> dict[str, str]:
            return {**self.declared.get(name, {}), **self.detected.get(name, {})}

        targets = gpusample.targets_of(job.device_ids, labels)
        if not targets:
            return None
        sampler = gpusample.Sampler(
            job.job_id,
            targets,
            interval=self.gpu_interval,
            timeout=self.gpu_timeout,
            run=self.sample_run,
        )
        sampler.start()
        return sampler

    async def start(self, job: SupervisedJob) -> runner.Started | runner.Outcome:
        """Environment, command, spawn; a start error is the outcome."""
        return await runner.start_job(
            job.assignment, clock=self.clock, base_env=self._base_env, mig_uuids=job.mig_uuids
        )

    async def supervise(
        self,
        job: SupervisedJob,
        started: runner.Started | runner.Outcome,
        output: logship.LogShipper,
    ) -> runner.Outcome:
        """Watch the started process under its watchdogs until complete (§8).

        A start error is already the outcome.
        """
        if isinstance(started, runner.Outcome):
            return started
        return await runner.supervise_job(
            job.assignment,
            started,
            on_output=output.write,
            cancel=job.cancel,
            clock=self.clock,
            timings=self.timings,
        )

    async def run_attached(self, job: SupervisedJob, output: logship.LogShipper) -> runner.Outcome:
        """Steps 3-4 for a ``tty`` or ``pipe`` job: relay streams, spawn, supervise
        ; only the job's stdio differs."""
        return await attached.run(
            job.assignment,
            to_controller=self.channel,
            on_log=output.write,
            cancel=job.cancel,
            clock=self.clock,
            timings=self.timings,
            base_env=os.environ if self._base_env is None else self._base_env,
            mig_uuids=job.mig_uuids,
        )

    async def abandon(
        self, job: SupervisedJob, running: asyncio.Task[None], output: logship.LogShipper
    ) -> None:
        """The job task is torn down: the runner has SIGKILLed the group; escapees get
        the same, at once, and the output still buffered is dropped."""
        running.cancel()
        stragglers.kill_now(job.job_id)
        await output.abandon()

    async def clear_stragglers(self, job: SupervisedJob) -> None:
        """End escapees carrying the job's ``RC_JOB_ID``; report, never change the outcome.

        WRK-072 step 7, WRK-120..122.
        """
        report = await stragglers.clear(job.job_id, self.timings)
        stragglers.log_report(job.job_id, report)
        if report.clean:
            self.ended(job)

    def ended(self, job: SupervisedJob) -> None:
        """Nothing carrying the job's ID is left (its process never started, or a clean
        sweep found none): it no longer withholds a recovery proof."""
        if self.journal is not None:
            self.journal.ended(job.job_id)

    async def verify(self, job: SupervisedJob, outcome: runner.Outcome) -> None:
        """The verify pass for each of the job's devices, before its report.

        On failure the fault is reported and made durable here, so the terminal report
        queued next can never reach the controller first: the controller
        frees the device the instant that report lands. A failure quarantines that
        device alone. ``outcome`` stays as it is: a dirty device says
        nothing about the run.
        """
        for device_id in job.device_ids:
            await self._verify_one(job, device_id)

    async def _verify_one(self, job: SupervisedJob, device_id: str) -> None:
        if self.verify_dir is None:
            return
        a = job.assignment
        result = await verify_pass.verify_pass(
            self.verify_dir,
            device_id=device_id,
            job_id=a.job_id,
            submitter=job.submitter,
            timeout=self.verify_timeout,
            budget=self.verify_budget,
            clock=self.clock,
            timings=self.timings,
            base_env=self._base_env,
            mig_uuids=job.mig_uuids,
        )
        if result.clean:
            return
        log.error(
            "device %s: job %s: %s",
            device_id,
            a.job_id,
            result.reason,
            extra={"action": "verify_failed", "job_id": a.job_id},
        )
        await self.report_fault(device_id, result.reason, a.job_id)

    def verify_has_work(self) -> bool:
        """Whether the verify pass could run anything: its directory has a file in it.

        A missing directory turns the pass off; an unreadable one is the
        pass's own failure to report, so it counts as work.
        """
        if self.verify_dir is None:
            return False
        try:
            with os.scandir(self.verify_dir) as entries:
                return any(not e.is_dir(follow_symlinks=False) for e in entries)
        except FileNotFoundError:
            return False
        except OSError:
            return True

    async def report(self, job: SupervisedJob, outcome: runner.Outcome) -> None:
        """Queue the terminal report, make it durable, deliver it."""
        await self.submit(self.queue_report(job, outcome))

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
        body = channel.status_body(
            self.channel.worker_id,
            outcome.state.value,
            exit_code=outcome.exit_code,
            reason=outcome.reason,
            lease_epoch=a.lease_epoch,
            gpu=job.gpu,
        )
        report = self.box.add_status(a.job_id, job.device_ids, body)
        # From here on the job is pending, no longer running.
        self.jobs.pop(a.job_id, None)
        return report

    async def release(self, job: SupervisedJob) -> None:
        """Arm each acquired device's release with this job's acquire epoch.

        The release hook runs once the device has been idle for its linger; a later
        job that acquired meanwhile keeps it.
        """
        a = job.assignment
        for device_id, epoch in job.epochs.items():
            await self.hooks.release(device_id, epoch, a.job_id, job.submitter)

    # ---- reports outside a job's run -------------------------------------------------

    def report_prekilled(self, assignment: wire.Assignment) -> None:
        """A kill arrived with the assignment: report it killed, nothing ran.

        Queued here, synchronously, so the outbox is never empty while this report is
        owed (a re-registration would reap the job as lost); delivered in a tracked
        task.
        """
        body = channel.status_body(
            self.channel.worker_id,
            JobState.KILLED.value,
            reason=REASON_PREKILLED,
            lease_epoch=assignment.lease_epoch,
        )
        report = self.box.add_status(assignment.job_id, device_ids_of(assignment), body)
        self._track(self.submit(report), assignment.job_id)

    async def report_fault(self, device_id: str, reason: str, job_id: str = "") -> None:
        """Queue a device fault report and deliver it in its own tracked task.

        Returns once the report is durable, so a terminal report queued afterwards can
        never reach the disk (or the controller) without it.
        """
        report = self.box.add_fault(device_id, reason, job_id)
        await self.box.persist(report)
        self._track(self.deliver(report), job_id or device_id)

    async def submit(self, report: outbox.Report) -> None:
        """Make a queued report durable, then deliver it."""
        await self.box.persist(report)
        await self.deliver(report)

    async def deliver(self, report: outbox.Report) -> None:
        await outbox.deliver(self.box, report, self.channel, self.timings)
