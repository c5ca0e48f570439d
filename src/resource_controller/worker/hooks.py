"""Lease lifecycle hooks (§18): ``on_acquire`` before a job touches its device,
``on_release`` once the device has been idle for its linger.

One lock per device with a hook (HOOK-007); nothing is persisted, the start-up pass
heals a crash and a clean restart alike (HOOK-030).
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from resource_controller.clock import Clock
from resource_controller.core import cuda, durations
from resource_controller.core.states import JobState
from resource_controller.worker import config as worker_config
from resource_controller.worker import runner
from resource_controller.worker.timings import Timings

log = logging.getLogger(__name__)

OUTPUT_TAIL = 4096

REASON_ACQUIRE_FAILED = "acquire hook failed: "
REASON_ACQUIRE_CANCELLED = "cancelled during acquire hook: "

_CANCELLATION = frozenset({runner.REASON_CANCELLED, runner.REASON_SURVIVORS})
#: A verify script's streams: stderr is its output, stdout is ignored (VERIFY-004).
_STDERR_ONLY = (subprocess.DEVNULL, subprocess.DEVNULL, subprocess.PIPE)


@dataclass(frozen=True)
class HookResult:
    """How one hook (or verify script) run ended."""

    path: str
    #: ``""`` on success, else ``exited <code>``, a supervision reason or the start error.
    detail: str
    #: Combined and in full for a hook, stderr alone (up to a cap) for verify.
    output: bytes = b""
    truncated: bool = False
    #: Ended by our own cancellation (kill flag, shutdown), not by the hook.
    cancelled: bool = False
    exit_code: int = -1
    started: bool = True

    @property
    def ok(self) -> bool:
        return not self.detail

    @property
    def error(self) -> str:
        """``hook <path>: <detail>`` (HOOK-003); ``""`` on success."""
        return f"hook {self.path}: {self.detail}" if self.detail else ""


@dataclass(frozen=True)
class AcquireFailed:
    """The acquire hook did not succeed: the job must not run."""

    result: HookResult

    @property
    def cancelled(self) -> bool:
        return self.result.cancelled

    @property
    def reason(self) -> str:
        """The job's reason (HOOK-012, HOOK-013)."""
        if self.cancelled:
            return REASON_ACQUIRE_CANCELLED + self.result.error
        tail = self.result.output[-OUTPUT_TAIL:].decode("utf-8", errors="replace")
        return REASON_ACQUIRE_FAILED + self.result.error + ("\n" + tail if tail else "")


def hook_env(
    base_env: Mapping[str, str],
    event: str,
    device_id: str,
    job_id: str,
    submitter: str,
    mig_uuids: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The worker's environment plus the hook variables (HOOK-002)."""
    env = dict(base_env, RC_EVENT=event, RC_DEVICE=device_id)
    env.update(RC_JOB_ID=job_id, RC_SUBMITTER=submitter)
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
    stderr_cap: int | None = None,
) -> HookResult:
    """Run one hook to its end (HOOK-001, HOOK-003); ``stderr_cap``: a verify script's."""
    stdio = runner.LOGS_STDIO if stderr_cap is None else _STDERR_ONLY
    started = await runner.start([path], env=env, cwd=None, clock=clock, stdio=stdio)
    if isinstance(started, runner.Outcome):
        return HookResult(path, started.reason, exit_code=started.exit_code, started=False)
    output = bytearray()
    truncated = False

    async def keep(chunk: bytes) -> None:
        nonlocal truncated
        room = len(chunk) if stderr_cap is None else stderr_cap - len(output)
        truncated = truncated or len(chunk) > room
        output.extend(chunk[: max(room, 0)])

    outcome = await runner.supervise(
        started,
        on_output=keep,
        cancel=cancel,
        clock=clock,
        timings=timings,
        max_runtime_seconds=timeout,
    )
    code = outcome.exit_code
    detail = {JobState.SUCCEEDED: "", JobState.FAILED: f"exited {code}"}.get(
        outcome.state, outcome.reason
    )
    cancelled = outcome.state == JobState.KILLED and outcome.reason in _CANCELLATION
    return HookResult(path, detail, bytes(output), truncated, cancelled, code)


def _log_result(what: str, device_id: str, job_id: str, result: HookResult) -> None:
    """Success at debug, failure at error with the exit code (HOOK-004, HOOK-024)."""
    text = result.output.decode("utf-8", errors="replace")
    extra = {"device_id": device_id, "job_id": job_id}
    if result.ok:
        log.debug(
            "device %s: %s hook succeeded; output: %r",
            device_id,
            what,
            text,
            extra={"action": f"hook_{what}", **extra},
        )
        return
    log.error(
        "device %s: %s hook failed: %s; exit code %d; output: %r",
        device_id,
        what,
        result.error,
        result.exit_code,
        text,
        extra={"action": f"hook_{what}_failed", **extra},
    )


@dataclass(eq=False)
class DeviceHooks:
    """One device's held state (HOOK-007)."""

    device_id: str
    on_acquire: str | None
    on_release: str | None
    timeout: float
    linger: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    held: bool = False
    #: The pending release, and its generation, bumped when it is stopped or re-armed.
    timer: asyncio.Task[None] | None = None
    generation: int = 0
    #: Bumped at every acquisition; a release carries the epoch of its job.
    epoch: int = 0
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
        base_env: Mapping[str, str] = os.environ,
        mig_uuids: Callable[[], Mapping[str, str]] = dict,
    ) -> None:
        self.clock = clock
        self.timings = timings
        self._base_env = base_env
        self._mig_uuids = mig_uuids
        #: Only devices with a hook have state at all (HOOK-006); config order.
        self.devices: dict[str, DeviceHooks] = {
            config.device_id(d.name): DeviceHooks(
                config.device_id(d.name), d.on_acquire, d.on_release, d.timeout, d.release_linger
            )
            for d in config.devices
            if d.on_acquire is not None or d.on_release is not None
        }
        #: Releases running outside a timer (the shutdown drain); cancelled by ``close``.
        self._loose: set[asyncio.Task[None]] = set()

    async def _run(
        self,
        dev: DeviceHooks,
        path: str,
        event: str,
        job_id: str,
        submitter: str,
        cancel: asyncio.Event | None = None,
    ) -> HookResult:
        env = hook_env(self._base_env, event, dev.device_id, job_id, submitter, self._mig_uuids())
        result = await run_hook(
            path,
            env,
            timeout=dev.timeout,
            cancel=cancel or asyncio.Event(),
            clock=self.clock,
            timings=self.timings,
        )
        _log_result(event, dev.device_id, job_id, result)
        return result

    async def acquire(
        self, device_id: str, job_id: str, submitter: str, cancel: asyncio.Event
    ) -> int | AcquireFailed:
        """The new epoch (0 without hooks), or why the job must not run (HOOK-010/011)."""
        dev = self.devices.get(device_id)
        if dev is None:
            return 0
        async with dev.lock:
            dev.stop_timer()
            if dev.held:
                log.debug(
                    "device %s: still held, acquire hook skipped",
                    device_id,
                    extra={"action": "hook_acquire_skipped", "job_id": job_id},
                )
            elif dev.on_acquire is not None:
                result = await self._run(dev, dev.on_acquire, "acquire", job_id, submitter, cancel)
                if not result.ok:
                    return AcquireFailed(result)
            dev.held = True
            dev.epoch += 1
            return dev.epoch

    async def release(self, device_id: str, epoch: int, job_id: str, submitter: str) -> None:
        """Arm the release, unless a later job re-acquired the device (HOOK-020, HOOK-021)."""
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
        while (remaining := deadline - self.clock.monotonic()) > 0:
            await asyncio.sleep(min(remaining, self.timings.linger_check))
        await self._fire(dev, generation)

    async def _fire(self, dev: DeviceHooks, generation: int) -> None:
        """The release, unless stopped or re-armed (HOOK-022); a failure is only logged."""
        async with dev.lock:
            if dev.generation != generation:
                return
            dev.firing = True
            try:
                if dev.on_release is not None:
                    job_id, submitter = dev.release_job_id, dev.release_submitter
                    await self._run(dev, dev.on_release, "release", job_id, submitter)
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
        """Fire every armed-but-unfired release now, within one budget (HOOK-025)."""
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

    async def startup_pass(self, budget: float | None = None) -> None:
        """Every ``on_release`` once, in config order, bounded (HOOK-030, HOOK-031)."""
        budget = self.timings.startup_release_budget if budget is None else budget
        devices = [d for d in self.devices.values() if d.on_release is not None]
        done = 0
        try:
            async with asyncio.timeout(budget):
                for dev in devices:
                    assert dev.on_release is not None
                    await self._run(dev, dev.on_release, "release", "", "")
                    done += 1
        except TimeoutError:
            skipped = [d.device_id for d in devices[done + 1 :]]
            log.error(
                "start-up release pass exceeded its %s budget: the hook of %s was "
                "killed%s; the next start tries again",
                durations.render_duration(budget),
                devices[done].device_id,
                f", skipped {', '.join(skipped)}" if skipped else "",
                extra={"action": "hook_startup_budget"},
            )
