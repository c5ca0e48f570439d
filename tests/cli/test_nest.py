"""``rc run`` inside a job runs under the job's lease (EXT-NEST-1).

The decision is a pure function; the run itself is checked on real ``rc`` processes,
since it replaces the process: the exit code, the environment and a signal all reach
the command with nothing in between.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from client.live import CLIENT, FakeWorker, LiveController
from resource_controller.cli import common
from resource_controller.cli.nest import JobLease, chosen_device, current_lease, refuse_limits

RC = str(Path(sys.executable).parent / "rc")
JOB = "0b9f3c1e-5a4d-4c2b-9e8f-7a6b5c4d3e2f"


def nobody(selector: str) -> list[str]:
    raise AssertionError(f"no selector should be asked about, got {selector!r}")


def test_a_job_environment_names_the_lease() -> None:
    assert current_lease({}) is None
    assert current_lease({"RC_JOB_ID": JOB}) is None
    assert current_lease({"RC_DEVICE": "box:gpu0"}) is None
    assert current_lease({"RC_JOB_ID": JOB, "RC_DEVICE": "box:gpu0"}) == JobLease(
        JOB, ("box:gpu0",)
    )
    env = {"RC_JOB_ID": JOB, "RC_DEVICE": "box:gpu0", "RC_DEVICES": "box:gpu0,box:gpu1"}
    assert current_lease(env) == JobLease(JOB, ("box:gpu0", "box:gpu1"))


def test_which_requests_the_lease_answers() -> None:
    lease = JobLease(JOB, ("box:gpu0", "box:gpu1"))
    assert chosen_device(lease, "", "", nobody) == "box:gpu0"  # no particular device
    assert chosen_device(lease, "box:gpu1", "", nobody) == "box:gpu1"
    assert chosen_device(lease, "box:gpu0,box:gpu1", "", nobody) == "box:gpu0"
    assert chosen_device(lease, "box:gpu2", "", nobody) is None  # a different device
    assert chosen_device(lease, "box:gpu0,box:gpu2", "", nobody) is None
    assert chosen_device(lease, "", "vram>=40G", lambda s: ["box:gpu1", "other:gpu0"]) == "box:gpu1"
    assert chosen_device(lease, "", "vram>=80G", lambda s: ["other:gpu0"]) is None


def test_limits_of_its_own_are_refused() -> None:
    lease = JobLease(JOB, ("box:gpu0",))
    refuse_limits(lease, 0, 0)
    with pytest.raises(common.Failure, match="--max-runtime cannot apply here"):
        refuse_limits(lease, 60, 0)
    with pytest.raises(common.Failure, match="--idle-timeout cannot apply here"):
        refuse_limits(lease, 0, 60)


# ---- real processes (e2e: each test starts rc) -------------------------------------------


def job_env(
    tmp_path: Path, controller_url: str = "http://127.0.0.1:9", **extra: str
) -> dict[str, str]:
    """A job's environment; the controller URL points nowhere unless a test needs one."""
    return {
        **os.environ,
        "RC_CONTROLLER": controller_url,
        "RC_TOKEN": CLIENT,
        "RC_SUBMITTER": "tester",
        "RC_CONFIG": os.devnull,
        "RC_JOB_ID": JOB,
        "RC_DEVICE": "box:gpu0",
        "RC_DEVICES": "box:gpu0",
        **extra,
    }


def rc_run(
    env: dict[str, str], *args: str, timeout: float = 20
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RC, "run", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.e2e  # starts real rc processes
@pytest.mark.parametrize("target", [(), ("-d", "box:gpu0")])
def test_the_command_runs_at_once_with_its_exit_code_and_the_job_environment(
    tmp_path: Path, target: tuple[str, ...]
) -> None:
    # No controller answers at this URL: nothing is submitted, nothing waits.
    started = time.monotonic()
    result = rc_run(
        job_env(tmp_path),
        *target,
        "--env",
        "EXTRA=1",
        "--",
        "sh",
        "-c",
        'echo "$RC_JOB_ID $RC_DEVICE $EXTRA"; exit 7',
    )
    assert time.monotonic() - started < 10
    assert result.returncode == 7
    assert result.stdout == f"{JOB} box:gpu0 1\n"
    assert result.stderr == (
        f"rc: inside job {JOB}: running directly under its lease on box:gpu0"
        " (no new job, nothing queued)\n"
    )


@pytest.mark.e2e  # starts real rc processes
def test_cwd_applies_and_a_missing_command_is_127(tmp_path: Path) -> None:
    result = rc_run(job_env(tmp_path), "--cwd", str(tmp_path), "--", "pwd")
    assert (result.returncode, result.stdout) == (0, f"{tmp_path}\n")
    missing = rc_run(job_env(tmp_path), "--", "no-such-command-here")
    assert missing.returncode == 127
    assert "cannot run no-such-command-here" in missing.stderr


@pytest.mark.e2e  # starts real rc processes
def test_a_limit_is_refused_before_anything_runs(tmp_path: Path) -> None:
    result = rc_run(job_env(tmp_path), "--max-runtime", "1m", "--", "touch", str(tmp_path / "x"))
    assert result.returncode == 1
    assert "--max-runtime cannot apply here" in result.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.e2e  # starts real rc processes
def test_a_signal_reaches_the_command_itself(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            RC,
            "run",
            "--",
            "sh",
            "-c",
            'trap "exit 42" TERM; echo ready; while :; do sleep 0.1; done',
        ],
        env=job_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 42
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


@pytest.mark.e2e  # starts real rc processes
def test_a_different_device_takes_a_new_lease(
    tmp_path: Path, controller: LiveController, worker: FakeWorker
) -> None:
    result = rc_run(job_env(tmp_path, controller.url), "-d", "box:gpu1", "--", "echo", "elsewhere")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "elsewhere\n"
    assert "inside job" not in result.stderr
    assert "on box:gpu1" in result.stderr  # the ordinary announcement of a new job


@pytest.mark.e2e  # starts real rc processes
def test_a_selector_the_held_device_matches_runs_under_the_lease(
    tmp_path: Path, controller: LiveController
) -> None:
    labelled = FakeWorker(controller, labels={"gpu0": {"k": "a"}, "gpu1": {"k": "b"}})
    try:
        env = job_env(tmp_path, controller.url)
        held = rc_run(env, "--select", "k=a", "--", "echo", "nested")
        assert (held.returncode, held.stdout) == (0, "nested\n")
        assert "inside job" in held.stderr
        other = rc_run(env, "--select", "k=b", "--", "echo", "new")
        assert (other.returncode, other.stdout) == (0, "new\n")
        assert "inside job" not in other.stderr and "on box:gpu1" in other.stderr
    finally:
        labelled.stop()
