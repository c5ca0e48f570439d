"""The relay routes over real HTTP (controller-api.md §11): roles, pairing, ends, bounds.

Every half is opened with ``h1.aio.relay`` (the worker's and the client's own full-duplex
HTTP/1.1 code), against the real server, so a POST half is seen answering ``200`` while
its body is still open (TTY-011, TTY-012).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from controller_harness import ADMIN, CLIENT, WORKER, Harness, assert_error

from resource_controller import errors
from resource_controller.controller.relay import FRAME_MAX
from resource_controller.h1 import aio

T = TypeVar("T")
BOUND = 10.0

OUT, IN = "/tty/out", "/tty/in"


def run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(30):
            return await coro_fn()

    return asyncio.run(bounded())


async def open_half(rc: Harness, job_id: str, method: str, tail: str, token: str) -> aio.Exchange:
    return await aio.relay(rc.url, method, f"/v1/jobs/{job_id}{tail}", token)


async def read_exactly(stream: aio.Exchange, size: int) -> bytes:
    got = b""
    async with asyncio.timeout(BOUND):
        while len(got) < size:
            piece = await stream.read()
            assert piece, f"stream ended after {len(got)} of {size} bytes"
            got += piece
    return got


async def read_to_end(stream: aio.Exchange) -> bytes:
    got = b""
    async with asyncio.timeout(BOUND):
        while piece := await stream.read():
            got += piece
    return got


# ---- roles and refusals ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "tail", "role"),
    [
        ("GET", OUT, "client"),
        ("POST", IN, "client"),
        ("POST", OUT, "worker"),
        ("GET", IN, "worker"),
    ],
)
def test_each_half_needs_its_own_role_and_admin_may_open_any(
    rc: Harness, method: str, tail: str, role: str
) -> None:
    # TTY-001, AUTH-002: a client token can never open a worker half, nor the reverse.
    job_id, _ = rc.running_job()
    wrong = CLIENT if role == "worker" else WORKER
    path = f"/v1/jobs/{job_id}{tail}"
    assert_error(rc.new_client(wrong).request(method, path), 403, "forbidden")
    assert_error(rc.anon.request(method, path), 401, "unauthorized")
    assert_error(rc.new_client("nope").request(method, path), 401, "unauthorized")

    async def admin_opens() -> None:
        s = await open_half(rc, job_id, method, tail, ADMIN)
        s.close()

    run(admin_opens)


def test_unknown_job_is_not_found_before_any_session_exists(rc: Harness) -> None:
    # TTY-003
    assert_error(rc.client.get("/v1/jobs/nope/tty/out"), 404, "not_found")
    assert_error(rc.worker.get("/v1/jobs/nope/tty/in"), 404, "not_found")
    assert rc.svc.hub.relay.sessions == {}


def test_auth_comes_before_the_job_lookup(rc: Harness) -> None:
    # AUTH-003: a wrong role on an unknown job is 403, not 404.
    assert_error(rc.client.post("/v1/jobs/nope/tty/out"), 403, "forbidden")


# ---- pairing ------------------------------------------------------------------------------


def test_output_and_input_flow_with_the_headers_of_each_half(rc: Harness) -> None:
    job_id, _ = rc.running_job()

    async def scenario() -> None:
        c_out = await open_half(rc, job_id, "GET", OUT, CLIENT)
        c_in = await open_half(rc, job_id, "POST", IN, CLIENT)
        w_out = await open_half(rc, job_id, "POST", OUT, WORKER)
        w_in = await open_half(rc, job_id, "GET", IN, WORKER)
        # TTY-011: types and nosniff on every half.
        assert c_out.headers["content-type"] == "application/octet-stream"
        assert w_in.headers["content-type"] == "application/x-ndjson"
        assert c_in.headers["content-type"] == "text/plain; charset=utf-8"
        assert w_out.headers["content-type"] == "text/plain; charset=utf-8"
        for s in (c_out, c_in, w_out, w_in):
            assert s.headers["x-content-type-options"] == "nosniff"
        payload = bytes(range(256)) * 3
        await w_out.write(payload)
        assert await read_exactly(c_out, len(payload)) == payload  # TTY-030: untouched
        frame = b'{"t":"d","b":"aGkK"}\n'
        await c_in.write(frame)
        assert await read_exactly(w_in, len(frame)) == frame
        # TTY-021: stdin EOF ends only the input direction.
        await c_in.finish()
        assert await read_to_end(w_in) == b""
        await w_out.write(b"still here")
        assert await read_exactly(c_out, 10) == b"still here"
        # TTY-020: the worker's output EOF ends the session.
        await w_out.finish()
        assert await read_to_end(c_out) == b""
        for s in (c_out, c_in, w_out, w_in):
            s.close()

    run(scenario)
    assert rc.wait_idle(5)
    assert rc.svc.hub.relay.sessions == {}


def test_bytes_written_before_the_peer_connects_are_held_not_dropped(rc: Harness) -> None:
    # TTY-010: the client types (and resizes) while the job waits for its worker.
    job_id, _ = rc.running_job()

    async def scenario() -> None:
        c_in = await open_half(rc, job_id, "POST", IN, CLIENT)
        w_out = await open_half(rc, job_id, "POST", OUT, WORKER)
        early_frame = b'{"t":"r","rows":40,"cols":100}\n'
        await c_in.write(early_frame)
        await w_out.write(b"prompt$ ")
        await asyncio.sleep(0.3)
        c_out = await open_half(rc, job_id, "GET", OUT, CLIENT)
        w_in = await open_half(rc, job_id, "GET", IN, WORKER)
        assert await read_exactly(w_in, len(early_frame)) == early_frame
        assert await read_exactly(c_out, 8) == b"prompt$ "
        for s in (c_out, c_in, w_out, w_in):
            s.close()

    run(scenario)


def test_a_second_connection_for_a_half_is_conflict_and_the_first_keeps_working(
    rc: Harness,
) -> None:
    # TTY-004
    job_id, _ = rc.running_job()

    async def scenario() -> None:
        c_out = await open_half(rc, job_id, "GET", OUT, CLIENT)
        with pytest.raises(errors.Refused) as refused:
            await open_half(rc, job_id, "GET", OUT, CLIENT)
        assert refused.value.status == 409 and refused.value.code == "conflict"
        w_out = await open_half(rc, job_id, "POST", OUT, WORKER)
        with pytest.raises(errors.Refused) as again:
            await open_half(rc, job_id, "POST", OUT, ADMIN)
        assert again.value.code == "conflict"
        await w_out.write(b"ok")
        assert await read_exactly(c_out, 2) == b"ok"
        c_out.close()
        w_out.close()

    run(scenario)


def test_the_operator_leaving_ends_the_session_for_the_worker(rc: Harness) -> None:
    # TTY-015, TTY-020: the client-out disconnect is noticed while idle; the worker's
    # input response ends and its output is no longer taken.
    job_id, _ = rc.running_job()

    async def scenario() -> None:
        c_out = await open_half(rc, job_id, "GET", OUT, CLIENT)
        w_out = await open_half(rc, job_id, "POST", OUT, WORKER)
        w_in = await open_half(rc, job_id, "GET", IN, WORKER)
        c_out.close()
        assert await read_to_end(w_in) == b""
        w_out.close()
        w_in.close()

    run(scenario)
    assert rc.wait_idle(5)
    assert rc.svc.hub.relay.sessions == {}


def test_a_client_input_half_of_a_discarded_session_is_refused_on_its_next_write(
    rc: Harness,
) -> None:
    # TTY-020: never swallow input into a session with nothing on the far end.
    job_id, _ = rc.running_job()

    async def scenario() -> None:
        c_out = await open_half(rc, job_id, "GET", OUT, CLIENT)
        c_in = await open_half(rc, job_id, "POST", IN, CLIENT)
        w_out = await open_half(rc, job_id, "POST", OUT, WORKER)
        await w_out.finish()
        assert await read_to_end(c_out) == b""
        await c_in.write(b'{"t":"d","b":"eA=="}\n')
        assert await read_to_end(c_in) == b""  # the 200's body ends: refused
        for s in (c_out, c_in, w_out):
            s.close()

    run(scenario)


def test_input_halves_that_dial_again_get_a_fresh_input_direction(rc: Harness) -> None:
    # TTY-021: the relay never leaves a session permanently output-only.
    job_id, _ = rc.running_job()

    async def scenario() -> None:
        c_out = await open_half(rc, job_id, "GET", OUT, CLIENT)
        w_out = await open_half(rc, job_id, "POST", OUT, WORKER)
        c_in = await open_half(rc, job_id, "POST", IN, CLIENT)
        w_in = await open_half(rc, job_id, "GET", IN, WORKER)
        await c_in.finish()
        assert await read_to_end(w_in) == b""
        c_in.close()
        w_in.close()
        await asyncio.sleep(0.2)
        c_in2 = await open_half(rc, job_id, "POST", IN, CLIENT)
        w_in2 = await open_half(rc, job_id, "GET", IN, WORKER)
        await c_in2.write(b"again\n")
        assert await read_exactly(w_in2, 6) == b"again\n"
        for s in (c_out, w_out, c_in2, w_in2):
            s.close()

    run(scenario)


def test_a_large_write_reaches_the_reader_in_frames_of_at_most_the_frame_size(
    rc: Harness,
) -> None:
    # The relay holds at most one FRAME_MAX piece per direction: bounded memory.
    job_id, _ = rc.running_job()
    payload = bytes(range(256)) * (3 * FRAME_MAX // 256 + 7)

    async def scenario() -> None:
        c_out = await open_half(rc, job_id, "GET", OUT, CLIENT)
        w_out = await open_half(rc, job_id, "POST", OUT, WORKER)
        writer = asyncio.create_task(w_out.write(payload))
        assert await read_exactly(c_out, len(payload)) == payload
        await writer
        c_out.close()
        w_out.close()

    run(scenario)


# ---- bounds -------------------------------------------------------------------------------


def test_a_lone_post_half_blocked_past_the_guard_is_abandoned(rc: Harness) -> None:
    # TTY-014, with the guard shortened on this controller's relay.
    rc.svc.hub.relay.handoff_guard = 0.3
    job_id, _ = rc.running_job()

    async def scenario() -> None:
        w_out = await open_half(rc, job_id, "POST", OUT, WORKER)
        await w_out.write(b"nobody reads this")
        assert await read_to_end(w_out) == b""  # the worker-out response ended
        w_out.close()

    run(scenario)


def test_the_guard_re_arms_while_another_half_is_attached(rc: Harness) -> None:
    # TTY-014: an operator attached to a queued job may wait longer than any timeout.
    rc.svc.hub.relay.handoff_guard = 0.2
    job_id, _ = rc.running_job()

    async def scenario() -> None:
        c_in = await open_half(rc, job_id, "POST", IN, CLIENT)
        c_out = await open_half(rc, job_id, "GET", OUT, CLIENT)
        frame = b'{"t":"r","rows":30,"cols":90}\n'
        await c_in.write(frame)
        await asyncio.sleep(1.0)  # five guard periods
        w_in = await open_half(rc, job_id, "GET", IN, WORKER)
        assert await read_exactly(w_in, len(frame)) == frame
        for s in (c_in, c_out, w_in):
            s.close()

    run(scenario)


def test_the_worker_output_is_answered_at_once_when_the_client_output_leaves(
    rc: Harness,
) -> None:
    # The worker learns that its client left while its job prints nothing: the answer to
    # its output half ends without waiting for another write.
    job_id, _ = rc.running_job()

    async def scenario() -> None:
        c_out = await open_half(rc, job_id, "GET", OUT, CLIENT)
        w_out = await open_half(rc, job_id, "POST", OUT, WORKER)
        w_in = await open_half(rc, job_id, "GET", IN, WORKER)
        c_out.close()
        assert await read_to_end(w_out) == b""
        assert await read_to_end(w_in) == b""
        w_out.close()
        w_in.close()

    run(scenario)


def test_worker_halves_with_no_client_end_after_the_absent_bound(rc: Harness) -> None:
    rc.svc.hub.relay.client_absent = 0.3
    job_id, _ = rc.running_job()

    async def scenario() -> None:
        w_out = await open_half(rc, job_id, "POST", OUT, WORKER)
        w_in = await open_half(rc, job_id, "GET", IN, WORKER)
        assert await read_to_end(w_out) == b""
        assert await read_to_end(w_in) == b""
        w_out.close()
        w_in.close()

    run(scenario)
    assert rc.wait_idle(5)
    assert rc.svc.hub.relay.sessions == {}


def test_a_reader_that_accepts_nothing_is_dropped_after_the_write_deadline(rc: Harness) -> None:
    # TTY-013: the client-out socket is never read; once its buffers are full, the
    # next write misses the (shortened) deadline and the session ends.
    rc.svc.hub.relay.write_deadline = 0.3
    job_id, _ = rc.running_job()

    async def scenario() -> None:
        c_out = await open_half(rc, job_id, "GET", OUT, CLIENT)
        w_out = await open_half(rc, job_id, "POST", OUT, WORKER)
        block = b"x" * 65536
        async with asyncio.timeout(BOUND):
            while job_id in rc.svc.hub.relay.sessions:
                await w_out.write(block)
        assert await read_to_end(w_out) == b""  # the worker-out response ended too
        c_out.close()
        w_out.close()

    run(scenario)
    assert rc.wait_idle(5)
    assert rc.svc.hub.relay.sessions == {}


def test_shutdown_ends_every_relay_stream(rc: Harness) -> None:
    job_id, _ = rc.running_job()

    async def scenario() -> None:
        c_out = await open_half(rc, job_id, "GET", OUT, CLIENT)
        c_in = await open_half(rc, job_id, "POST", IN, CLIENT)
        rc.server.begin_shutdown()
        assert await read_to_end(c_out) == b""
        assert await read_to_end(c_in) == b""
        c_out.close()
        c_in.close()

    run(scenario)


def test_the_relay_routes_are_in_the_published_document(rc: Harness) -> None:
    doc = rc.client.get("/openapi.json").json()
    for method, path in (
        ("get", "/v1/jobs/{job_id}/tty/out"),
        ("post", "/v1/jobs/{job_id}/tty/in"),
        ("post", "/v1/jobs/{job_id}/tty/out"),
        ("get", "/v1/jobs/{job_id}/tty/in"),
    ):
        assert method in doc["paths"][path], (method, path)
