"""Lease lifecycle hooks: ``on_acquire`` before a job touches its device, ``on_release``
after the device has been idle for its linger (worker.md §18).

A hook is a path run directly (no shell, no arguments), in its own process group, under
the device's effective timeout through the job's cancellation path (``runner``), with
stdout and stderr combined and captured in full. Its environment is the
worker's plus ``RC_EVENT``, ``RC_DEVICE``, ``RC_JOB_ID``, ``RC_SUBMITTER`` and
``CUDA_VISIBLE_DEVICES`` when the device name yields an index.

Per-device state lives only for devices with a hook: ``held``, the
pending release timer and its generation, the acquire epoch, and the job that armed the
release. One lock per device is held for the whole of a hook run, so one device's hooks
never overlap while devices never wait on each other.

- ``acquire``: stops a pending release; a device still held runs no hook
  (a burst of back-to-back jobs runs one ``on_acquire``); returns the new epoch.
- ``release``: arms the linger timer, unless a later job re-acquired the
  device meanwhile (the epoch rule). When the timer fires, ``on_release``
  runs and the device is no longer held, so a burst runs one release.
- ``startup_pass``: every ``on_release`` once before the first poll,
  bounded; the state is not touched. Nothing is persisted: one unconditional pass heals
  a crash and a clean restart alike, which is why ``on_release`` must be idempotent.
- ``drain``: at shutdown, every armed-but-unfired timer fires at once, all
  within one budget.

The linger counts on the injected clock, checked every ``Timings.linger_check``, so a
test advances a fake clock instead of waiting 30 seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from resource_controller.clock import Clock
from resource_controller.core import cuda, durations
from resource_controller.core.states import JobState
from resource_controller.worker import config as worker_config
from resource_controller.worker import runner
from resource_controller.worker.timings import Timings

log = logging.getLogger(__name__)

#: The output tail sent to the controller.
OUTPUT_TAIL = 4096

ACQUIRE = "acquire"
RELEASE = "release"

REASON_ACQUIRE_FAILED = "acquire hook failed: "
REASON_ACQUIRE_CANCELLED = "cancelled during acquire hook: "

_CANCELLATION = frozenset({runner.REASON_CANCELLED, runner.REASON_SURVIVORS})


@dataclass(frozen=True)
class HookResult:
    """How one hook run ended."""

    #: ``""`` on success, else ``hook <path>: <detail>``.
    error: str
    #: The combined output, in full.
    output: bytes = b""
    #: Ended by our own cancellation (kill flag, shutdown), not by the hook.
    cancelled: bool = False
    #: Exit status, 128+signal for a signal death, -1 when it never started.
    exit_code: int = -1

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def tail(self) -> str:
        """The last ``OUTPUT_TAIL`` bytes of the output, as text."""
        return self.output[-OUTPUT_TAIL:].decode("utf-8", errors="replace")


@dataclass(frozen=True)
class AcquireFailed:
    """The acquire hook did not succeed: the job must not run."""

    result: HookResult

    @property
    def cancelled(self) -> bool:
        return self.result.cancelled

    @property
    def reason(self) -> str:
        """``acquire hook failed: <error>[\\n<tail>]`` or ``cancelled during acquire hook: <error>``."""
        if self.cancelled:
            return REASON_ACQUIRE_CANCELLED + self.result.error
        reason = REASON_ACQUIRE_FAILED + self.result.error
        if self.result.output:
            reason += "\n" + self.result.tail
        return reason


def hook_env(
    base_env: Mapping[str, str],
    event: str,
    device_id: str,
    job_id: str,
    submitter: str,
    mig_uuids: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The worker's environment plus the hook variables.

     ``CUDA_VISIBLE_DEVICES`` is set from the device name when it yields an index
    , or to a MIG instance's UUID from ``mig_uuids``, replacing an
     inherited value; otherwise the inherited one passes.
    """
    env = dict(base_env)
    env["RC_EVENT"] = event
    env["RC_DEVICE"] = device_id
    env["RC_JOB_ID"] = job_id
    env["RC_SUBMITTER"] = submitter
    index = cuda.visible_id(device_id, mig_uuids)
    if index is not None:
        env["CUDA_VISIBLE_DEVICES"] = index
    return env


async def run_hook(
    path: str,
    env: Mapping[str, str],
    *,
    timeout: float,
    cancel: asyncio.Event,
    clock: Clock,
    timings: Timings,
) -> HookResult:
    """Run one hook to its end; never raises for the hook's sake.

    If this task is torn down, the hook's group is SIGKILLed on the way out (the
    runner's rule), which is how a budget cuts a hook short.
    """
    started = await runner.start([path], env=env, cwd=None, clock=clock)
    if isinstance(started, runner.Outcome):
        return HookResult(f"hook {path}: {started.reason}", exit_code=started.exit_code)
    output = bytearray()

    async def keep(chunk: bytes) -> None:
        output.extend(chunk)

    outcome = await runner.supervise(
        started,
        on_output=keep,
        cancel=cancel,
        clock=clock,
        timings=timings,
        max_runtime_seconds=timeout,
    )
    code = outcome.exit_code
    if outcome.state == JobState.SUCCEEDED:
        return HookResult("", bytes(output), exit_code=code)
    if outcome.state == JobState.KILLED:
        return HookResult(
            f"hook {path}: {outcome.reason}",
            bytes(output),
            outcome.reason in _CANCELLATION,
            exit_code=code,
        )
    return HookResult(f"hook {path}: exited {code}", bytes(output), exit_code=code)


def _log_result(what: str, device_id: str, job_id: str, result: HookResult) -> None:
    """Success at debug with its output; failure at error with all of it, exit code
    included (HOOK-004)."""
    text = result.output.decode("utf-8", errors="replace")
    if result.ok:
        log.debug(
            "device %s: %s hook succeeded; output: %r",
            device_id,
            what,
            text,
            extra={"action": f"hook_{what}", "device_id": device_id, "job_id": job_id},
        )
        return
    log.error(
        "device %s: %s hook failed: %s; exit code %d; output: %r",
        device_id,
        what,
        result.error,
        result.exit_code,
        text,
        extra={"action": f"hook_{what}_failed", "device_id": device_id, "job_id": job_id},
    )


@dataclass(eq=False)
class DeviceHooks:
    """One device's held state."""

    device_id: str
    on_acquire: str | None
    on_release: str | None
    timeout: float
    linger: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    held: bool = False
    #: The pending release: sleeping until the linger ends, then releasing.
    timer: asyncio.Task[None] | None = None
    #: Bumped whenever a pending release is stopped or re-armed.
    generation: int = 0
    #: Bumped at every acquisition; a release carries the epoch of its job.
    epoch: int = 0
    #: The job (and its submitter) that armed the pending release.
    release_job_id: str = ""
    release_submitter: str = ""
    #: The timer passed its generation check and is running the release now.
    firing: bool = False

    def stop_timer(self) -> None:
        """Stop a pending release and bump the generation (caller holds the lock)."""
        if self.timer is not None and not self.firing:
            self.timer.cancel()
        self.timer = None
        self.generation += 1


class Hooks:
    """Every device's hooks and held state, for one worker process."""

    def __init__(
        self,
        config: worker_config.WorkerConfig,
        *,
        clock: Clock,
        timings: Timings,
        base_env: Mapping[str, str] | None = None,
        mig_uuids: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        self.clock = clock
        self.timings = timings
        self._base_env = base_env
        #: The host's MIG instances' UUIDs as last listed, for ``CUDA_VISIBLE_DEVICES``.
        self._mig_uuids = mig_uuids
        #: Only devices with a hook have state at all; config order.
        self.devices: dict[str, DeviceHooks] = {
            config.device_id(d.name): DeviceHooks(
                config.device_id(d.name), d.on_acquire, d.on_release, d.timeout, d.release_linger
            )
            for d in config.devices
            if d.on_acquire is not None or d.on_release is not None
        }
        #: Releases running outside a timer (the shutdown drain); cancelled by ``close``.
        self._loose: set[asyncio.Task[None]] = set()

    def _env(self, event: str, device_id: str, job_id: str, submitter: str) -> dict[str, str]:
        base = os.environ if self._base_env is None else self._base_env
        uuids = self._mig_uuids() if self._mig_uuids is not None else None
        return hook_env(base, event, device_id, job_id, submitter, uuids)

    async def _run(
        self,
        dev: DeviceHooks,
        path: str,
        event: str,
        job_id: str,
        submitter: str,
        cancel: asyncio.Event | None = None,
    ) -> HookResult:
        result = await run_hook(
            path,
            self._env(event, dev.device_id, job_id, submitter),
            timeout=dev.timeout,
            cancel=cancel or asyncio.Event(),
            clock=self.clock,
            timings=self.timings,
        )
        _log_result(event, dev.device_id, job_id, result)
        return result

    # ---- acquire ---------------------------------------------------------------------

    async def acquire(
        self, device_id: str, job_id: str, submitter: str, cancel: asyncio.Event
    ) -> int | AcquireFailed:
        """Acquire ``device_id`` for a job; the epoch, or why the job must not run.

        A device without hooks is always acquired, at epoch 0. The hook runs
        inside the job's cancellation scope ``cancel``; waiting for an
        in-flight release of the same device is part of acquiring.
        """
        dev = self.devices.get(device_id)
        if dev is None:
            return 0
        async with dev.lock:
            dev.stop_timer()
            if dev.held:
                dev.epoch += 1
                log.debug(
                    "device %s: still held, acquire hook skipped",
                    device_id,
                    extra={"action": "hook_acquire_skipped", "job_id": job_id},
                )
                return dev.epoch
            if dev.on_acquire is not None:
                result = await self._run(dev, dev.on_acquire, ACQUIRE, job_id, submitter, cancel)
                if not result.ok:
                    return AcquireFailed(result)
            dev.held = True
            dev.epoch += 1
            return dev.epoch

    # ---- release and linger ----------------------------------------------------------

    async def release(self, device_id: str, epoch: int, job_id: str, submitter: str) -> None:
        """Arm the device's release after its linger, for the job that acquired at ``epoch``."""
        dev = self.devices.get(device_id)
        if dev is None:
            return
        async with dev.lock:
            if not dev.held:
                return
            if dev.epoch != epoch:
                log.info(
                    "device %s: release skipped: re-acquired by a later job",
                    device_id,
                    extra={"action": "hook_release_skipped", "job_id": job_id},
                )
                return
            dev.stop_timer()
            dev.release_job_id = job_id
            dev.release_submitter = submitter
            deadline = self.clock.monotonic() + dev.linger
            dev.timer = asyncio.create_task(
                self._linger(dev, dev.generation, deadline), name=f"linger-{device_id}"
            )

    async def _linger(self, dev: DeviceHooks, generation: int, deadline: float) -> None:
        while True:
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                break
            await asyncio.sleep(min(remaining, self.timings.linger_check))
        await self._fire(dev, generation)

    async def _fire(self, dev: DeviceHooks, generation: int) -> None:
        """The release itself: only if nothing stopped or re-armed it."""
        async with dev.lock:
            if dev.generation != generation:
                return
            dev.firing = True
            try:
                if dev.on_release is not None:
                    result = await self._run(
                        dev, dev.on_release, RELEASE, dev.release_job_id, dev.release_submitter
                    )
                    if not result.ok:  # Logged, never a quarantine
                        log.error(
                            "device %s: release hook failed (the device is free anyway): "
                            "%s; output tail: %r",
                            dev.device_id,
                            result.error,
                            result.tail,
                            extra={"action": "hook_release_failed"},
                        )
            finally:
                dev.held = False
                dev.firing = False
                if dev.generation == generation:
                    dev.timer = None

    @property
    def armed(self) -> list[str]:
        """Devices whose release is pending and not yet executing."""
        return [d.device_id for d in self.devices.values() if d.timer is not None and not d.firing]

    async def drain(self, budget: float | None = None) -> None:
        """Fire every armed-but-unfired release now, within one budget.

        A release already executing from its timer is not waited for; one cut short
        by the budget is killed and left to the next start-up pass.
        """
        budget = self.timings.release_drain_budget if budget is None else budget
        firing: list[asyncio.Task[None]] = []
        for dev in self.devices.values():
            if dev.timer is None or dev.firing:
                continue
            dev.stop_timer()
            task = asyncio.create_task(
                self._fire(dev, dev.generation), name=f"drain-{dev.device_id}"
            )
            firing.append(task)
            self._loose.add(task)
            task.add_done_callback(self._loose.discard)
        if not firing:
            return
        log.info(
            "shutdown: running %d pending release(s) now",
            len(firing),
            extra={"action": "hook_drain"},
        )
        _, late = await asyncio.wait(firing, timeout=budget)
        if late:
            log.error(
                "shutdown: release drain exceeded its %s budget; left to the next start",
                durations.render_duration(budget),
                extra={"action": "hook_drain_budget"},
            )
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    async def close(self) -> None:
        """Stop every timer and release still running (the process is ending)."""
        tasks = [d.timer for d in self.devices.values() if d.timer is not None]
        tasks.extend(self._loose)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- start-up release pass -------------------------------------------------------

    async def startup_pass(self, budget: float | None = None) -> None:
        """Every ``on_release`` once, in config order, bounded; the state is untouched."""
        budget = self.timings.startup_release_budget if budget is None else budget
        devices = [d for d in self.devices.values() if d.on_release is not None]
        if not devices:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        for i, dev in enumerate(devices):
            assert dev.on_release is not None
            remaining = deadline - loop.time()
            run = asyncio.create_task(self._run(dev, dev.on_release, RELEASE, "", ""))
            try:
                done, _ = await asyncio.wait({run}, timeout=max(0.0, remaining))
            except asyncio.CancelledError:
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run
                raise
            if not done:
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run
                skipped = [d.device_id for d in devices[i + 1 :]]
                log.error(
                    "start-up release pass exceeded its %s budget: the hook of %s was "
                    "killed%s; the next start tries again",
                    durations.render_duration(budget),
                    dev.device_id,
                    f", skipped {', '.join(skipped)}" if skipped else "",
                    extra={"action": "hook_startup_budget"},
                )
                return
