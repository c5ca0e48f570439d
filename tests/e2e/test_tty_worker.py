"""The worker end of an interactive job under real processes (WTTY-001..008).

A real ``rc serve`` and ``rc worker``; the operator's halves are opened with the
client's own full-duplex streams (``duplex``), frames written by hand, so these tests
pin the worker's side of the wire without the CLI in between.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from resource_controller import duplex

from .cluster import Cluster

T = TypeVar("T")
DEV = "box:gpu0"
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
        "POST", "/v1/jobs", {"device_id": DEV, "submitter": "t", "stdio": stdio, "command": command}
    )
    assert status == 201, job
    return str(job["id"])


async def attach(c: Cluster, job_id: str) -> tuple[duplex.Stream, duplex.Stream]:
    out = await duplex.open_stream(c.url, "GET", f"/v1/jobs/{job_id}/tty/out", "ctok")
    inp = await duplex.open_stream(c.url, "POST", f"/v1/jobs/{job_id}/tty/in", "ctok")
    return out, inp


async def read_until(out: duplex.Stream, marker: bytes, seen: bytearray) -> None:
    while marker not in seen:
        piece = await out.read()
        assert piece, f"output ended before {marker!r}: {bytes(seen)!r}"
        seen += piece


async def read_all(out: duplex.Stream, seen: bytearray) -> None:
    while piece := await out.read():
        seen += piece


def finished(c: Cluster, job_id: str, timeout: float = 30) -> dict[str, Any]:
    return c.wait_job(job_id, lambda j: j["state"] in TERMINAL, timeout)


def test_a_terminal_job_echoes_resizes_and_exits_with_its_code(cluster: Cluster) -> None:
    # WTTY-003 (a real PTY, 24x80 at first), WTTY-005 (frames), WTTY-004 (raw output).
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    job_id = submit(cluster, ["sh", "-c", "stty size; read x; stty size; echo got:$x; exit 3"])
    seen = bytearray()

    async def scenario() -> None:
        out, inp = await attach(cluster, job_id)
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
    job = finished(cluster, job_id)
    assert (job["state"], job["exit_code"]) == ("failed", 3), job
    # LOG-005: nothing of a terminal reaches the log store.
    assert cluster.api("GET", f"/v1/jobs/{job_id}/logs?follow=false")[1]["error"] == (
        "logs_not_stored"
    )


def test_ctrl_c_reaches_the_foreground_program_through_the_terminal(cluster: Cluster) -> None:
    # The PTY is the controlling terminal: ^C becomes SIGINT for its foreground group.
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    job_id = submit(cluster, ["sh", "-c", "echo ready; exec sleep 60"])
    seen = bytearray()

    async def scenario() -> None:
        out, inp = await attach(cluster, job_id)
        await read_until(out, b"ready", seen)
        await asyncio.sleep(0.3)
        await inp.write(data(b"\x03"))
        await read_all(out, seen)
        out.close()
        inp.close()

    run(scenario)
    job = finished(cluster, job_id, timeout=15)
    assert job["state"] == "killed" and job["kill_reason"] == "signal: interrupt", job


def test_the_operator_going_away_never_ends_the_job(cluster: Cluster, tmp_path: Path) -> None:
    # WTTY-005: input ending (and the session ending) leaves the job running.
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    mark = tmp_path / "done"
    job_id = submit(cluster, ["sh", "-c", f"echo up; sleep 2; echo finished > {mark}"])

    async def scenario() -> None:
        out, inp = await attach(cluster, job_id)
        await read_until(out, b"up", bytearray())
        await inp.finish()
        inp.close()
        out.close()

    run(scenario)
    job = finished(cluster, job_id)
    assert job["state"] == "succeeded", job
    assert mark.read_text() == "finished\n"


def test_a_clean_exit_leaving_the_session_busy_is_not_a_success(cluster: Cluster) -> None:
    # WTTY-006: a shell exiting 0 while ``sleep 300 &`` keeps the GPU.
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    # With job control (set -m) the child gets a process group of its own inside the
    # session, and it ignores the hangup, so only a session-wide reap finds it.
    script = "set -m; (trap '' HUP; exec sleep 300) & sleep 0.3; echo bye; exit 0"
    job_id = submit(cluster, ["sh", "-c", script])

    async def scenario() -> None:
        out, inp = await attach(cluster, job_id)
        await read_all(out, bytearray())
        out.close()
        inp.close()

    run(scenario)
    job = finished(cluster, job_id)
    assert job["state"] == "killed" and job["kill_reason"] == "stragglers reaped after exit", job


def test_a_kill_ends_a_terminal_job_and_its_session(cluster: Cluster) -> None:
    # WTTY-008: kill flags behave as for any job; the operator's output then ends.
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    job_id = submit(cluster, ["sh", "-c", "echo ready; sleep 60"])
    seen = bytearray()

    async def scenario() -> None:
        out, inp = await attach(cluster, job_id)
        await read_until(out, b"ready", seen)
        status, _ = cluster.api("POST", f"/v1/jobs/{job_id}/kill", {"submitter": "t"})
        assert status == 200
        await read_all(out, seen)  # TTY-020: never a silent terminal
        out.close()
        inp.close()

    run(scenario)
    job = finished(cluster, job_id)
    assert job["state"] == "killed" and job["kill_reason"] == "cancelled", job


def test_a_relay_that_cannot_be_opened_fails_the_job_and_names_the_stream(
    cluster: Cluster,
) -> None:
    # WTTY-001: another connection already holds the job's worker-output half when the
    # worker dials it. The job waits behind a hold, so the half is taken first.
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    status, hold = cluster.api(
        "POST",
        "/v1/jobs",
        {
            "device_id": DEV,
            "submitter": "t",
            "kind": "hold",
            "max_runtime_seconds": 60,
            "reason": "test",
        },
    )
    assert status == 201, hold
    job_id = submit(cluster, ["sleep", "30"])

    async def scenario() -> dict[str, Any]:
        squatter = await duplex.open_stream(
            cluster.url, "POST", f"/v1/jobs/{job_id}/tty/out", "atok"
        )
        status, _ = cluster.api("POST", f"/v1/jobs/{hold['id']}/kill", {"submitter": "t"})
        assert status == 200
        job = await asyncio.to_thread(finished, cluster, job_id)
        squatter.close()
        return job

    job = run(scenario)
    assert (job["state"], job["exit_code"]) == ("failed", -1), job
    assert job["kill_reason"] == (
        "attach tty stdio: open output stream: controller returned 409 Conflict"
    ), job


def test_pipe_mode_is_byte_exact_and_keeps_stderr_out_of_the_payload(
    cluster: Cluster, tmp_path: Path
) -> None:
    # CP-001: raw stdin and stdout through the relay; stderr to the log batching.
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    job_id = submit(cluster, ["sh", "-c", "echo diagnostics >&2; cat"], stdio="pipe")
    payload = bytes(range(256)) * 4096 + b"\r\n\x03\x04"
    seen = bytearray()

    async def scenario() -> None:
        out, inp = await attach(cluster, job_id)

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
    job = finished(cluster, job_id)
    assert job["state"] == "succeeded", job
    log = (cluster.tmp / "data" / "logs" / f"{job_id}.log").read_bytes()
    assert log == b"diagnostics\n"


def test_pipe_mode_never_waits_for_stdin_a_process_does_not_read(cluster: Cluster) -> None:
    # CP-002: ``tar -cf -`` exits at once while the input stream stays open.
    cluster.start_controller()
    cluster.start_worker("box", ["gpu0"])
    job_id = submit(cluster, ["sh", "-c", "echo archive"], stdio="pipe")
    seen = bytearray()

    async def scenario() -> None:
        out, inp = await attach(cluster, job_id)
        await read_all(out, seen)  # input never closed
        out.close()
        inp.close()

    run(scenario)
    assert bytes(seen) == b"archive\n"
    assert finished(cluster, job_id)["state"] == "succeeded"
