"""Process groups, /proc parsing, signal words, boot ID (§0, §8.1, §13)."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_helpers import run

from resource_controller.worker import procs


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts, each in its own session; killed and reaped afterwards."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        procs.signal_group(p.pid, signal.SIGKILL)
        p.kill()
        p.wait(timeout=5)


def spawn(started: list[subprocess.Popen[bytes]], script: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    started.append(p)
    return p


def wait_until(predicate: object, timeout: float = 5.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("signum", "word"),
    [
        (signal.SIGKILL, "killed"),
        (signal.SIGTERM, "terminated"),
        (signal.SIGINT, "interrupt"),
        (signal.SIGHUP, "hangup"),
        (signal.SIGSEGV, "segmentation fault"),
        (signal.SIGFPE, "floating point exception"),
        (signal.SIGUSR1, "user defined signal 1"),
        (signal.SIGTRAP, "trace/breakpoint trap"),
        (signal.SIGXCPU, "CPU time limit exceeded"),
        (40, "signal 40"),
    ],
)
def test_signal_words(signum: int, word: str) -> None:  # §0
    assert procs.signal_word(signum) == word


def test_os_error_text() -> None:  # §0
    exc = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
    assert procs.os_error_text("stat", "/x", exc) == "stat /x: no such file or directory"
    exc2 = PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    assert procs.os_error_text("open", "/d", exc2) == "open /d: permission denied"


def test_parse_stat_uses_the_last_parenthesis() -> None:  # WRK-093
    st = procs.parse_stat("42 (we) ird (name)) S 1 42 43 0 -1 4194560 0 0")
    assert st == procs.ProcStat("S", 1, 42, 43, 4194560)
    assert not st.exiting
    st = procs.parse_stat("42 (x) R 1 42 42 0 -1 4194564 0 0")
    assert st is not None and st.exiting  # PF_EXITING
    assert procs.parse_stat("7 (short) S 1 7 7") == procs.ProcStat("S", 1, 7, 7, 0)
    assert procs.parse_stat("garbage") is None
    assert procs.parse_stat("1 (x) Z") is None


def test_read_stat_of_ourselves() -> None:
    st = procs.read_stat(os.getpid())
    assert st is not None and st.pgrp == os.getpgrp() and st.state in "RS"


def test_group_alive_follows_live_members(spawned: list[subprocess.Popen[bytes]]) -> None:
    p = spawn(spawned, "sleep 30 & wait")
    assert procs.group_alive(p.pid)
    assert procs.signal_group(p.pid, signal.SIGKILL)
    p.wait(timeout=5)
    wait_until(lambda: not procs.group_alive(p.pid))


def test_zombie_is_not_alive(spawned: list[subprocess.Popen[bytes]]) -> None:  # WRK-092
    p = spawn(spawned, "exit 0")
    # Not reaped yet: the leader is a zombie that still answers signal 0.
    wait_until(lambda: (st := procs.read_stat(p.pid)) is not None and st.state == "Z")
    os.killpg(p.pid, 0)
    assert not procs.group_alive(p.pid)


def test_unreadable_proc_counts_as_alive(
    spawned: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:  # WRK-092
    p = spawn(spawned, "exit 0")
    wait_until(lambda: (st := procs.read_stat(p.pid)) is not None and st.state == "Z")
    monkeypatch.setattr(procs, "PROC_ROOT", "/nonexistent-proc")
    assert procs.group_alive(p.pid)


def test_signal_to_an_empty_group_is_not_delivered(
    spawned: list[subprocess.Popen[bytes]],
) -> None:
    p = spawn(spawned, "exit 0")
    p.wait(timeout=5)
    assert not procs.signal_group(p.pid, signal.SIGTERM)


def test_signal_group_refuses_dangerous_targets() -> None:
    assert not procs.signal_group(0, 0)
    assert not procs.signal_group(1, 0)


def test_escalate_kills_a_term_trapping_group(
    spawned: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:  # WRK-096 steps 2-4
    p = spawn(spawned, "trap '' TERM; sleep 30 & wait; sleep 30")
    time.sleep(0.1)

    async def go() -> procs.Teardown:
        loop = asyncio.get_running_loop()
        leader: asyncio.Future[None] = loop.create_future()

        async def reap() -> None:
            await asyncio.to_thread(p.wait)
            leader.set_result(None)

        reaper = asyncio.create_task(reap())
        try:
            return await procs.escalate(p.pid, [leader], leader, grace=0.3)
        finally:
            await reaper

    started = time.monotonic()
    teardown = run(go())
    assert teardown.term_delivered
    assert not teardown.survivors
    assert p.returncode == -signal.SIGKILL
    assert 0.3 <= time.monotonic() - started < 5
    assert not procs.group_alive(p.pid)


def test_reap_group_empties_a_group(spawned: list[subprocess.Popen[bytes]]) -> None:
    p = spawn(spawned, "sleep 30 & sleep 30 & wait")
    time.sleep(0.05)
    assert run(procs.reap_group(p.pid))
    p.wait(timeout=5)


def test_boot_id_from_the_kernel_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("  6f1e-abc \n")
    monkeypatch.setattr(procs, "BOOT_ID_PATH", str(boot))
    assert procs.read_boot_id() == "6f1e-abc"  # WRK-135: trimmed


def test_boot_id_falls_back_to_btime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3\nbtime  1700000000 \nprocesses 5\n")
    monkeypatch.setattr(procs, "BOOT_ID_PATH", str(tmp_path / "missing"))
    monkeypatch.setattr(procs, "PROC_STAT_PATH", str(stat))
    assert procs.read_boot_id() == "btime-1700000000"
    monkeypatch.setattr(procs, "PROC_STAT_PATH", str(tmp_path / "missing-too"))
    assert procs.read_boot_id() == ""


def test_boot_id_is_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    procs.boot_id.cache_clear()
    first = procs.boot_id()
    monkeypatch.setattr(procs, "BOOT_ID_PATH", str(tmp_path / "missing"))
    monkeypatch.setattr(procs, "PROC_STAT_PATH", str(tmp_path / "missing"))
    assert procs.boot_id() == first
