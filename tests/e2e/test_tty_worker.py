"""The worker end of an interactive job under real processes (WTTY-001..008).

A real ``rc serve`` and ``rc worker``; the operator's halves are opened with the
client's own full-duplex streams (``h1.aio.relay``), frames written by hand, so these tests
pin the worker's side of the wire without the CLI in between.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

from resource_controller.h1 import aio

from .cluster import Cluster, kill_job_processes, wait_for

T = TypeVar("T")
TERMINAL = ("succeeded", "failed", "killed", "lost")


def run(fn: Callable[[], Awaitable[T]], bound: float = 40) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(bound):
            return await fn()

    return asyncio.run(bounded())


def data(raw: bytes) -> bytes:
    return json.dumps({"t": "d", "b": base64.b64encode(raw).decode()}).encode() + b"\n"


def resize(rows: int, cols: int) -> bytes:
    return json.dumps({"t": "r", "rows": rows, "cols": cols}).encode() + b"\n"


def submit(c: Cluster, command: list[str], stdio: str = "tty") -> str:
    status, job = c.api(
        "POST",
        "/v1/jobs",
        {"device_id": c.dev, "submitter": "t", "stdio": stdio, "command": command},
    )
    assert status == 201, job
    return str(job["id"])


async def attach(c: Cluster, job_id: str) -> tuple[aio.Exchange, aio.Exchange]:
    out = await aio.relay(c.url, "GET", f"/v1/jobs/{job_id}/tty/out", "ctok")
    inp = await aio.relay(c.url, "POST", f"/v1/jobs/{job_id}/tty/in", "ctok")
    return out, inp


async def read_until(out: aio.Exchange, marker: bytes, seen: bytearray) -> None:
    while marker not in seen:
        piece = await out.read()
        assert piece, f"output ended before {marker!r}: {bytes(seen)!r}"
        seen += piece


async def read_all(out: aio.Exchange, seen: bytearray) -> None:
    while piece := await out.read():
        seen += piece


def finished(c: Cluster, job_id: str, timeout: float = 30) -> dict[str, Any]:
    return c.wait_job(job_id, lambda j: j["state"] in TERMINAL, timeout)


def test_a_terminal_job_echoes_resizes_and_exits_with_its_code(box: Cluster) -> None:
    # WTTY-003 (a real PTY, 24x80 at first), WTTY-005 (frames), WTTY-004 (raw output).
    job_id = submit(box, ["sh", "-c", "stty size; read x; stty size; echo got:$x; exit 3"])
    seen = bytearray()

    async def scenario() -> None:
        out, inp = await attach(box, job_id)
        await read_until(out, b"24 80", seen)  # the default size, before any resize
        await inp.write(resize(0, 0))  # ignored, never applied
        await inp.write(resize(33, 101))
        await inp.write(data(b"hello\r"))
        await read_all(out, seen)
        out.close()
        inp.close()

    run(scenario)
    assert b"hello\r\n" in seen  # the terminal echoed the keystrokes
    assert b"33 101" in seen and b"got:hello" in seen, bytes(seen)
    job = finished(box, job_id)
    assert (job["state"], job["exit_code"]) == ("failed", 3), job
    # LOG-005: nothing of a terminal reaches the log store.
    assert box.api("GET", f"/v1/jobs/{job_id}/logs?follow=false")[1]["error"] == ("logs_not_stored")


def test_ctrl_c_reaches_the_foreground_program_through_the_terminal(box: Cluster) -> None:
    # The PTY is the controlling terminal: ^C becomes SIGINT for its foreground group.
    job_id = submit(box, ["sh", "-c", "echo ready; exec sleep 60"])
    seen = bytearray()

    async def scenario() -> None:
        out, inp = await attach(box, job_id)
        await read_until(out, b"ready", seen)
        await asyncio.sleep(0.3)
        await inp.write(data(b"\x03"))
        await read_all(out, seen)
        out.close()
        inp.close()

    run(scenario)
    job = finished(box, job_id, timeout=15)
    assert job["state"] == "killed" and job["kill_reason"] == "signal: interrupt", job


def test_input_ending_never_ends_the_job(box: Cluster, tmp_path: Path) -> None:
    # WTTY-005: the operator closing input leaves the job running to its own end.
    mark = tmp_path / "done"
    job_id = submit(box, ["sh", "-c", f"echo up; sleep 2; echo finished > {mark}"])
    seen = bytearray()

    async def scenario() -> None:
        out, inp = await attach(box, job_id)
        await read_until(out, b"up", seen)
        await inp.finish()
        await read_all(out, seen)  # still attached to the output, to its end
        inp.close()
        out.close()

    run(scenario)
    job = finished(box, job_id)
    assert job["state"] == "succeeded", job
    assert mark.read_text() == "finished\n"


@pytest.mark.parametrize("stdio", ["tty", "pipe"])
def test_the_client_going_away_ends_the_job_and_frees_the_device(box: Cluster, stdio: str) -> None:
    # A relayed job's terminal or pipe is its client: once the client is gone nobody can
    # see or reach it again, so the worker ends it (client left) and the device returns.
    job_id = submit(box, ["sh", "-c", "echo up; exec sleep 60"], stdio=stdio)

    async def scenario() -> None:
        out, inp = await attach(box, job_id)
        await read_until(out, b"up", bytearray())
        out.close()
        inp.close()

    run(scenario)
    job = finished(box, job_id, timeout=20)
    assert (job["state"], job["kill_reason"]) == ("killed", "client left"), job
    wait_for(lambda: device_state(box) == "ready", 10, "the device to return")


def test_a_client_that_never_attaches_does_not_hold_the_device(box: Cluster) -> None:
    # The client left before the worker dialled in (or never came): after the relay's
    # absent-client bound the session is over and the job ends like any other.
    job_id = submit(box, ["cat"], stdio="pipe")
    job = finished(box, job_id, timeout=30)
    assert (job["state"], job["kill_reason"]) == ("killed", "client left"), job
    took = stamp(job["finished_at"]) - stamp(job["started_at"])
    assert 9 <= took <= 25, job  # CLIENT_ABSENT, plus the cancellation path


def stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def device_state(c: Cluster) -> str:
    _status, views = c.api("GET", "/v1/devices")
    return str(next(v["device"]["state"] for v in views if v["device"]["id"] == c.dev))


def test_a_clean_exit_leaving_the_session_busy_is_not_a_success(box: Cluster) -> None:
    # WTTY-006: a shell exiting 0 while ``sleep 300 &`` keeps the GPU.
    # With job control (set -m) the child gets a process group of its own inside the
    # session, and it ignores the hangup, so only a session-wide reap finds it.
    script = "set -m; (trap '' HUP; exec sleep 300) & sleep 0.3; echo bye; exit 0"
    job_id = submit(box, ["sh", "-c", script])

    async def scenario() -> None:
        out, inp = await attach(box, job_id)
        await read_all(out, bytearray())
        out.close()
        inp.close()

    run(scenario)
    job = finished(box, job_id)
    assert job["state"] == "killed" and job["kill_reason"] == "stragglers reaped after exit", job


def test_a_kill_ends_a_terminal_job_and_its_session(box: Cluster) -> None:
    # WTTY-008: kill flags behave as for any job; the operator's output then ends.
    job_id = submit(box, ["sh", "-c", "echo ready; sleep 60"])
    seen = bytearray()

    async def scenario() -> None:
        out, inp = await attach(box, job_id)
        await read_until(out, b"ready", seen)
        status, _ = box.api("POST", f"/v1/jobs/{job_id}/kill", {"submitter": "t"})
        assert status == 200
        await read_all(out, seen)  # TTY-020: never a silent terminal
        out.close()
        inp.close()

    run(scenario)
    job = finished(box, job_id)
    assert job["state"] == "killed" and job["kill_reason"] == "cancelled", job


def test_a_relay_that_cannot_be_opened_fails_the_job_and_names_the_stream(
    box: Cluster,
) -> None:
    # WTTY-001: another connection already holds the job's worker-output half when the
    # worker dials it. The job waits behind a hold, so the half is taken first.
    status, hold = box.api(
        "POST",
        "/v1/jobs",
        {
            "device_id": box.dev,
            "submitter": "t",
            "kind": "hold",
            "max_runtime_seconds": 60,
            "reason": "test",
        },
    )
    assert status == 201, hold
    job_id = submit(box, ["sleep", "30"])

    async def scenario() -> dict[str, Any]:
        squatter = await aio.relay(box.url, "POST", f"/v1/jobs/{job_id}/tty/out", "atok")
        status, _ = box.api("POST", f"/v1/jobs/{hold['id']}/kill", {"submitter": "t"})
        assert status == 200
        job = await asyncio.to_thread(finished, box, job_id)
        squatter.close()
        return job

    job = run(scenario)
    assert (job["state"], job["exit_code"]) == ("failed", -1), job
    assert job["kill_reason"] == (
        "attach tty stdio: open output stream: controller returned 409 Conflict"
    ), job


def test_pipe_mode_is_byte_exact_and_keeps_stderr_out_of_the_payload(
    box: Cluster, tmp_path: Path
) -> None:
    # CP-001: raw stdin and stdout through the relay; stderr to the log batching.
    job_id = submit(box, ["sh", "-c", "echo diagnostics >&2; cat"], stdio="pipe")
    payload = bytes(range(256)) * 4096 + b"\r\n\x03\x04"
    seen = bytearray()

    async def scenario() -> None:
        out, inp = await attach(box, job_id)

        async def send() -> None:
            for i in range(0, len(payload), 65536):
                await inp.write(payload[i : i + 65536])
            await inp.finish()  # stdin EOF: cat ends

        sender = asyncio.create_task(send())
        await read_all(out, seen)
        await sender
        out.close()
        inp.close()

    run(scenario)
    assert bytes(seen) == payload
    job = finished(box, job_id)
    assert job["state"] == "succeeded", job
    log = (box.tmp / "data" / "logs" / f"{job_id}.log").read_bytes()
    assert log == b"diagnostics\n"


def test_pipe_mode_never_waits_for_stdin_a_process_does_not_read(box: Cluster) -> None:
    # CP-002: ``tar -cf -`` exits at once while the input stream stays open.
    job_id = submit(box, ["sh", "-c", "echo archive"], stdio="pipe")
    seen = bytearray()

    async def scenario() -> None:
        out, inp = await attach(box, job_id)
        await read_all(out, seen)  # input never closed
        out.close()
        inp.close()

    run(scenario)
    assert bytes(seen) == b"archive\n"
    assert finished(box, job_id)["state"] == "succeeded"


def test_the_drain_after_exit_is_bounded_when_an_escapee_holds_the_terminal(
    box: Cluster, tmp_path: Path
) -> None:
    # WTTY-007: a ``setsid`` escapee keeps the terminal open, so its output never reaches
    # its end; the worker waits 2 s for it, then closes the terminal and the streams.
    # The shell exits only once the escapee has left its session (WTTY-006 reaps members).
    out_of_session = tmp_path / "escaped"
    escape = f"setsid sh -c 'touch {out_of_session}; exec sleep 30' &"
    wait = (
        f"i=0; while [ ! -e {out_of_session} ] && [ $i -lt 500 ]; do i=$((i+1)); sleep 0.01; done"
    )
    job_id = submit(box, ["sh", "-c", f"{escape} {wait}; echo bye"])
    seen = bytearray()

    async def scenario() -> float:
        out, inp = await attach(box, job_id)
        await read_until(out, b"bye", seen)
        began = time.monotonic()
        async with asyncio.timeout(10):
            await read_all(out, seen)
        out.close()
        inp.close()
        return time.monotonic() - began

    try:
        took = run(scenario)
        job = finished(box, job_id, timeout=10)
    finally:
        kill_job_processes(job_id)
    assert 1 <= took < 6, took  # the escapee did hold it: the wait ran out
    assert job["state"] == "succeeded", job
    assert stamp(str(job["finished_at"])) - stamp(str(job["started_at"])) < 6, job
