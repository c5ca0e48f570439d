"""Output batching (WRK-083..086), with a real sender that collects what it is given."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from worker_helpers import run

from resource_controller.worker import logship


class Receiver:
    """A sender that records chunks, can be slowed or made to fail, and checks overlap."""

    def __init__(self, delay: float = 0.0) -> None:
        self.chunks: list[bytes] = []
        self.at: list[float] = []
        self.delay = delay
        self.fail_on: set[int] = set()
        self.gate: asyncio.Event | None = None
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0

    async def __call__(self, chunk: bytes) -> None:
        self.calls += 1
        call = self.calls
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.delay:
                await asyncio.sleep(self.delay)
            if call in self.fail_on:
                raise ConnectionError("controller unreachable")
            self.chunks.append(chunk)
            self.at.append(time.monotonic())
        finally:
            self.in_flight -= 1


def shipper(
    rx: Receiver, label: str = "j", *, flush_after: float = 0.2, flush_bytes: int = 65_536
) -> logship.LogShipper:
    """A shipper with a short timer (the real one waits a second)."""
    return logship.LogShipper(rx, label=label, flush_after=flush_after, flush_bytes=flush_bytes)


def test_first_byte_arms_the_timer() -> None:  # WRK-083
    async def go() -> tuple[Receiver, float]:
        rx = Receiver()
        ship = shipper(rx)
        began = time.monotonic()
        await ship.write(b"a")
        await asyncio.sleep(0.05)
        await ship.write(b"b")  # joins the armed batch, does not re-arm
        assert rx.chunks == []
        await asyncio.sleep(0.3)
        assert rx.chunks == [b"ab"]
        await ship.close()
        return rx, began

    rx, began = run(go(), 10)
    assert rx.chunks == [b"ab"]
    assert 0.18 <= rx.at[0] - began < 0.5  # one timer period after the first byte


def test_size_threshold_flushes_from_the_writing_path() -> None:
    async def go() -> Receiver:
        rx = Receiver()
        ship = shipper(rx, flush_bytes=10)
        await ship.write(b"12345")
        await ship.write(b"6789012")  # reaches 12 >= 10: sent before write returns
        assert rx.chunks == [b"123456789012"]
        await ship.write(b"x")
        await ship.close()  # WRK-086: the remainder goes out at the end
        return rx

    assert run(go(), 10).chunks == [b"123456789012", b"x"]


def test_default_threshold_is_64_kib() -> None:
    assert logship.FLUSH_BYTES == 65_536


def test_sends_are_serialised_and_ordered() -> None:
    async def go() -> tuple[Receiver, bytes]:
        rx = Receiver(delay=0.02)
        ship = shipper(rx, flush_after=0.01, flush_bytes=64)
        sent = bytearray()
        for i in range(120):
            piece = f"<{i}:{'x' * (i % 50)}>".encode()
            sent += piece
            await ship.write(piece)
            if i % 7 == 0:
                await asyncio.sleep(0.015)  # let some timer flushes interleave
        await ship.close()
        return rx, bytes(sent)

    rx, sent = run(go(), 20)
    assert b"".join(rx.chunks) == sent  # nothing lost, nothing reordered
    assert rx.max_in_flight == 1  # strictly serialised
    assert len(rx.chunks) > 10


def test_output_is_accepted_while_a_send_is_in_flight() -> None:  # WRK-083
    async def go() -> Receiver:
        rx = Receiver()
        rx.gate = asyncio.Event()
        ship = shipper(rx)
        await ship.write(b"first")
        await asyncio.sleep(0.3)  # the timer cut "first"; its send is blocked
        assert rx.calls == 1
        await asyncio.wait_for(ship.write(b"second"), 0.1)  # not blocked by the send
        rx.gate.set()
        await ship.close()
        return rx

    assert run(go(), 10).chunks == [b"first", b"second"]


def test_a_failed_chunk_is_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:  # WRK-085
    async def go() -> tuple[Receiver, logship.LogShipper]:
        rx = Receiver()
        rx.fail_on = {2}
        ship = shipper(rx, "job-7", flush_bytes=4)
        for piece in (b"aaaa", b"bbbb", b"cccc"):
            await ship.write(piece)
        await ship.close()
        return rx, ship

    with caplog.at_level(logging.WARNING, logger="resource_controller.worker.logship"):
        rx, ship = run(go(), 10)
    assert rx.chunks == [b"aaaa", b"cccc"]  # never retried
    assert rx.calls == 3
    assert (ship.sent_bytes, ship.lost_bytes) == (8, 4)
    assert "job-7" in caplog.text and "lost" in caplog.text


def test_close_waits_for_every_send_and_is_idempotent() -> None:  # WRK-086
    async def go() -> Receiver:
        rx = Receiver(delay=0.1)
        ship = shipper(rx)
        await ship.write(b"tail")
        await ship.close()
        assert rx.chunks == [b"tail"]
        await ship.close()
        return rx

    assert run(go(), 10).chunks == [b"tail"]


def test_close_with_nothing_written_sends_nothing() -> None:
    async def go() -> Receiver:
        rx = Receiver()
        await shipper(rx, "").close()
        return rx

    assert run(go(), 5).calls == 0
