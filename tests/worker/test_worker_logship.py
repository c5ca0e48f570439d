"""Output batching (WRK-083..086), with a real sender that collects what it is given,
and output the controller does not take kept in a real outbox until it does."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import pytest
from worker_helpers import FAST, run

from resource_controller import errors
from resource_controller.h1 import core
from resource_controller.h1.aio import Answer
from resource_controller.worker import delivery, logship, outbox


class Receiver:
    """A sender that records chunks, can be slowed or made to fail (no answer, or an
    answer of ``status_on[call]``), and checks overlap."""

    def __init__(self, delay: float = 0.0) -> None:
        self.chunks: list[bytes] = []
        self.at: list[float] = []
        self.delay = delay
        self.fail_on: set[int] = set()
        self.status_on: dict[int, int] = {}
        #: Every call's chunk and answer (``0``: no answer), in order.
        self.seen: list[tuple[bytes, int]] = []
        self.gate: asyncio.Event | None = None
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0

    async def __call__(self, chunk: bytes) -> Answer:
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
                self.seen.append((chunk, 0))
                raise errors.ConnectFailed("controller unreachable")
            status = self.status_on.get(call, 200)
            self.seen.append((chunk, status))
            if status == 200:
                self.chunks.append(chunk)
                self.at.append(time.monotonic())
            return Answer(core.Head(status, "", {}), b"")
        finally:
            self.in_flight -= 1


async def nothing_kept(chunk: bytes) -> asyncio.Event:
    raise AssertionError(f"nothing should be kept, got {chunk!r}")


def shipper(
    rx: Receiver,
    label: str = "j",
    *,
    flush_after: float = 0.2,
    flush_bytes: int = 65_536,
    keep: logship.Keeper = nothing_kept,
) -> logship.LogShipper:
    """A shipper with a short timer (the real one waits a second)."""
    return logship.LogShipper(
        rx, keep, label=label, flush_after=flush_after, flush_bytes=flush_bytes
    )


class Appends:
    """The outbox's sender for kept chunks: each attempt goes to the same receiver."""

    def __init__(self, rx: Receiver) -> None:
        self.rx = rx
        #: The terminal report's arrival, after which index of ``rx.seen``.
        self.status_after: list[int] = []

    async def append_log(
        self, job_id: str, chunk: bytes, lease_epoch: int | None, timeout: float | None = None
    ) -> Answer:
        return await self.rx(chunk)

    async def status(self, job_id: str, body: object, timeout: float) -> Answer:
        self.status_after.append(len(self.rx.seen))
        return Answer(core.Head(200, "", {}), b"")

    async def fault(self, device_id: str, body: object, timeout: float) -> Answer:
        return Answer(core.Head(200, "", {}), b"")


def keeper(box: outbox.Outbox, sender: Appends, tasks: list[asyncio.Task[None]]) -> logship.Keeper:
    """What the job's lifecycle does with a chunk not taken: the outbox, delivered."""

    async def keep(chunk: bytes) -> asyncio.Event:
        report = box.add_log("j", chunk, 3)
        await box.persist(report)
        assert os.path.exists(report.path)  # on disk before anything waits for it

        async def deliver() -> None:
            await delivery.deliver(box, report, sender, FAST)

        tasks.append(asyncio.create_task(deliver()))
        return report.gone

    return keep


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


@pytest.mark.parametrize("status", [404, 409, 413])
def test_a_chunk_refused_for_good_is_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture, status: int
) -> None:  # WRK-085, EXT-EPOCH-3: a job gone, a stale lease, a chunk too large
    async def go() -> tuple[Receiver, logship.LogShipper]:
        rx = Receiver()
        rx.status_on = {2: status}
        ship = shipper(rx, "job-7", flush_bytes=4)
        for piece in (b"aaaa", b"bbbb", b"cccc"):
            await ship.write(piece)
        await ship.close()
        return rx, ship

    with caplog.at_level(logging.WARNING, logger="resource_controller.worker.logship"):
        rx, ship = run(go(), 10)
    assert rx.chunks == [b"aaaa", b"cccc"]  # never retried
    assert rx.calls == 3
    assert (ship.sent_bytes, ship.kept_bytes, ship.lost_bytes) == (8, 0, 4)
    assert "job-7" in caplog.text and "refused for good" in caplog.text


def test_output_not_taken_is_kept_and_arrives_once_in_order_before_the_outcome(
    tmp_path: Path,
) -> None:  # WRK-072, WRK-085: a controller answering 500/503, or not at all, for a while
    async def go() -> tuple[Receiver, Appends, logship.LogShipper, bytes]:
        rx = Receiver()
        rx.status_on = {n: 503 for n in range(3, 9)} | {9: 500}
        rx.fail_on = {10}
        box = outbox.Outbox.open(str(tmp_path / "state"))
        sender = Appends(rx)
        tasks: list[asyncio.Task[None]] = []
        ship = shipper(rx, flush_after=0.01, flush_bytes=16, keep=keeper(box, sender, tasks))
        sent = bytearray()
        for i in range(40):
            piece = f"<line {i}>".encode()
            sent += piece
            await ship.write(piece)
            if i % 5 == 0:
                await asyncio.sleep(0.02)
        await ship.close()
        terminal = box.add_status("j", ("box:gpu0",), {"worker_id": "w", "state": "succeeded"})
        await box.persist(terminal)
        await delivery.deliver(box, terminal, sender, FAST)
        await asyncio.gather(*tasks)
        assert box.empty and os.listdir(box.directory) == []
        box.close()
        return rx, sender, ship, bytes(sent)

    rx, sender, ship, sent = run(go(), 30)
    assert b"".join(rx.chunks) == sent  # every byte once, in order
    assert ship.kept_bytes > 0 and ship.lost_bytes == 0
    assert rx.max_in_flight == 1
    assert sender.status_after == [len(rx.seen)]  # the outcome after the last byte


def test_a_kept_chunk_outlives_the_worker(tmp_path: Path) -> None:  # EXT-OUTBOX-1
    state = str(tmp_path / "state")

    async def first() -> None:
        rx = Receiver()
        rx.status_on = {1: 503}
        box = outbox.Outbox.open(state)
        sender = Appends(Receiver())
        sender.rx.fail_on = set(range(1, 1000))  # down from here on
        tasks: list[asyncio.Task[None]] = []
        ship = shipper(rx, keep=keeper(box, sender, tasks))
        await ship.write(b"\x00raw\xffbytes\n")
        await ship.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        box.close()  # the worker is gone; its report stays on disk

    async def second() -> Receiver:
        box = outbox.Outbox.open(state)
        (report,) = box.reports()
        assert (report.kind, report.job_id, report.body) == (outbox.LOG, "j", {"lease_epoch": 3})
        rx = Receiver()
        assert await delivery.deliver(box, report, Appends(rx), FAST) is delivery.Verdict.DELIVERED
        box.close()
        return rx

    run(first(), 10)
    assert run(second(), 10).chunks == [b"\x00raw\xffbytes\n"]


def test_a_chunk_too_large_or_stale_is_refused_for_good_from_the_outbox() -> None:
    for status in sorted(delivery.LOG_REFUSALS):
        assert (
            delivery.judge(Answer(core.Head(status, "", {}), b""), outbox.LOG)
            is delivery.Verdict.REFUSED
        )
    for status in (401, 408, 429, 500, 503):
        assert (
            delivery.judge(Answer(core.Head(status, "", {}), b""), outbox.LOG)
            is delivery.Verdict.RETRY
        )
    assert (
        delivery.judge(Answer(core.Head(413, "", {}), b"")) is delivery.Verdict.RETRY
    )  # a report's rule


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
