"""Lease lifecycle hooks (worker.md §18): real scripts in a temp directory, a fake clock.

The hooks append one line per run to a log file (``event job submitter device cuda``),
so a test counts how often each ran and with what. The linger reads the injected
clock: tests advance it instead of waiting 30 seconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
from worker_helpers import FAST, run

from resource_controller.clock import Clock, FakeClock, SystemClock
from resource_controller.worker import config as wc
from resource_controller.worker import hooks
from resource_controller.worker.timings import Timings

T = Timings(linger_check=0.005, kill_grace=0.3, watchdog_period=0.02)


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def logging_hook(tmp: Path, name: str, extra: str = "") -> str:
    log = tmp / "hooks.log"
    return script(
        tmp / name,
        f'echo "$RC_EVENT|$RC_JOB_ID|$RC_SUBMITTER|$RC_DEVICE|${{CUDA_VISIBLE_DEVICES-unset}}"'
        f' >> "{log}"\n{extra}',
    )


def runs(tmp: Path) -> list[list[str]]:
    log = tmp / "hooks.log"
    if not log.exists():
        return []
    return [line.split("|") for line in log.read_text().splitlines()]


def make(tmp: Path, *devices: wc.DeviceConfig, **settings: Any) -> wc.WorkerConfig:
    return wc.make_config("http://c", list(devices), host="box", state_dir=str(tmp), **settings)


async def acquired(h: hooks.Hooks, device_id: str, job_id: str, submitter: str) -> int:
    """Acquire for a job whose acquire hook succeeds: the epoch to release with."""
    epoch = await h.acquire(device_id, job_id, submitter, asyncio.Event())
    assert isinstance(epoch, int), epoch
    return epoch


async def until(pred: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def test_burst_runs_one_acquire_and_one_release(tmp_path: Path) -> None:  # HOOK-010, HOOK-023
    acquire = logging_hook(tmp_path, "acq")
    release = logging_hook(tmp_path, "rel")
    config = make(
        tmp_path,
        wc.DeviceConfig(name="gpu3", on_acquire=acquire, on_release=release, release_linger=30),
    )
    clock = FakeClock()

    async def go() -> None:
        h = hooks.Hooks(config, clock=clock, timings=T, base_env={"PATH": os.defpath})
        for i in range(6):
            epoch = await acquired(h, "box:gpu3", f"job{i}", f"sub{i}")
            assert epoch == i + 1
            clock.advance(10)  # each job runs 10 s; the device is never idle for 30 s
            await h.release("box:gpu3", epoch, f"job{i}", f"sub{i}")
            clock.advance(5)
            await asyncio.sleep(0.03)
        assert [r[0] for r in runs(tmp_path)] == ["acquire"]
        clock.advance(25)  # idle for the whole linger now
        # The hook writes its line before the worker marks the device released.
        await until(lambda: len(runs(tmp_path)) == 2 and not h.devices["box:gpu3"].held)
        await h.close()

    run(go())
    got = runs(tmp_path)
    print(
        f"burst of 6 jobs: {sum(r[0] == 'acquire' for r in got)} acquire, "
        f"{sum(r[0] == 'release' for r in got)} release"
    )
    # HOOK-002: the job behind the hook, its submitter, the device, the derived index;
    # the release names the last job (HOOK-023).
    assert got == [
        ["acquire", "job0", "sub0", "box:gpu3", "3"],
        ["release", "job5", "sub5", "box:gpu3", "3"],
    ]


def test_reacquire_after_linger_runs_the_acquire_hook_again(tmp_path: Path) -> None:
    acquire = logging_hook(tmp_path, "acq")
    release = logging_hook(tmp_path, "rel")
    config = make(
        tmp_path,
        wc.DeviceConfig(name="dev", on_acquire=acquire, on_release=release, release_linger=2),
    )
    clock = FakeClock()

    async def go() -> None:
        h = hooks.Hooks(config, clock=clock, timings=T, base_env={"PATH": os.defpath})
        for job in ("a", "b"):
            epoch = await acquired(h, "box:dev", job, "")
            await h.release("box:dev", epoch, job, "")
            clock.advance(3)
            await until(lambda: not h.devices["box:dev"].held)
        await h.close()

    run(go())
    got = runs(tmp_path)
    assert [(r[0], r[1]) for r in got] == [
        ("acquire", "a"),
        ("release", "a"),
        ("acquire", "b"),
        ("release", "b"),
    ]
    assert got[0][4] == "unset"  # no index in "dev": CUDA_VISIBLE_DEVICES untouched


def test_a_stale_epoch_never_arms_a_release(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:  # HOOK-020, HOOK-021
    release = logging_hook(tmp_path, "rel")
    config = make(tmp_path, wc.DeviceConfig(name="gpu0", on_release=release, release_linger=1))
    clock = FakeClock()

    async def go() -> None:
        h = hooks.Hooks(config, clock=clock, timings=T, base_env={})
        first = await acquired(h, "box:gpu0", "first", "")
        second = await acquired(h, "box:gpu0", "second", "")
        assert (first, second) == (1, 2)
        with caplog.at_level(logging.INFO, logger="resource_controller.worker.hooks"):
            await h.release("box:gpu0", first, "first", "")  # its report came back late
        assert h.devices["box:gpu0"].timer is None
        clock.advance(5)
        await asyncio.sleep(0.05)
        assert runs(tmp_path) == []  # the second job keeps its device
        await h.release("box:gpu0", second, "second", "")
        clock.advance(5)
        await until(lambda: len(runs(tmp_path)) == 1)
        await h.close()

    run(go())
    assert "re-acquired by a later job" in caplog.text
    assert runs(tmp_path)[0][:2] == ["release", "second"]


def test_device_without_hooks_has_no_state(tmp_path: Path) -> None:  # HOOK-006
    config = make(tmp_path, wc.DeviceConfig(name="gpu0"))

    async def go() -> None:
        h = hooks.Hooks(config, clock=FakeClock(), timings=T)
        assert h.devices == {}
        assert await h.acquire("box:gpu0", "j", "", asyncio.Event()) == 0
        await h.release("box:gpu0", 0, "j", "")
        await h.startup_pass()
        await h.drain()

    run(go())


def test_failed_acquire_hook_reason_has_the_output_tail(tmp_path: Path) -> None:  # HOOK-012
    acquire = script(tmp_path / "acq", "printf 'nvidia-persistenced: stuck\\n'; exit 3")
    config = make(tmp_path, wc.DeviceConfig(name="gpu0", on_acquire=acquire))

    async def go() -> hooks.AcquireFailed:
        h = hooks.Hooks(config, clock=FakeClock(), timings=T)
        got = await h.acquire("box:gpu0", "j", "", asyncio.Event())
        assert isinstance(got, hooks.AcquireFailed)
        assert not h.devices["box:gpu0"].held and h.devices["box:gpu0"].epoch == 0
        return got

    failed = run(go())
    assert not failed.cancelled
    assert failed.reason == (
        f"acquire hook failed: hook {acquire}: exited 3\nnvidia-persistenced: stuck\n"
    )


def test_output_tail_is_the_last_4096_bytes(tmp_path: Path) -> None:  # HOOK-005
    acquire = script(tmp_path / "acq", "head -c 10000 /dev/zero | tr '\\0' a; printf END; exit 1")
    config = make(tmp_path, wc.DeviceConfig(name="gpu0", on_acquire=acquire))

    async def go() -> hooks.AcquireFailed:
        got = await hooks.Hooks(config, clock=FakeClock(), timings=T).acquire(
            "box:gpu0", "j", "", asyncio.Event()
        )
        assert isinstance(got, hooks.AcquireFailed)
        return got

    failed = run(go())
    assert len(failed.result.output) == 10003  # captured in full (HOOK-001)
    tail = failed.reason.split("\n", 1)[1]
    assert len(tail) == 4096 and tail.endswith("aaaEND")


def test_missing_acquire_hook_is_a_start_error(tmp_path: Path) -> None:  # HOOK-003
    missing = str(tmp_path / "not-there")
    config = make(tmp_path, wc.DeviceConfig(name="gpu0", on_acquire=missing))

    async def go() -> hooks.AcquireFailed:
        got = await hooks.Hooks(config, clock=FakeClock(), timings=T).acquire(
            "box:gpu0", "j", "", asyncio.Event()
        )
        assert isinstance(got, hooks.AcquireFailed)
        return got

    failed = run(go())
    assert failed.reason == (
        f"acquire hook failed: hook {missing}: start: exec {missing}: no such file or directory"
    )


def test_hook_hanging_past_its_timeout_is_killed(tmp_path: Path) -> None:  # HOOK-001, HOOK-003
    acquire = script(tmp_path / "acq", "echo waiting; exec sleep 30")
    config = make(tmp_path, wc.DeviceConfig(name="gpu0", on_acquire=acquire, timeout=0.3))

    async def go() -> hooks.AcquireFailed:
        got = await hooks.Hooks(config, clock=SystemClock(), timings=T).acquire(
            "box:gpu0", "j", "", asyncio.Event()
        )
        assert isinstance(got, hooks.AcquireFailed)
        return got

    t0 = time.monotonic()
    failed = run(go())
    assert time.monotonic() - t0 < 5
    assert failed.reason == (
        f"acquire hook failed: hook {acquire}: max_runtime exceeded (300ms)\nwaiting\n"
    )


def _failed_acquire_logged(
    config: wc.WorkerConfig, clock: Clock, caplog: pytest.LogCaptureFixture
) -> logging.LogRecord:
    """Run gpu0's acquire hook, which must fail; the one record it logged, at error."""

    async def go() -> None:
        h = hooks.Hooks(config, clock=clock, timings=T)
        with caplog.at_level(logging.ERROR, logger="resource_controller.worker.hooks"):
            assert isinstance(
                await h.acquire("box:gpu0", "j", "", asyncio.Event()), hooks.AcquireFailed
            )

    run(go())
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    return record


def test_a_timed_out_hooks_error_log_names_its_exit_code(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:  # HOOK-004
    acquire = script(tmp_path / "acq", "echo waiting; exec sleep 30")
    config = make(tmp_path, wc.DeviceConfig(name="gpu0", on_acquire=acquire, timeout=0.3))
    record = _failed_acquire_logged(config, SystemClock(), caplog)
    assert record.getMessage() == (
        f"device box:gpu0: acquire hook failed: hook {acquire}: max_runtime exceeded (300ms); "
        "exit code 143; output: 'waiting\\n'"
    )


def test_a_hook_that_exited_0_leaving_stragglers_logs_exit_code_0(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:  # HOOK-004
    acquire = script(tmp_path / "acq", "sleep 30 >/dev/null 2>&1 &\nexit 0")
    config = make(tmp_path, wc.DeviceConfig(name="gpu0", on_acquire=acquire))
    record = _failed_acquire_logged(config, FakeClock(), caplog)
    assert "stragglers reaped after exit; exit code 0;" in record.getMessage()


def test_a_successful_hooks_output_is_logged_at_debug_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:  # HOOK-004
    acquire = script(tmp_path / "acq", "echo persistence-mode-on")
    config = make(tmp_path, wc.DeviceConfig(name="gpu0", on_acquire=acquire))

    async def go() -> None:
        h = hooks.Hooks(config, clock=FakeClock(), timings=T)
        with caplog.at_level(logging.DEBUG, logger="resource_controller.worker.hooks"):
            assert await h.acquire("box:gpu0", "j", "", asyncio.Event()) == 1

    run(go())
    mentions = [r for r in caplog.records if "persistence-mode-on" in r.getMessage()]
    assert [r.levelno for r in mentions] == [logging.DEBUG]


def test_hook_leaving_a_live_process_in_its_group_fails(tmp_path: Path) -> None:  # HOOK-003
    acquire = script(tmp_path / "acq", "sleep 30 >/dev/null 2>&1 &\nexit 0")
    config = make(tmp_path, wc.DeviceConfig(name="gpu0", on_acquire=acquire))

    async def go() -> hooks.AcquireFailed:
        got = await hooks.Hooks(config, clock=FakeClock(), timings=T).acquire(
            "box:gpu0", "j", "", asyncio.Event()
        )
        assert isinstance(got, hooks.AcquireFailed)
        return got

    assert run(go()).reason == f"acquire hook failed: hook {acquire}: stragglers reaped after exit"


def test_acquire_interrupted_by_the_jobs_cancellation(tmp_path: Path) -> None:  # HOOK-011/013
    acquire = script(tmp_path / "acq", "exec sleep 30")
    config = make(tmp_path, wc.DeviceConfig(name="gpu0", on_acquire=acquire))

    async def go() -> hooks.AcquireFailed:
        cancel = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, cancel.set)
        got = await hooks.Hooks(config, clock=FakeClock(), timings=T).acquire(
            "box:gpu0", "j", "", cancel
        )
        assert isinstance(got, hooks.AcquireFailed)
        return got

    failed = run(go())
    assert failed.cancelled
    assert failed.reason == f"cancelled during acquire hook: hook {acquire}: cancelled"


def test_one_devices_hooks_are_serialised(tmp_path: Path) -> None:  # HOOK-007
    release = logging_hook(
        tmp_path, "rel", "sleep 0.4; echo release-done >> " + str(tmp_path / "hooks.log")
    )
    acquire = logging_hook(tmp_path, "acq")
    other = logging_hook(tmp_path, "other")
    config = make(
        tmp_path,
        wc.DeviceConfig(name="gpu0", on_acquire=acquire, on_release=release, release_linger=1),
        wc.DeviceConfig(name="gpu1", on_acquire=other),
    )
    clock = FakeClock()

    async def go() -> None:
        h = hooks.Hooks(config, clock=clock, timings=T, base_env={})
        epoch = await acquired(h, "box:gpu0", "a", "")
        await h.release("box:gpu0", epoch, "a", "")
        clock.advance(2)
        await until(lambda: len(runs(tmp_path)) == 2)  # the release hook has started
        # Another device never waits; the same device waits for the release to end.
        t0 = time.monotonic()
        await h.acquire("box:gpu1", "c", "", asyncio.Event())
        assert time.monotonic() - t0 < 0.35
        await h.acquire("box:gpu0", "b", "", asyncio.Event())
        await h.close()

    run(go())
    order = [r[0] for r in runs(tmp_path)]
    assert order == ["acquire", "release", "acquire", "release-done", "acquire"]


def test_startup_pass_runs_every_release_hook_without_a_job(tmp_path: Path) -> None:  # HOOK-030
    release = logging_hook(tmp_path, "rel")
    failing = script(tmp_path / "bad", "exit 1")
    config = make(
        tmp_path,
        wc.DeviceConfig(name="gpu0", on_release=release),
        wc.DeviceConfig(name="gpu1", on_release=failing),
        wc.DeviceConfig(name="gpu2", on_acquire=release),
        wc.DeviceConfig(name="gpu3", on_release=release),
    )

    async def go() -> None:
        h = hooks.Hooks(config, clock=FakeClock(), timings=T, base_env={})
        await h.startup_pass()
        assert not any(d.held for d in h.devices.values())  # state untouched

    run(go())
    assert runs(tmp_path) == [
        ["release", "", "", "box:gpu0", "0"],
        ["release", "", "", "box:gpu3", "3"],
    ]


def test_startup_pass_is_bounded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # HOOK-031: the running hook is killed, the rest skipped with an error log.
    hang = script(tmp_path / "hang", "exec sleep 30")
    release = logging_hook(tmp_path, "rel")
    config = make(
        tmp_path,
        wc.DeviceConfig(name="gpu0", on_release=hang),
        wc.DeviceConfig(name="gpu1", on_release=release),
    )

    async def go() -> None:
        h = hooks.Hooks(config, clock=SystemClock(), timings=T, base_env={})
        with caplog.at_level(logging.ERROR, logger="resource_controller.worker.hooks"):
            await h.startup_pass(budget=0.3)

    t0 = time.monotonic()
    run(go())
    assert time.monotonic() - t0 < 3
    assert runs(tmp_path) == []
    assert "budget" in caplog.text and "skipped box:gpu1" in caplog.text


def test_shutdown_drain_fires_armed_releases_now(tmp_path: Path) -> None:  # HOOK-025
    release = logging_hook(tmp_path, "rel")
    config = make(
        tmp_path,
        wc.DeviceConfig(name="gpu0", on_release=release, release_linger=3600),
        wc.DeviceConfig(name="gpu1", on_release=release, release_linger=3600),
    )

    async def go() -> None:
        h = hooks.Hooks(config, clock=FakeClock(), timings=T, base_env={})
        epoch = await acquired(h, "box:gpu0", "a", "alice")
        await h.release("box:gpu0", epoch, "a", "alice")
        await h.acquire("box:gpu1", "b", "", asyncio.Event())  # held, nothing armed
        assert h.armed == ["box:gpu0"]
        await h.drain()
        assert not h.devices["box:gpu0"].held
        assert h.devices["box:gpu1"].held
        await h.close()

    run(go())
    assert runs(tmp_path) == [["release", "a", "alice", "box:gpu0", "0"]]


def test_failed_release_only_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    release = script(tmp_path / "rel", "echo could not restart >&2; exit 4")  # HOOK-024
    config = make(tmp_path, wc.DeviceConfig(name="gpu0", on_release=release, release_linger=1))
    clock = FakeClock()

    async def go() -> None:
        h = hooks.Hooks(config, clock=clock, timings=FAST, base_env={})
        epoch = await acquired(h, "box:gpu0", "a", "")
        with caplog.at_level(logging.ERROR, logger="resource_controller.worker.hooks"):
            await h.release("box:gpu0", epoch, "a", "")
            await h.drain()
        assert not h.devices["box:gpu0"].held  # regardless of the result (HOOK-022)

    run(go())
    assert f"hook {release}: exited 4" in caplog.text
    assert "could not restart" in caplog.text
