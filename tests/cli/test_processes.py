"""``rc`` as a real process: signals (CLI-055..057, CLI-109, CLI-113) and live output (EXT-LIVE-2)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client.live import CLIENT, FakeWorker, LiveController, run_for_real, until_killed
from resource_controller.client import api

RC = str(Path(sys.executable).parent / "rc")

pytestmark = pytest.mark.e2e


@pytest.fixture
def env(controller: LiveController, tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "RC_CONTROLLER": controller.url,
        "RC_TOKEN": CLIENT,
        "RC_SUBMITTER": "tester",
        "RC_CONFIG": os.devnull,
    }


@pytest.fixture
def client(controller: LiveController) -> api.JsonClient:
    return api.JsonClient(controller.url, CLIENT, submitter="tester")


class Proc:
    """An ``rc`` child process whose stderr lines are collected as they come."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.p = subprocess.Popen(
            [RC, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.p.stderr is not None
        for raw in self.p.stderr:
            self.lines.append(raw.decode())

    def wait_line(self, pattern: str, timeout: float = 10) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m
            assert self.p.poll() is None or self.lines, "rc exited early"
            time.sleep(0.01)
        raise AssertionError(f"no line matching {pattern!r} in {self.lines}")

    def finish(self, timeout: float = 20) -> int:
        code = self.p.wait(timeout)
        self._thread.join(5)
        return code

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(5)


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.kill()


def occupy(client: api.JsonClient, worker: FakeWorker) -> str:
    worker.behaviour = until_killed
    job = client.submit(["block"], device="box:gpu0")
    deadline = time.monotonic() + 5
    while client.get_job(job["id"]).state != "running":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return str(job["id"])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_while_queued_cancels_and_exits_130(
    env: dict[str, str], worker: FakeWorker, client: api.JsonClient, procs: list[Proc], sig: int
) -> None:
    occupy(client, worker)
    proc = Proc(["run", "-d", "box:gpu0", "--", "true"], env)
    procs.append(proc)
    proc.wait_line(r"^rc: queued at position 1 for box:gpu0 — held by ")  # EXT-WHY-2
    proc.p.send_signal(sig)
    assert proc.finish() == 130
    m = proc.wait_line(r"^rc: cancelled queued job (\S+)$")
    assert client.get_job(m.group(1)).state == "killed"
    assert len(proc.lines) == 2  # nothing beyond the path's own messages (CLI-051)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_while_running_detaches_and_leaves_it_running(
    env: dict[str, str], worker: FakeWorker, client: api.JsonClient, procs: list[Proc], sig: int
) -> None:
    worker.behaviour = until_killed
    proc = Proc(["run", "-d", "box:gpu0", "--", "block"], env)
    procs.append(proc)
    job_id = proc.wait_line(r"^rc: job (\S+) on box:gpu0$").group(1)
    assert proc.p.stdout is not None
    assert proc.p.stdout.readline() == b"started\n"
    proc.p.send_signal(sig)
    assert proc.finish() == 130
    last = proc.lines[-1]
    assert job_id in last and "box:gpu0" in last and "STILL RUNNING" in last and "rc ps" in last
    time.sleep(0.3)
    assert client.get_job(job_id).state == "running"  # nothing was killed
    client.kill(job_id)


def test_interrupt_without_semantics_is_exit_1(env: dict[str, str], procs: list[Proc]) -> None:
    with socket.socket() as silent:  # accepts connections (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        proc = Proc(["ps"], {**env, "RC_CONTROLLER": url})
        procs.append(proc)
        time.sleep(0.5)
        proc.p.send_signal(signal.SIGINT)
        assert proc.finish() == 1
    assert len(proc.lines) == 1 and proc.lines[0].startswith("rc: ")


@pytest.mark.parametrize("args", [["attach"], ["logs", "-f"]])
def test_interrupt_attach_and_follow_is_130_silently(
    env: dict[str, str],
    worker: FakeWorker,
    client: api.JsonClient,
    procs: list[Proc],
    args: list[str],
) -> None:
    job_id = occupy(client, worker)
    proc = Proc([*args, job_id], env)
    procs.append(proc)
    assert proc.p.stdout is not None
    assert proc.p.stdout.readline() == b"started\n"
    proc.p.send_signal(signal.SIGINT)
    assert proc.finish() == 130
    assert proc.lines == []
    assert client.get_job(job_id).state == "running"


def test_output_streams_through_a_pipe_while_the_job_runs(
    env: dict[str, str], worker: FakeWorker, procs: list[Proc]
) -> None:
    release = threading.Event()

    def chatty(w: FakeWorker, a: dict[str, Any]) -> tuple[str, int | None, str]:
        w.append(a["job_id"], b"first\n")
        release.wait(10)
        w.append(a["job_id"], b"second\n")
        return ("succeeded", 0, "")

    worker.behaviour = chatty
    proc = Proc(["run", "-d", "box:gpu0", "--", "x"], env)
    procs.append(proc)
    assert proc.p.stdout is not None
    assert proc.p.stdout.readline() == b"first\n"  # arrives before the job ends
    release.set()
    assert proc.p.stdout.read() == b"second\n"
    assert proc.finish() == 0
    worker.behaviour = run_for_real


def test_broken_pipe_on_a_table_is_non_zero(env: dict[str, str], worker: FakeWorker) -> None:
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run(
            [RC, "devices"], env=env, stdout=w, stderr=subprocess.PIPE, timeout=20
        )
    finally:
        os.close(w)
    assert proc.returncode != 0
    assert b"Traceback" not in proc.stderr
