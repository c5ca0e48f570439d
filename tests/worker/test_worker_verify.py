"""The verify pass (worker.md §17): real scripts in a temp ``verify_dir``."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
from worker_helpers import run

from resource_controller.clock import SystemClock
from resource_controller.worker import verify
from resource_controller.worker.timings import Timings

T = Timings(kill_grace=0.3, watchdog_period=0.02)


def script(path: Path, body: str, mode: int = 0o755) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(mode)
    return path


def vpass(directory: Path | str, timeout: float = 5, budget: float = 30) -> verify.VerifyOutcome:
    return run(
        verify.verify_pass(
            str(directory),
            device_id="box:gpu2",
            job_id="job-1",
            submitter="alice",
            timeout=timeout,
            budget=budget,
            clock=SystemClock(),
            timings=T,
            base_env={"PATH": os.defpath, "CUDA_VISIBLE_DEVICES": "7"},
        )
    )


def test_missing_dir_is_off(tmp_path: Path) -> None:  # VERIFY-001
    assert vpass(tmp_path / "absent") == verify.VerifyOutcome()


def test_unlistable_dir_fails(tmp_path: Path) -> None:  # VERIFY-002
    not_dir = tmp_path / "file"
    not_dir.write_text("")
    assert (
        vpass(not_dir).reason == f"verify failed: read verify_dir: open {not_dir}: not a directory"
    )


def test_order_env_skips_and_first_failure_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:  # VERIFY-003..006
    d = tmp_path / "verify.d"
    d.mkdir()
    (d / "subdir").mkdir()
    log = tmp_path / "ran"
    env = f'echo "$(basename "$0") $RC_EVENT $RC_DEVICE $RC_JOB_ID $RC_SUBMITTER $CUDA_VISIBLE_DEVICES" >> {log}'
    script(d / "20-b", env + "\necho 'ecc errors: 3' >&2\nexit 2")
    script(d / "10-a", env)
    script(d / ".hidden", env)
    script(d / "30-c", env + "\nexit 5")  # a later failure: runs, not kept
    script(d / "15-plain", env, mode=0o644)
    with caplog.at_level(logging.WARNING, logger="resource_controller.worker.verify"):
        result = vpass(d)
    assert result.reason == "verify failed: 20-b: exited 2: ecc errors: 3"
    assert result.ran == 4
    lines = log.read_text().splitlines()
    assert [line.split()[0] for line in lines] == [".hidden", "10-a", "20-b", "30-c"]
    assert lines[0].split()[1:] == ["verify", "box:gpu2", "job-1", "alice", "2"]
    assert "15-plain" in caplog.text and "-rw-r--r--" in caplog.text


def test_dangling_symlink_and_directory_symlink_fail(tmp_path: Path) -> None:  # VERIFY-003
    d = tmp_path / "verify.d"
    d.mkdir()
    (d / "a-gone").symlink_to(tmp_path / "nowhere")
    assert vpass(d).reason == (
        f"verify failed: a-gone: stat: stat {d / 'a-gone'}: no such file or directory"
    )
    (d / "a-gone").unlink()
    (tmp_path / "real").mkdir()
    (d / "b-dir").symlink_to(tmp_path / "real")
    reason = vpass(d).reason
    assert reason.startswith("verify failed: b-dir: run: start: exec ")
    assert reason.endswith("permission denied")


def test_unreadable_script_fails(tmp_path: Path) -> None:
    d = tmp_path / "verify.d"
    d.mkdir()
    script(d / "x", "exit 0", mode=0o111)
    if os.geteuid() == 0:
        # root reads anything: make the interpreter the unreadable part instead.
        (d / "x").write_text("#!/nonexistent/sh\n")
    assert vpass(d).reason.startswith("verify failed: x: ")


def test_timeout_goes_through_the_cancellation_path(tmp_path: Path) -> None:  # VERIFY-004
    d = tmp_path / "verify.d"
    d.mkdir()
    script(d / "hang", "echo stuck >&2; exec sleep 30")
    t0 = time.monotonic()
    assert (
        vpass(d, timeout=0.3).reason == "verify failed: hang: max_runtime exceeded (300ms): stuck"
    )
    assert time.monotonic() - t0 < 5


def test_stderr_tail_truncation(tmp_path: Path) -> None:  # VERIFY-006
    d = tmp_path / "verify.d"
    d.mkdir()
    script(
        d / "long", "printf '  '; head -c 300 /dev/zero | tr '\\0' x >&2; printf END >&2; exit 1"
    )
    reason = vpass(d).reason
    assert reason == "verify failed: long: exited 1: ...(truncated)" + "x" * 197 + "END"
    script(d / "long", "head -c 70000 /dev/zero | tr '\\0' y >&2; exit 1")
    reason = vpass(d).reason
    assert reason.endswith("...(truncated)" + "y" * 200 + " (stderr itself was truncated)")


def test_pass_budget(tmp_path: Path) -> None:  # VERIFY-007
    d = tmp_path / "verify.d"
    d.mkdir()
    log = tmp_path / "ran"
    script(d / "a", f"echo a >> {log}; exec sleep 30")
    script(d / "b", f"echo b >> {log}")
    t0 = time.monotonic()
    assert (
        vpass(d, timeout=10, budget=0.4).reason == "verify failed: pass exceeded its 400ms budget"
    )
    assert time.monotonic() - t0 < 5
    assert log.read_text().split() == ["a"]  # an unfinished pass has proven nothing


def test_stragglers_fail_the_script(tmp_path: Path) -> None:
    d = tmp_path / "verify.d"
    d.mkdir()
    script(d / "bg", "sleep 30 >/dev/null 2>&1 &\nexit 0")
    assert vpass(d).reason == "verify failed: bg: stragglers reaped after exit"
