"""``rc run --tty`` at a real terminal, against real processes (CLI-115..119).

``ttyproc.PtyRc`` gives ``rc`` a pseudo-terminal of the test's own: the test types,
reads the echo, resizes the window, presses Ctrl-C, and compares the terminal's
attributes before and after.
"""

from __future__ import annotations

import secrets
import signal
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .cluster import Cluster, wait_for
from .ttyproc import PtyRc


@pytest.fixture
def terminals() -> Iterator[list[PtyRc]]:
    opened: list[PtyRc] = []
    try:
        yield opened
    finally:
        for t in opened:
            t.close()


def start(box: Cluster, terminals: list[PtyRc], *args: str) -> PtyRc:
    t = PtyRc(box, "run", "-d", box.dev, "--tty", *args)
    terminals.append(t)
    return t


def test_typing_resizing_and_the_exit_code_with_the_terminal_restored(
    box: Cluster, terminals: list[PtyRc]
) -> None:
    script = "read x; echo got:$x; stty size; read y; stty size; exit 3"
    t = start(box, terminals, "--", "sh", "-c", script)
    t.expect(f"on {box.dev}".encode())
    t.type(b"hello\r")
    t.expect(b"got:hello")
    assert b"hello\r\n" in t.seen  # the remote terminal echoes what was typed
    t.expect(b"40 120")  # the local size went first (CLI-088)
    raw = t.attrs()
    assert not raw[3] & (termios.ECHO | termios.ICANON | termios.ISIG)  # raw mode (CLI-117)
    t.resize(50, 132)  # SIGWINCH to rc, a resize frame to the job
    t.expect(b"40 120")
    time.sleep(1.0)
    t.type(b"\r")
    t.expect(b"50 132")
    assert t.wait() == 3  # the job's code (CLI-114)
    assert t.attrs() == t.before  # restored on the way out


def test_ctrl_c_interrupts_the_remote_program_not_rc(box: Cluster, terminals: list[PtyRc]) -> None:
    # CLI-118: ^C is a byte for the job's terminal; rc carries on and exits with its code.
    script = "trap 'echo caught' INT; echo ready; sleep 60; echo after; exit 4"
    t = start(box, terminals, "--", "sh", "-c", script)
    t.expect(b"ready")
    time.sleep(0.5)
    started = time.monotonic()
    t.type(b"\x03")
    t.expect(b"after")
    assert b"caught" in t.seen
    assert t.wait() == 4
    assert time.monotonic() - started < 30
    assert t.attrs() == t.before


def test_tty_without_a_command_opens_the_default_shell(
    box: Cluster, terminals: list[PtyRc]
) -> None:
    # CLI-103: no command means the box's interactive shell.
    t = PtyRc(box, "run", "-d", box.dev, "--tty")
    terminals.append(t)
    t.expect(f"on {box.dev}".encode())
    t.type(b"echo $((6*7))z\r")
    t.expect(b"42z")
    t.type(b"exit 5\r")
    assert t.wait() == 5
    assert t.attrs() == t.before
    status, jobs = box.api("GET", "/v1/jobs")
    assert status == 200
    assert jobs["jobs"][0]["command"] == [
        "/bin/sh",
        "-c",
        "exec $(command -v bash || command -v sh) -i",
    ]
    assert jobs["jobs"][0]["stdio"] == "tty"


def test_a_signal_to_rc_restores_the_terminal_and_the_job_ends_as_its_client_left(
    box: Cluster, terminals: list[PtyRc]
) -> None:
    # CLI-117: SIGTERM while attached: terminal back first, exit 130. The job's terminal
    # was this rc: the worker ends it (client left) and the device is free again.
    t = start(box, terminals, "--", "sh", "-c", "echo ready; sleep 60")
    t.expect(b"ready")
    t.proc.send_signal(signal.SIGTERM)
    assert t.wait() == 130
    assert b"client left" in t.seen and b"rc ps" in t.seen
    assert b"STILL RUNNING" not in t.seen
    assert t.attrs() == t.before
    _status, jobs = box.api("GET", "/v1/jobs")
    job = box.wait_job(jobs["jobs"][0]["id"], lambda j: j["state"] != "running", 20)
    assert (job["state"], job["kill_reason"]) == ("killed", "client left"), job
    assert box.wait_job(job["id"], lambda j: bool(j.get("finished_at")), 5)
    wait_for(lambda: device_state(box) == "ready", 10, "the device to return")


def device_state(box: Cluster) -> str:
    _status, views = box.api("GET", "/v1/devices")
    return str(next(v["device"]["state"] for v in views if v["device"]["id"] == box.dev))


def test_a_job_that_ends_at_once_ends_its_client_with_its_code(
    box: Cluster, terminals: list[PtyRc]
) -> None:
    # No output and an immediate exit end the job's session before (or as) the client
    # attaches; the client still ends with the job's code, never hanging.
    for _ in range(3):
        t = start(box, terminals, "--", "sh", "-c", "exit 4")
        assert t.wait() == 4


def test_tty_with_stdin_not_a_terminal_reports_and_kills_its_job(box: Cluster) -> None:
    # CLI-116: checked only after the submit; the job is not left holding the device.
    r = box.rc("run", "-d", box.dev, "--tty", "--", "cat")
    # The killed job's own code, as CLI-114 gives it: cat ended by SIGTERM.
    assert r.returncode == 128 + signal.SIGTERM, r
    assert "log stream ended" in r.stderr and "terminal" in r.stderr, r.stderr
    _status, jobs = box.api("GET", "/v1/jobs")
    job = jobs["jobs"][0]
    assert job["stdio"] == "tty" and job["state"] == "killed", job


def test_tty_output_is_never_stored(box: Cluster, terminals: list[PtyRc]) -> None:
    # CLI-119: rc logs on such a job is logs_not_stored.
    t = start(box, terminals, "--", "sh", "-c", "echo secret; exit 0")
    t.expect(b"secret")
    assert t.wait() == 0
    _status, jobs = box.api("GET", "/v1/jobs")
    r = box.rc("logs", jobs["jobs"][0]["id"])
    assert r.returncode == 1 and "logs_not_stored" in r.stderr, r


def files_holding(data: Path, marker: bytes) -> list[Path]:
    """The files under ``data`` (database, its journal, job logs, anything) holding ``marker``."""
    found = []
    for path in data.rglob("*"):
        try:
            if path.is_file() and marker in path.read_bytes():
                found.append(path)
        except FileNotFoundError:
            continue  # a journal or temporary file gone meanwhile
    return found


def test_no_byte_of_a_terminal_session_reaches_the_disk(
    box: Cluster, terminals: list[PtyRc]
) -> None:
    # TTY-002: the relay is a splice, not a store. Neither what was typed nor what the job
    # printed is written anywhere under the data directory; the job prints its marker
    # in two halves, so that the command (which is stored) does not hold it.
    typed, half = secrets.token_hex(8).encode(), secrets.token_hex(8)
    t = start(box, terminals, "--", "sh", "-c", f"read x; printf '%s%s\\n' tty {half}")
    t.expect(f"on {box.dev}".encode())
    t.type(typed + b"\r")
    t.expect(f"tty{half}".encode())
    assert typed in t.seen
    assert t.wait() == 0
    # The same scan finds a normal job's output, stored as it should be.
    r = box.rc("run", "-d", box.dev, "--", "sh", "-c", f"printf '%s%s\\n' log {half}")
    assert r.returncode == 0 and r.stdout == f"log{half}\n", r
    data = box.tmp / "data"
    assert files_holding(data, f"log{half}".encode())
    assert files_holding(data, typed) == []
    assert files_holding(data, f"tty{half}".encode()) == []
