"""Ending a finished job's stragglers by ``RC_JOB_ID`` (WRK-120..123).

Real escapees: processes started with ``setsid`` so they leave every group and session
the job had, found again by their environment. The few cases no real process can show
(one that survives SIGKILL, an environment that cannot be read) use a ``/proc`` tree
built in a temporary directory, with PIDs above the kernel's ``pid_max`` so that the
signals the pass really sends can reach nobody.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_controller import FakeController, Running, job, until
from worker_helpers import new_job_id, pids_with_job_prefix, run

from resource_controller.worker import procs, stragglers
from resource_controller.worker.timings import Timings

#: A shell line that leaves one escapee behind: new session, no inherited pipe.
ESCAPE = "setsid sleep 1000 </dev/null >/dev/null 2>&1 &"
#: The same for a job, which then waits until the escapee has really left its process
#: group (the file appears only after ``setsid``): otherwise the runner could still
#: catch it in the group as a straggler, which is a different rule (WRK-099).
JOB_ESCAPE = (
    "setsid sh -c 'touch \"$LEFT\"; exec sleep 1000' </dev/null >/dev/null 2>&1 & "
    'while [ ! -e "$LEFT" ]; do sleep 0.01; done; '
)


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=5)


def start_escapee(
    started: list[subprocess.Popen[bytes]], job_id: str, script: str = ESCAPE, count: int = 1
) -> list[int]:
    """Run ``script`` with ``RC_JOB_ID=job_id``; return the ``count`` escapees it leaves."""
    env = {**os.environ, "RC_JOB_ID": job_id}
    p = subprocess.Popen(["sh", "-c", script], env=env, start_new_session=True)
    started.append(p)
    p.wait(timeout=5)
    deadline = time.monotonic() + 5
    while len(pids := exactly(job_id)) < count:
        assert time.monotonic() < deadline, "the escapee never appeared"
        time.sleep(0.01)
    return pids


def exactly(job_id: str) -> list[int]:
    """Live processes whose RC_JOB_ID is exactly ``job_id``."""
    return [
        p
        for p in pids_with_job_prefix(job_id)
        if (scan := procs.scan_carriers()) is not None and scan.pids.get(p) == job_id
    ]


def test_escaped_process_is_ended(spawned: list[subprocess.Popen[bytes]]) -> None:  # WRK-121
    job_id = new_job_id()
    pids = start_escapee(spawned, job_id)
    report = run(stragglers.clear(job_id))
    assert report.scanned and report.clean
    assert set(report.found) == set(pids) and report.remaining == ()
    assert exactly(job_id) == []


def test_match_is_exact(spawned: list[subprocess.Popen[bytes]]) -> None:  # WRK-121 step 4
    job_id = new_job_id()
    longer = start_escapee(spawned, job_id + "0")  # shares the whole ID as a prefix
    target = start_escapee(spawned, job_id)
    report = run(stragglers.clear(job_id))
    assert set(report.found) == set(target)
    assert exactly(job_id + "0") == longer  # untouched
    assert run(stragglers.clear(job_id + "0")).found == tuple(longer)


def test_term_ignoring_escapee_gets_sigkill(
    spawned: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:  # WRK-121 steps 6-7
    job_id = new_job_id()
    script = "setsid sh -c \"trap '' TERM; sleep 1000\" </dev/null >/dev/null 2>&1 &"
    pids = start_escapee(spawned, job_id, script, count=2)  # the shell and its sleep
    began = time.monotonic()
    report = run(stragglers.clear(job_id, Timings(straggler_term=0.3)))
    assert time.monotonic() - began >= 0.3  # the whole TERM phase was waited out
    assert set(pids) <= set(report.found) and report.remaining == ()
    assert exactly(job_id) == []


def test_the_worker_and_its_ancestors_are_protected(
    spawned: list[subprocess.Popen[bytes]],
) -> None:  # WRK-121 step 2
    # A worker started from inside a job inherits its RC_JOB_ID, and so does its
    # parent: here a shell carrying the ID runs the clearing process.
    job_id = new_job_id()
    code = (
        "import asyncio, json, os; from resource_controller.worker import stragglers; "
        f"r = asyncio.run(stragglers.clear({job_id!r})); "
        "print(json.dumps({'me': os.getpid(), 'parent': os.getppid(), "
        "'found': r.found, 'remaining': r.remaining}))"
    )
    script = f'{ESCAPE}\nsleep 0.2\n"$PY" -c "$CODE"\necho parent-still-here'
    env = {**os.environ, "RC_JOB_ID": job_id, "PY": sys.executable, "CODE": code}
    p = subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30, check=True
    )
    line, tail = p.stdout.strip().splitlines()
    seen = json.loads(line)
    assert tail == "parent-still-here"
    assert seen["me"] not in seen["found"] and seen["parent"] not in seen["found"]
    assert len(seen["found"]) == 1 and seen["remaining"] == []
    assert exactly(job_id) == []


def test_empty_job_id_clears_nothing() -> None:  # WRK-121 step 1
    report = run(stragglers.clear(""))
    assert not report.scanned and not report.clean


# ---- what no real process can show -------------------------------------------


def fake_process(
    root: Path, pid: int, environ: bytes | None, *, state: str = "S", ppid: int = 1
) -> None:
    """One ``/proc/<pid>`` entry; ``environ=None`` makes the file unreadable (a directory)."""
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(f"{pid} (fake) {state} {ppid} {pid} {pid} 0 -1 0\n")
    if environ is None:
        (d / "environ").mkdir()  # reading it fails with EISDIR: not "gone", so blind
    else:
        (d / "environ").write_bytes(environ)


@pytest.fixture
def beyond_pid_max() -> int:
    limit = int(Path("/proc/sys/kernel/pid_max").read_text())
    if limit >= 9_000_000:
        pytest.skip("pid_max leaves no PID that can never exist")
    return 9_000_001


def test_survivor_and_blindness_are_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, beyond_pid_max: int
) -> None:  # WRK-121, WRK-122
    monkeypatch.setattr(procs, "PROC_ROOT", str(tmp_path))
    pid = beyond_pid_max
    fake_process(tmp_path, pid, b"A=1\0RC_JOB_ID=job-7\0")  # never dies: "remaining"
    fake_process(tmp_path, pid + 1, None)  # unreadable environment
    fake_process(tmp_path, pid + 2, b"RC_JOB_ID=job-7\0", state="Z")  # zombie: not live
    fake_process(tmp_path, pid + 3, b"RC_JOB_ID=\0RC_JOB_ID=job-7\0")  # first non-empty
    fake_process(tmp_path, pid + 4, b"RC_JOB_ID=job-77\0")  # not an exact match
    (tmp_path / str(pid + 5)).mkdir()  # vanished: no stat
    (tmp_path / "self").mkdir()
    report = run(stragglers.clear("job-7", Timings(straggler_term=0.05, straggler_kill=0.05)))
    assert report.scanned and report.blind and not report.clean
    assert report.found == (pid, pid + 3)
    assert report.remaining == (pid, pid + 3)


def test_a_zombie_whose_environment_cannot_be_read_is_not_blindness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, beyond_pid_max: int
) -> None:  # WRK-121 step 3: zombies are skipped before their environment matters
    monkeypatch.setattr(procs, "PROC_ROOT", str(tmp_path))
    fake_process(tmp_path, beyond_pid_max, None, state="Z")
    fake_process(tmp_path, beyond_pid_max + 1, b"A=1\0")
    report = run(stragglers.clear("job-7"))
    assert report.scanned and not report.blind and report.clean and report.found == ()


def test_the_sweep_agrees_with_the_full_table_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, beyond_pid_max: int
) -> None:  # WRK-121: reading environments first changes the cost, never the verdicts
    monkeypatch.setattr(procs, "PROC_ROOT", str(tmp_path))
    pid = beyond_pid_max
    cases = [
        (b"RC_JOB_ID=job-7\0", "S"),
        (b"RC_JOB_ID=job-7\0", "Z"),
        (b"RC_JOB_ID=\0X=1\0RC_JOB_ID=job-7\0", "R"),
        (b"RC_JOB_ID=job-77\0", "S"),
        (b"RC_JOB_ID=job-\0", "S"),
        (b"", "S"),
        (None, "S"),
        (None, "Z"),
    ]
    for n, (environ, state) in enumerate(cases):
        fake_process(tmp_path, pid + n, environ, state=state)
    (tmp_path / str(pid + len(cases))).mkdir()  # no stat, no environ: vanished
    (tmp_path / "self").mkdir()
    protected = frozenset({pid + 2})
    full = procs.scan_carriers(exclude=protected)
    assert full is not None
    expected = {p: value for p, value in full.pids.items() if value == "job-7"}
    assert procs.scan_carriers(protected, "job-7") == procs.Carriers(expected, full.blind)
    assert list(expected) == [pid] and full.blind


def test_unreadable_proc_is_not_a_clean_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # WRK-121 step 5
    monkeypatch.setattr(procs, "PROC_ROOT", str(tmp_path / "missing"))
    report = run(stragglers.clear("job-7"))
    assert not report.scanned and not report.clean


def test_job_id_in_environ() -> None:  # WRK-121 step 3
    assert procs.job_id_in_environ(b"A=1\0RC_JOB_ID=x\0RC_JOB_ID=y\0") == "x"
    assert procs.job_id_in_environ(b"RC_JOB_ID=\0RC_JOB_ID=y\0") == "y"
    assert procs.job_id_in_environ(b"RC_JOB_ID=\0") == ""
    assert procs.job_id_in_environ(b"XRC_JOB_ID=x\0") == ""
    assert procs.job_id_in_environ(b"") == ""


def test_report_logging(caplog: pytest.LogCaptureFixture) -> None:  # WRK-122
    with caplog.at_level(logging.WARNING, logger="resource_controller.worker.stragglers"):
        stragglers.log_report(
            "j1", stragglers.StragglerReport(scanned=True, found=(5, 6), remaining=(6,))
        )
        stragglers.log_report("j2", stragglers.StragglerReport(scanned=True, found=(7,)))
        stragglers.log_report("j3", stragglers.StragglerReport(scanned=True))
    levels = {(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records}
    assert levels == {("ERROR", "job j1"), ("WARNING", "job j2")}
    assert "6" in caplog.records[0].getMessage() and "may still be occupied" in caplog.text


# ---- inside the agent --------------------------------------------------------


def test_agent_clears_stragglers_after_a_clean_exit_without_changing_the_outcome(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:  # WRK-072 step 7, WRK-120, WRK-122
    ctl = FakeController()
    a = job(["sh", "-c", f"{JOB_ESCAPE} echo left-a-daemon"], env={"LEFT": str(tmp_path / "x")})
    ctl.hand_out(a)

    async def go() -> None:
        r = await Running(ctl).started()
        await until(lambda: bool(ctl.terminal(a["job_id"])))
        await r.finish()

    with caplog.at_level(logging.WARNING, logger="resource_controller.worker.stragglers"):
        run(go())
    assert ctl.terminal(a["job_id"]) == [{"state": "succeeded", "exit_code": 0, "worker_id": "w-1"}]
    assert exactly(a["job_id"]) == []
    assert f"job {a['job_id']}: swept 1 escaped process" in caplog.text


def test_agent_clears_stragglers_after_a_kill(tmp_path: Path) -> None:  # WRK-120: every path
    ctl = FakeController()
    a = job(["sh", "-c", f"{JOB_ESCAPE} exec sleep 30"], env={"LEFT": str(tmp_path / "x")})
    ctl.hand_out(a)

    async def go() -> None:
        r = await Running(ctl).started()
        await until(
            lambda: (tmp_path / "x").exists() and len(pids_with_job_prefix(a["job_id"])) == 2
        )
        ctl.hand_out(kills=[a["job_id"]])
        await until(lambda: bool(ctl.terminal(a["job_id"])))
        await r.finish()

    run(go())
    (report,) = ctl.terminal(a["job_id"])
    assert (report["state"], report["reason"]) == ("killed", "cancelled")
    assert exactly(a["job_id"]) == []
