"""Running a job: environment, output, outcomes, watchdogs, cancellation (§7-8, §11).

Real child processes throughout; every wait is bounded by ``run(..., timeout)``.
"""

from __future__ import annotations

import asyncio
import os
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
from worker_helpers import new_job_id, pids_with_job_prefix, run

from resource_controller import wire
from resource_controller.clock import Clock, FakeClock, SystemClock
from resource_controller.core import cuda
from resource_controller.core.states import JobState
from resource_controller.worker import procs, runner
from resource_controller.worker.timings import DEFAULT, Timings


def assignment(command: list[str], **fields: Any) -> wire.Assignment:
    fields.setdefault("job_id", new_job_id())
    fields.setdefault("device_id", "box:gpu1")
    return wire.Assignment(command=command, **fields)


class Collected:
    """An output sink that keeps what it was given."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.calls = 0

    async def __call__(self, chunk: bytes) -> None:
        self.data += chunk
        self.calls += 1


async def start(
    a: wire.Assignment,
    clock: Clock | None = None,
    base_env: dict[str, str] | None = None,
    timings: Timings = DEFAULT,
    kill_grace: float | None = None,
) -> tuple[asyncio.Task[runner.Outcome], asyncio.Event, Collected]:
    out = Collected()
    cancel = asyncio.Event()
    clock = clock or SystemClock()

    async def run_job() -> runner.Outcome:
        started = await runner.start_job(
            a, clock=clock, base_env=os.environ if base_env is None else base_env
        )
        if isinstance(started, runner.Outcome):
            return started
        return await runner.supervise_job(
            a,
            started,
            on_output=out,
            cancel=cancel,
            clock=clock,
            timings=timings,
            kill_grace=lambda: kill_grace,
        )

    return asyncio.create_task(run_job()), cancel, out


def run_job(a: wire.Assignment, timeout: float = 20.0) -> tuple[runner.Outcome, bytes, float]:
    async def go() -> tuple[runner.Outcome, bytes, float]:
        began = time.monotonic()
        task, _, out = await start(a)
        outcome = await task
        return outcome, bytes(out.data), time.monotonic() - began

    return run(go(), timeout)


class WatchedClock(FakeClock):
    """A fake clock that counts its monotonic readings.

    The runner reads the spawn instant (where max runtime and idleness count from)
    only once the spawn has completed, which can be well after the process shows in
    ``/proc`` on a loaded machine; a test that moves the clock before that reading
    moves the start along with it. Two readings mean the spawn instant is taken and
    the watchdog loop is running.
    """

    def __init__(self) -> None:
        super().__init__()
        self.readings = 0

    def monotonic(self) -> float:
        self.readings += 1
        return super().monotonic()

    async def supervised(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while self.readings < 2:
            assert time.monotonic() < deadline, "supervision never started"
            await asyncio.sleep(0.01)


async def wait_for_job_process(job_id: str, timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while not (pids := pids_with_job_prefix(job_id)):
        assert time.monotonic() < deadline, "job process never appeared"
        await asyncio.sleep(0.02)
    return pids


# ---- device index and environment ----------------------------------------------


@pytest.mark.parametrize(
    ("device_id", "index"),
    [
        ("box:gpu1", "1"),
        ("box:gpu01", "01"),
        ("box:gpu12", "12"),
        ("box:mydevice", None),
        ("box:", None),
        ("gpu1", None),
        ("box:slot0", "0"),
        ("box:a:b7", "7"),  # the part after the FIRST colon
        ("box:gpu١", None),  # Arabic-Indic digit: only ASCII counts
        ("box:gpu" + "9" * 19, None),  # does not fit a signed 64-bit integer
        ("box:gpu" + "0" * 30 + "5", "0" * 30 + "5"),
    ],
)
def test_device_index(device_id: str, index: str | None) -> None:  # WRK-077
    assert cuda.device_index(device_id) == index


def test_cuda_visible_devices_for_several_devices() -> None:  # EXT-GANG-4 shape
    assert cuda.cuda_visible_devices(["b:gpu0", "b:gpu3"]) == "0,3"
    assert cuda.cuda_visible_devices(["b:gpu0", "b:nvme"]) is None


def env_for(device_id: str, job_env: dict[str, str] | None, base: dict[str, str]) -> dict[str, str]:
    a = wire.Assignment(job_id="j", device_id=device_id, command=["x"], env=job_env)
    return runner.build_env(a, base)


def test_cuda_visible_devices_derivation() -> None:  # WRK-076
    base = {"CUDA_VISIBLE_DEVICES": "7", "PATH": "/bin"}
    assert env_for("box:gpu1", None, base)["CUDA_VISIBLE_DEVICES"] == "1"
    assert env_for("box:gpu01", None, base)["CUDA_VISIBLE_DEVICES"] == "01"
    # No index: the inherited value passes through, nothing is invented.
    assert env_for("box:mydevice", None, base)["CUDA_VISIBLE_DEVICES"] == "7"
    assert "CUDA_VISIBLE_DEVICES" not in env_for("box:mydevice", None, {})
    # A job-supplied key is left exactly as supplied, even empty.
    assert env_for("box:gpu1", {"CUDA_VISIBLE_DEVICES": ""}, base)["CUDA_VISIBLE_DEVICES"] == ""
    assert env_for("box:gpu1", {"CUDA_VISIBLE_DEVICES": "3"}, {})["CUDA_VISIBLE_DEVICES"] == "3"


def test_env_precedence() -> None:  # WRK-075, EXT-LIVE-1, EXT-EPOCH-2
    base = {"A": "worker", "B": "worker", "RC_LEASE_EPOCH": "99", "PYTHONUNBUFFERED": "0"}
    job = {"B": "job", "RC_JOB_ID": "fake", "RC_DEVICE": "fake:dev"}
    a = wire.Assignment(job_id="j1", device_id="h:gpu2", command=["x"], env=job, lease_epoch=12)
    env = runner.build_env(a, base)
    assert env["A"] == "worker"
    assert env["B"] == "job"
    assert env["RC_JOB_ID"] == "j1"  # always wins
    assert env["RC_DEVICE"] == "h:gpu2"
    assert env["RC_DEVICES"] == "h:gpu2"
    assert env["RC_LEASE_EPOCH"] == "12"
    assert env["PYTHONUNBUFFERED"] == "1"  # unless the job's own env sets it
    a = wire.Assignment(job_id="j1", device_id="h:x", command=["x"], env={"PYTHONUNBUFFERED": ""})
    env = runner.build_env(a, base)
    assert env["PYTHONUNBUFFERED"] == ""
    assert "RC_LEASE_EPOCH" not in env  # no epoch on the assignment; inherited one dropped


def test_hold_runs_the_sleeper_whatever_the_command() -> None:  # WRK-080, WRK-125
    a = wire.Assignment(job_id="j", device_id="h:g", command=["rm", "-rf", "/"], kind="hold")
    assert runner.job_argv(a) == ["sleep", "2147483647"]
    assert runner.job_argv(a.model_copy(update={"kind": "job"})) == ["rm", "-rf", "/"]


# ---- real processes: output and outcomes ---------------------------------------


def test_stdout_and_stderr_share_one_pipe_in_order() -> None:  # WRK-081
    script = "echo a; echo b >&2; echo c; echo d >&2; printf e"
    outcome, data, _ = run_job(assignment(["sh", "-c", script]))
    assert outcome == runner.Outcome(JobState.SUCCEEDED, 0)
    assert data == b"a\nb\nc\nd\ne"


def test_job_sees_its_environment_cwd_and_null_stdin(tmp_path: Path) -> None:
    a = assignment(
        ["sh", "-c", 'echo "$RC_JOB_ID $RC_DEVICE $CUDA_VISIBLE_DEVICES $X"; pwd; cat'],
        device_id="box:gpu3",
        env={"X": "from-job"},
        cwd=str(tmp_path),
    )
    outcome, data, _ = run_job(a)
    assert outcome.state == JobState.SUCCEEDED
    assert data.decode() == f"{a.job_id} box:gpu3 3 from-job\n{tmp_path}\n"  # stdin empty


def test_command_is_resolved_through_the_jobs_path(tmp_path: Path) -> None:  # WRK-080
    script = tmp_path / "mytool"
    script.write_text("#!/bin/sh\necho tool:$1\n")
    script.chmod(0o755)
    a = assignment(["mytool", "x"], env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    outcome, data, _ = run_job(a)
    assert (outcome.state, data) == (JobState.SUCCEEDED, b"tool:x\n")


@pytest.mark.parametrize(("code", "state"), [(0, JobState.SUCCEEDED), (3, JobState.FAILED)])
def test_exit_codes(code: int, state: JobState) -> None:  # WRK-099, WRK-100
    outcome, _, _ = run_job(assignment(["sh", "-c", f"exit {code}"]))
    assert outcome == runner.Outcome(state, code)


def test_signal_death() -> None:  # WRK-099
    outcome, _, _ = run_job(assignment(["sh", "-c", "kill -9 $$"]))
    assert outcome == runner.Outcome(JobState.KILLED, 137, "signal: killed")
    outcome, _, _ = run_job(assignment(["sh", "-c", "kill -SEGV $$"]))
    assert outcome == runner.Outcome(JobState.KILLED, 139, "signal: segmentation fault")


def test_start_errors(tmp_path: Path) -> None:  # WRK-100
    outcome, _, _ = run_job(assignment([]))
    assert outcome == runner.Outcome(JobState.FAILED, -1, "empty command")

    outcome, _, _ = run_job(assignment(["no-such-program-xyz"]))
    assert (outcome.state, outcome.exit_code) == (JobState.FAILED, -1)
    assert outcome.reason.startswith("start: ") and "not found" in outcome.reason

    missing = str(tmp_path / "nope")
    outcome, _, _ = run_job(assignment([missing]))
    assert outcome.reason == f"start: exec {missing}: no such file or directory"

    outcome, _, _ = run_job(assignment(["true"], cwd=missing))
    assert outcome == runner.Outcome(JobState.FAILED, -1, f"cwd {missing}: no such directory")

    plain = tmp_path / "plain.sh"
    plain.write_text("echo hi\n")
    plain.chmod(0o644)
    outcome, _, _ = run_job(assignment([str(plain)]))
    assert outcome == runner.Outcome(JobState.FAILED, -1, f"start: exec {plain}: permission denied")


def test_a_cwd_that_cannot_be_used_is_named(tmp_path: Path) -> None:  # EXT-HERE-4, WRK-100
    # The command exists and would run; the reason names the directory, not the program.
    missing = tmp_path / "gone" / "x"
    outcome, _, _ = run_job(assignment(["pwd"], cwd=str(missing)))
    assert outcome == runner.Outcome(JobState.FAILED, -1, f"cwd {missing}: no such directory")

    plain = tmp_path / "a-file"
    plain.write_text("")
    outcome, _, _ = run_job(assignment(["pwd"], cwd=str(plain)))
    assert outcome == runner.Outcome(JobState.FAILED, -1, f"cwd {plain}: not a directory")

    outcome, _, _ = run_job(assignment(["pwd"], cwd=str(plain / "below")))
    assert outcome == runner.Outcome(JobState.FAILED, -1, f"cwd {plain / 'below'}: not a directory")


def test_check_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # EXT-HERE-4
    assert runner.check_cwd(str(tmp_path)) is None
    assert runner.check_cwd(str(tmp_path / "no")) == f"cwd {tmp_path / 'no'}: no such directory"
    # Not searchable by this user (root passes every access check, so it is simulated).
    with monkeypatch.context() as m:
        m.setattr("resource_controller.worker.runner.os.access", lambda *_: False)
        denied = runner.check_cwd(str(tmp_path))
    assert denied == f"cwd {tmp_path}: permission denied"

    def refuse(path: str) -> os.stat_result:
        raise PermissionError(13, "Permission denied", path)

    with monkeypatch.context() as m:
        m.setattr("resource_controller.worker.runner.os.stat", refuse)
        locked = runner.check_cwd("/locked/x")
    assert locked == "cwd /locked/x: permission denied"


def test_background_child_holding_the_pipe_keeps_the_job_running() -> None:  # WRK-082
    outcome, data, took = run_job(assignment(["sh", "-c", "(sleep 0.6; echo late) & echo early"]))
    assert outcome == runner.Outcome(JobState.SUCCEEDED, 0)
    assert data == b"early\nlate\n"
    assert took >= 0.5


def test_stragglers_are_reaped_after_exit() -> None:  # WRK-099
    a = assignment(["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo done"])
    outcome, data, took = run_job(a)
    assert outcome == runner.Outcome(JobState.KILLED, 0, "stragglers reaped after exit")
    assert data == b"done\n"
    assert took < 3
    assert pids_with_job_prefix(a.job_id) == []


# ---- watchdogs -----------------------------------------------------------------


def test_max_runtime_watchdog() -> None:  # WRK-094
    outcome, _, took = run_job(assignment(["sleep", "30"], max_runtime_seconds=1))
    assert outcome == runner.Outcome(JobState.KILLED, 143, "max_runtime exceeded (1s)")
    assert 1.0 <= took < 3


def test_idle_watchdog() -> None:  # WRK-094
    a = assignment(["sh", "-c", "echo once; exec sleep 30"], idle_timeout_seconds=1)
    outcome, data, took = run_job(a)
    assert outcome == runner.Outcome(JobState.KILLED, 143, "idle: no output for 1s")
    assert data == b"once\n"
    assert 1.0 <= took < 3


def test_output_resets_the_idle_clock() -> None:  # WRK-094
    script = "for i in 1 2 3 4; do echo $i; sleep 0.4; done"
    outcome, data, _ = run_job(assignment(["sh", "-c", script], idle_timeout_seconds=1))
    assert outcome == runner.Outcome(JobState.SUCCEEDED, 0)
    assert data == b"1\n2\n3\n4\n"


def test_watchdogs_read_the_injected_clock() -> None:  # WRK-094: decided on the clock
    clock = WatchedClock()

    async def go() -> runner.Outcome:
        a = assignment(["sleep", "30"], max_runtime_seconds=3600, idle_timeout_seconds=600)
        task, _, _ = await start(a, clock)
        await clock.supervised()
        await asyncio.sleep(0.3)
        assert not task.done()  # no real time would trip either limit
        clock.advance(3601)  # both are due: max runtime wins
        return await task

    outcome = run(go(), 10)
    assert outcome == runner.Outcome(JobState.KILLED, 143, "max_runtime exceeded (1h0m0s)")


def test_idle_trips_alone_on_the_clock() -> None:
    clock = WatchedClock()

    async def go() -> runner.Outcome:
        a = assignment(["sleep", "30"], max_runtime_seconds=3600, idle_timeout_seconds=300)
        task, _, _ = await start(a, clock)
        await clock.supervised()
        clock.advance(300)  # not strictly longer yet
        await asyncio.sleep(0.3)
        assert not task.done()
        clock.advance(1)
        return await task

    outcome = run(go(), 10)
    assert outcome == runner.Outcome(JobState.KILLED, 143, "idle: no output for 5m0s")


def test_hold_runs_the_sleeper_until_its_ttl() -> None:  # WRK-125, WRK-126
    clock = WatchedClock()

    async def go() -> runner.Outcome:
        a = assignment(["false"], kind="hold", max_runtime_seconds=60)
        task, _, _ = await start(a, clock)
        await clock.supervised()
        (pid,) = await wait_for_job_process(a.job_id)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert f.read() == b"sleep\x002147483647\x00"
        clock.advance(61)
        return await task

    outcome = run(go(), 10)
    assert outcome == runner.Outcome(JobState.KILLED, 143, "max_runtime exceeded (1m0s)")


# ---- cancellation --------------------------------------------------------------


def cancel_after_start(
    a: wire.Assignment,
    settle: float = 0.2,
    timings: Timings = DEFAULT,
    kill_grace: float | None = None,
) -> tuple[runner.Outcome, bytes]:
    async def go() -> tuple[runner.Outcome, bytes]:
        task, cancel, out = await start(a, timings=timings, kill_grace=kill_grace)
        await wait_for_job_process(a.job_id)
        await asyncio.sleep(settle)  # let the shell install its trap
        cancel.set()
        return await task, bytes(out.data)

    return run(go(), 20)


def test_cancel_an_ordinary_job() -> None:  # WRK-096
    outcome, _ = cancel_after_start(assignment(["sleep", "30"]))
    assert outcome == runner.Outcome(JobState.KILLED, 143, "cancelled")


def test_cancel_a_job_that_traps_sigterm() -> None:  # WRK-096
    script = "trap 'echo got-term' TERM; echo ready; while :; do sleep 0.05; done"
    began = time.monotonic()
    outcome, data = cancel_after_start(
        assignment(["sh", "-c", script]), timings=Timings(kill_grace=0.5)
    )
    assert outcome == runner.Outcome(JobState.KILLED, 137, "cancelled")
    assert b"got-term" in data
    assert 0.5 <= time.monotonic() - began < 5


def test_a_kill_with_its_own_grace_uses_it() -> None:
    """EXT-PREEMPT-2: a preemption's kill carries its grace; the worker's ``kill_grace`` is
    for every other kill."""
    script = "trap 'echo got-term' TERM; echo ready; while :; do sleep 0.05; done"
    began = time.monotonic()
    outcome, _ = cancel_after_start(
        assignment(["sh", "-c", script]), timings=Timings(kill_grace=30), kill_grace=0.5
    )
    assert outcome == runner.Outcome(JobState.KILLED, 137, "cancelled")
    assert 0.5 <= time.monotonic() - began < 5


def test_cancel_keeps_the_exit_code_of_a_clean_trap() -> None:  # WRK-096 step 5
    script = "trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done"
    outcome, _ = cancel_after_start(assignment(["sh", "-c", script]))
    assert outcome == runner.Outcome(JobState.KILLED, 0, "cancelled")


def test_cancel_reaches_the_whole_group() -> None:
    a = assignment(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    outcome, _ = cancel_after_start(a)
    assert outcome.state == JobState.KILLED and outcome.reason == "cancelled"
    assert pids_with_job_prefix(a.job_id) == []


def test_cancelling_the_task_kills_the_group() -> None:
    a = assignment(["sh", "-c", "trap '' TERM; sleep 30"])

    async def go() -> None:
        task, _, _ = await start(a)
        await wait_for_job_process(a.job_id)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(go(), 10)
    deadline = time.monotonic() + 3
    while pids_with_job_prefix(a.job_id):
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_cancelled_in_the_middle_of_the_spawn_the_whole_group_dies() -> None:
    # The task torn down after the fork but before asyncio has connected the pipes:
    # asyncio's own clean-up kills only the leader, so the shell's child lived on
    # unsupervised until it ended by itself (here 30 s).
    a = assignment(["sh", "-c", "trap '' TERM; sleep 30"])
    landed: list[str] = []

    async def go() -> None:
        task, _, _ = await start(a)
        # Each turn of the loop runs one step: the job's, then the spawn's (fork and
        # exec done, the pipes' connection only scheduled), then ours.
        while not pids_with_job_prefix(a.job_id):
            await asyncio.sleep(0)
        # Hold the loop (so the spawn cannot complete) until the shell has its child.
        deadline = time.monotonic() + 10
        while len(pids_with_job_prefix(a.job_id)) < 2:
            assert time.monotonic() < deadline, "the shell never started its child"
            time.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError) as caught:
            await task
        landed.extend(f.name for f in traceback.extract_tb(caught.value.__traceback__))

    run(go(), 20)
    assert "start" in landed and "supervise" not in landed  # the spawn was in progress
    deadline = time.monotonic() + 10
    while pids_with_job_prefix(a.job_id):
        assert time.monotonic() < deadline, "the group outlived its cancelled spawn"
        time.sleep(0.02)


def test_plain_outcome_mapping() -> None:  # WRK-099, WRK-100
    assert runner.exit_code_of(-15) == 143
    assert runner.exit_code_of(2) == 2
    assert runner.exit_code_of(None) == -1
    assert procs.signal_word(15) == "terminated"
    assert os.path.exists("/proc/self/stat")
