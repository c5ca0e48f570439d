"""A leader that loses its lease stops leading before anything else runs (EXT-PG-8), on a
real PostgreSQL database: the controller's link is ended or frozen from outside, the
lease taken from it, or the controller itself frozen past its lease; a trace kept on the
controller's own event loop shows what ran when."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from controller_harness import Harness, open_controller

from resource_controller.clock import FakeClock
from resource_controller.controller import peers, service
from resource_controller.controller.peers import Peers
from resource_controller.store.leadership import Fence
from resource_controller.store.peering import PeerLink
from support import pg

T = TypeVar("T")

#: The periodic pass every 50 ms, so a follower that still ran it would do so often.
TIMINGS = "schedule_interval=0.05"


@dataclass
class Trace:
    """What ran on the controller's loop, each with whether it led then; a repeat of the
    entry just before is not kept."""

    peers: Peers | None = None
    entries: list[tuple[str, bool]] = field(default_factory=list)

    def note(self, kind: str) -> None:
        if self.peers is None:
            return
        entry = (kind, self.peers.leading)
        if not self.entries or self.entries[-1] != entry:
            self.entries.append(entry)

    def since_lost(self) -> list[tuple[str, bool]]:
        taken = list(self.entries)
        first = next(i for i, (kind, _) in enumerate(taken) if kind == "lost")
        return taken[first:]


def recording_link(trace: Trace) -> type[PeerLink]:
    """The real link, noting the moment it finds its connection or its lease gone."""

    class Recording(PeerLink):
        async def renew(self, fence: Fence, lease: float) -> tuple[bool, int]:
            kept, present = await super().renew(fence, lease)
            if not kept:
                trace.note("lost")
            return kept, present

        async def within(self, bound: float, call: Awaitable[T]) -> T:
            try:
                return await super().within(bound, call)
            except ConnectionError:  # the call failed, or outlasted its bound
                trace.note("lost")
                raise

        async def received(self, timeout: float) -> AsyncIterator[str]:
            try:
                async for payload in super().received(timeout):
                    yield payload
            except ConnectionError:
                trace.note("lost")
                raise

    return Recording


async def probe(trace: Trace, stop: threading.Event) -> None:
    """Runs at every turn of the loop: anything that ran between the link's failure and
    the step-down would let it see the controller still leading."""
    while not stop.is_set():
        trace.note("probe")
        await asyncio.sleep(0)


@pytest.fixture
def traced(
    tmp_path: Path, clock: FakeClock, pg_cluster: pg.Cluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Harness, Trace, str]]:
    """A leading controller on a fresh database, its lock link and its periodic passes
    traced, and a probe on its loop until the test ends."""
    trace = Trace()
    monkeypatch.setattr(peers, "PeerLink", recording_link(trace))
    real_pass = service.schedule_pass

    def traced_pass(svc: Any) -> Any:
        trace.note("pass")
        return real_pass(svc)

    monkeypatch.setattr(service, "schedule_pass", traced_pass)
    url = pg_cluster.fresh_database()
    rc = Harness(
        open_controller(tmp_path / "data", clock, TIMINGS, database=url), clock, tmp_path / "data"
    )
    stop = threading.Event()
    try:
        trace.peers = rc.svc.peers
        loop = rc.server.loop
        assert loop is not None
        probing = asyncio.run_coroutine_threadsafe(probe(trace, stop), loop)
        until(lambda: ("pass", True) in trace.entries)  # it leads and runs its pass
        yield rc, trace, url
    finally:
        stop.set()
        rc.close()
    probing.result(timeout=5)


def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def leader_backend(conn: psycopg.Connection[Any]) -> int:
    """The server process of the session renewing the leadership lease."""
    row = conn.execute("SELECT backend FROM leadership").fetchone()
    assert row is not None and row[0], "nobody holds the leadership lease"
    return int(row[0])


def take_over(conn: psycopg.Connection[Any]) -> None:
    """Another controller takes the lease, for long, on ``conn``'s session (its end
    frees the lease at once)."""
    conn.execute(
        "UPDATE leadership SET holder = 'other', epoch = epoch + 1,"
        " backend = pg_backend_pid(), expires_at = extract(epoch FROM clock_timestamp()) + 600"
    )


def assert_stepped_down_first(trace: Trace) -> None:
    """From the failure on, everything that ran saw a follower, and no periodic pass ran."""
    after = trace.since_lost()
    assert after[0] == ("lost", True), after[:3]
    assert after[1] == ("probe", False), after[:3]
    assert all(not leading for _, leading in after[1:]), after
    assert "pass" not in {kind for kind, _ in after}, after


def test_a_leader_whose_link_ends_steps_down_first_and_stops_its_pass(
    traced: tuple[Harness, Trace, str],
) -> None:
    """EXT-PG-8: the link's session is ended while another takes the lease; the flag
    falls before anything else runs, no periodic pass runs while the other holds it,
    and once it is free again the controller leads and passes again."""
    rc, trace, url = traced
    with psycopg.connect(url, autocommit=True) as conn:
        backend = leader_backend(conn)
        take_over(conn)
        conn.execute("SELECT pg_terminate_backend(%s)", (backend,))
        until(lambda: not rc.svc.peers.leading)
        time.sleep(0.5)  # ten periodic intervals as a follower
        assert_stepped_down_first(trace)
    until(lambda: rc.svc.peers.leading)
    until(lambda: ("pass", True) in trace.since_lost())


def test_a_leader_whose_lease_is_taken_steps_down_first_at_its_next_renewal(
    traced: tuple[Harness, Trace, str],
) -> None:
    """EXT-PG-8: another controller holds the lease now; the leader's next renewal finds
    it lost and the flag falls before anything else runs."""
    rc, trace, url = traced
    with psycopg.connect(url, autocommit=True) as conn:
        take_over(conn)
        until(lambda: not rc.svc.peers.leading, timeout=peers.TICK + peers.CHECK_BOUND + 2)
        time.sleep(0.5)
        assert_stepped_down_first(trace)
        # What it would write as leader is refused (``store/leadership.hold``).
        row = conn.execute("SELECT epoch FROM leadership").fetchone()
        assert row is not None and rc.svc.peers.fence == Fence(rc.svc.instance, row[0] - 1)


def test_a_leader_frozen_past_its_lease_wakes_a_follower(
    traced: tuple[Harness, Trace, str],
) -> None:
    """EXT-PG-8: the controller's event loop stands still for longer than its lease (as
    under SIGSTOP) while another takes the lease over; the first thing to run when it
    wakes already sees a follower, and no periodic pass runs."""
    rc, trace, url = traced
    loop = rc.server.loop
    assert loop is not None
    woke = threading.Event()

    def freeze() -> None:
        time.sleep(peers.LEASE + 0.5)
        trace.note("lost")  # the first thing to run on the loop once it wakes
        woke.set()

    loop.call_soon_threadsafe(freeze)
    with psycopg.connect(url, autocommit=True) as conn:
        take_over(conn)  # its lease lapsed meanwhile: another controller took it
        assert woke.wait(peers.LEASE + 10)
        time.sleep(0.5)
        assert trace.since_lost()[0] == ("lost", False)
        assert "pass" not in {kind for kind, _ in trace.since_lost()}
        assert not rc.svc.peers.leading
    until(lambda: rc.svc.peers.leading)  # the other's session ended: it leads again


def test_a_leader_whose_renewal_hangs_steps_down_first_and_stops_its_pass(
    traced: tuple[Harness, Trace, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """EXT-PG-8: the link's server process is frozen, so the renewal never answers; once
    it is given up (after ``CHECK_BOUND``) the flag falls before anything else runs, and
    no periodic pass runs while the frozen session keeps its lease from being taken."""
    rc, trace, url = traced
    # A lease well past the step-down (a tick and the bound, 2.5 s): with the 3 s one a loaded
    # machine stepped down so late that the lease had lapsed, and it rightly led again, inside
    # the half second the test looks.
    monkeypatch.setattr(peers, "LEASE", 8.0)
    until(lambda: rc.svc.peers.leading)
    time.sleep(peers.TICK * 2)  # a renewal under the longer lease
    with psycopg.connect(url, autocommit=True) as conn:
        backend = leader_backend(conn)
    os.kill(backend, signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        until(lambda: not rc.svc.peers.leading, timeout=20)
        # Within a tick and the renewal's bound, not the ten seconds more psycopg would
        # spend asking the server to cancel the query.
        took = time.monotonic() - frozen
        assert took < peers.TICK + peers.CHECK_BOUND + 2, took
        time.sleep(0.5)  # ten periodic intervals as a follower
        assert_stepped_down_first(trace)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(backend, signal.SIGCONT)
    until(lambda: rc.svc.peers.leading, timeout=20)  # its lease lapsed: it takes it again
