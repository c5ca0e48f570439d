"""The relay's sessions and hand-offs without HTTP (TTY-004, TTY-010, TTY-020..022)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from resource_controller import errors
from resource_controller.controller.relay import FRAME_MAX, Half, Pipe, Relay


def run(fn: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(10):
            await fn()

    asyncio.run(bounded())


def test_a_send_returns_only_once_the_reader_took_the_bytes() -> None:
    # TTY-010: an unbuffered hand-off.
    async def scenario() -> None:
        pipe = Pipe()
        send = asyncio.create_task(pipe.send(b"abc"))
        await asyncio.sleep(0.01)
        assert not send.done()
        assert await pipe.recv() == b"abc"
        assert await send is True

    run(scenario)


def test_a_large_send_is_handed_over_in_frames() -> None:
    async def scenario() -> None:
        pipe = Pipe()
        data = b"y" * (2 * FRAME_MAX + 5)
        send = asyncio.create_task(pipe.send(data))
        sizes = [len(await pipe.recv() or b"") for _ in range(3)]
        assert sizes == [FRAME_MAX, FRAME_MAX, 5]
        assert await send is True

    run(scenario)


def test_closing_wakes_a_blocked_writer_and_a_blocked_reader() -> None:
    async def scenario() -> None:
        pipe, other = Pipe(), Pipe()
        send = asyncio.create_task(pipe.send(b"lost"))
        recv = asyncio.create_task(other.recv())
        await asyncio.sleep(0.01)
        pipe.close()
        other.close()
        assert await send is False
        assert await recv is None
        assert await pipe.recv() is None

    run(scenario)


def test_end_of_stream_reaches_the_reader() -> None:
    async def scenario() -> None:
        pipe = Pipe()
        recv = asyncio.create_task(pipe.recv())
        pipe.end()
        assert await recv is None
        assert await pipe.send(b"late") is False

    run(scenario)


def test_one_connection_per_half_and_a_conflict_leaves_the_session_alone() -> None:
    async def scenario() -> None:
        relay = Relay()
        session = relay.attach("j", Half.CLIENT_OUT)
        with pytest.raises(errors.Conflict):
            relay.attach("j", Half.CLIENT_OUT)
        assert relay.sessions["j"] is session and session.halves == {Half.CLIENT_OUT}

    run(scenario)


def test_a_late_unwind_never_touches_a_newer_session() -> None:
    # TTY-022
    async def scenario() -> None:
        relay = Relay()
        old = relay.attach("j", Half.WORKER_OUT)
        stale_in = relay.attach("j", Half.CLIENT_IN)
        relay.half_ended(old, Half.WORKER_OUT, old.output)  # the output ended: discarded
        assert "j" not in relay.sessions
        new = relay.attach("j", Half.CLIENT_OUT)
        assert new is not old
        relay.half_ended(stale_in, Half.CLIENT_IN, stale_in.input)  # late
        assert relay.sessions["j"] is new and not new.output.closed

    run(scenario)


def test_the_last_half_out_forgets_the_session() -> None:
    async def scenario() -> None:
        relay = Relay()
        s = relay.attach("j", Half.CLIENT_IN)
        relay.attach("j", Half.WORKER_IN)
        relay.half_ended(s, Half.WORKER_IN, s.input)
        assert relay.sessions["j"] is s  # an input half leaving keeps the session
        relay.half_ended(s, Half.CLIENT_IN, s.input)
        assert relay.sessions == {}

    run(scenario)


# ---- the client's absence -----------------------------------------------------------------

ABSENT = 0.05


def test_worker_halves_alone_past_the_absent_bound_end_the_session() -> None:
    # The client left before the worker dialled in, or never came: the session is over.
    async def scenario() -> None:
        relay = Relay(client_absent=ABSENT)
        s = relay.attach("j", Half.WORKER_OUT)
        relay.attach("j", Half.WORKER_IN)
        await asyncio.sleep(ABSENT / 2)
        assert not s.discarded
        await asyncio.wait_for(s.over.wait(), 1)
        assert "j" not in relay.sessions and s.input.closed and s.output.closed

    run(scenario)


def test_a_client_half_in_time_keeps_the_session() -> None:
    async def scenario() -> None:
        relay = Relay(client_absent=ABSENT)
        s = relay.attach("j", Half.WORKER_OUT)
        relay.attach("j", Half.CLIENT_OUT)
        await asyncio.sleep(ABSENT * 4)
        assert not s.discarded and relay.sessions["j"] is s

    run(scenario)


def test_the_bound_runs_again_once_every_client_half_is_gone() -> None:
    # An input-only client whose input ended (TTY-021) leaves the worker alone again.
    async def scenario() -> None:
        relay = Relay(client_absent=ABSENT)
        s = relay.attach("j", Half.WORKER_IN)
        relay.attach("j", Half.CLIENT_IN)
        await asyncio.sleep(ABSENT * 2)
        assert not s.discarded
        relay.half_ended(s, Half.CLIENT_IN, s.input)
        await asyncio.wait_for(s.over.wait(), 1)

    run(scenario)


def test_the_client_output_leaving_ends_the_session_for_every_half() -> None:
    # TTY-020: the POST halves learn it from the session's end, not from their next write.
    async def scenario() -> None:
        relay = Relay()
        s = relay.attach("j", Half.WORKER_OUT)
        relay.attach("j", Half.CLIENT_OUT)
        relay.half_ended(s, Half.CLIENT_OUT, s.output)
        assert s.over.is_set() and s.input.closed and s.output.closed

    run(scenario)
