"""Bounded storage (EXT-KEEP-1): the per-job cap keeps head and tail with a marker between,
and the retention pass deletes old jobs' output while their rows stay."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from resource_controller.clock import FakeClock
from resource_controller.controller import serve, service
from resource_controller.controller.deps import Settings
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob
from resource_controller.store.logrows import DatabaseLogStore
from resource_controller.store.logs import MARKER_ROOM, JobLogs, LogStore
from support import pg, store_helpers

if TYPE_CHECKING:
    from conftest import Factory

KIB = 1024
CAP = 64 * KIB
HEAD = CAP // 2
TAIL = CAP - HEAD - MARKER_ROOM
MARKER = re.compile(rb"\n\[rc: (\d+) bytes of output dropped here: [^\]\n]*\]\n")


def output(size: int, seed: int = 7) -> bytes:
    """Bytes that differ everywhere, so a misplaced slice cannot pass for the right one."""
    return random.Random(seed).randbytes(size)


OpenLogs = Callable[[int], JobLogs]


@pytest.fixture(params=["files", "database"])
def open_logs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenLogs]:
    """A log store with a given cap: files in ``tmp_path``, or rows in a fresh PostgreSQL
    database (EXT-PG-4); both keep the same view."""
    if request.param == "files":
        yield lambda cap: LogStore(tmp_path, cap)
        return
    url = request.getfixturevalue("pg_cluster").fresh_database()
    made: list[DatabaseLogStore] = []

    def make(cap: int) -> JobLogs:
        made.append(DatabaseLogStore(url, cap))
        return made[-1]

    yield make
    for logs in made:
        logs.close()


def stored(logs: JobLogs, job_id: str, settled: bool = True) -> bytes:
    snap = logs.snapshot(job_id, settled=settled)
    try:
        out = b""
        while chunk := snap.read(5000):  # small reads cross every piece boundary
            out += chunk
        return out
    finally:
        snap.close()


def stored_bytes(logs: JobLogs, job_id: str) -> int:
    """The length of the stored view (head, marker and tail) of a job's log."""
    snap = logs.snapshot(job_id)
    try:
        return snap.end
    finally:
        snap.close()


def test_one_megabyte_under_a_64k_cap_keeps_head_marker_and_tail(
    open_logs: OpenLogs, tmp_path: Path
) -> None:
    logs = open_logs(CAP)
    data = output(1_000_000)
    for at in range(0, len(data), 4096):
        logs.append("job1", data[at : at + 4096])
    got = stored(logs, "job1")
    assert len(got) <= CAP
    assert got[:HEAD] == data[:HEAD]
    m = MARKER.match(got, HEAD)
    assert m is not None, got[HEAD : HEAD + 200]
    assert int(m.group(1)) == len(data) - HEAD - TAIL
    assert got[m.end() :] == data[-TAIL:]
    assert stored_bytes(logs, "job1") == len(got)
    if not isinstance(logs, LogStore):
        return
    # On disk: the head file never grew past its half; the ring never past its size.
    assert (tmp_path / "job1.log").stat().st_size == HEAD
    assert (tmp_path / "job1.tail").stat().st_size == 16 + TAIL


def test_a_chunk_larger_than_the_whole_cap_keeps_its_own_head_and_tail(
    open_logs: OpenLogs, tmp_path: Path
) -> None:
    logs = open_logs(CAP)
    data = output(300 * KIB)
    logs.append("big", data)
    got = stored(logs, "big")
    m = MARKER.search(got)
    assert m is not None
    assert got[: m.start()] == data[:HEAD] and got[m.end() :] == data[-TAIL:]


def test_output_under_the_cap_is_stored_exactly(open_logs: OpenLogs, tmp_path: Path) -> None:
    logs = open_logs(CAP)
    data = output(HEAD + TAIL)  # the most that fits with nothing dropped
    for at in range(0, len(data), 1000):
        logs.append("fits", data[at : at + 1000])
    assert stored(logs, "fits") == data


def test_a_follower_of_a_running_job_reads_only_bytes_that_never_move(
    open_logs: OpenLogs, tmp_path: Path
) -> None:
    logs = open_logs(CAP)
    data = output(200 * KIB)
    logs.append("live", data)
    assert stored(logs, "live", settled=False) == data[:HEAD]
    # Once settled the view continues from where the follower stopped.
    snap = logs.snapshot("live", HEAD)
    try:
        rest = b""
        while chunk := snap.read(CAP):
            rest += chunk
    finally:
        snap.close()
    assert MARKER.match(rest) is not None and rest.endswith(data[-1000:])


def test_without_a_cap_everything_is_stored(open_logs: OpenLogs, tmp_path: Path) -> None:
    logs = open_logs(0)
    data = output(200 * KIB)
    logs.append("all", data[:100])
    logs.append("all", data[100:])
    assert stored(logs, "all") == data
    assert not (tmp_path / "all.tail").exists()
    assert stored_bytes(logs, "all") == len(data) and stored_bytes(logs, "none") == 0


def test_a_ring_keeps_its_size_when_the_cap_changes(tmp_path: Path) -> None:
    data = output(300 * KIB)
    LogStore(tmp_path, CAP).append("j", data[: 150 * KIB])
    bigger = LogStore(tmp_path, 4 * CAP)  # a restart with another cap
    bigger.append("j", data[150 * KIB :])
    got = stored(bigger, "j")
    m = MARKER.search(got)
    assert m is not None
    assert got[: m.start()] == data[:HEAD] and got[m.end() :] == data[-TAIL:]


def test_delete_removes_head_and_tail(open_logs: OpenLogs, tmp_path: Path) -> None:
    logs = open_logs(CAP)
    logs.append("gone", output(100 * KIB))
    assert logs.delete("gone") is True
    assert stored(logs, "gone") == b""
    assert logs.delete("gone") is False
    if isinstance(logs, LogStore):
        assert list(tmp_path.iterdir()) == []


# ---- retention ------------------------------------------------------------------------


def finish(store: Store, make: Factory, device: str, clock: FakeClock) -> str:
    job = make.start(device=device)
    store_helpers.release(store, job.id, "succeeded", 0)
    clock.advance(1)
    return job.id


def test_logs_to_prune_are_jobs_ended_before_the_cutoff_oldest_first(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    d0, _ = make.worker()
    old = [finish(store, make, d0, clock) for _ in range(3)]
    clock.advance(3600)
    recent = finish(store, make, d0, clock)
    queued = make.submit(device=d0, command=("never",))
    clock.advance(60)
    assert store.views.logs_to_prune(600, 2) == old[:2]
    assert store.views.logs_to_prune(600, 10) == old
    store.views.mark_logs_pruned(old[:2])
    assert store.views.logs_to_prune(600, 10) == [old[2]]
    assert store.views.logs_to_prune(30, 10) == [old[2], recent]
    assert queued.id not in store.views.logs_to_prune(0, 100)
    assert store.views.job(old[0]).state == "succeeded"  # the row stays


def test_the_retention_pass_deletes_old_output_in_bounded_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock(1_800_000_000.0)
    settings = dataclasses.replace(Settings(), log_retention=3600)
    svc = serve.open_services(tmp_path / "data", "wtok:worker", settings, clock)
    try:
        svc.store.devices.register("box", "b", [("gpu0", 0)])
        ids = []
        for _ in range(5):
            job = svc.store.queue.enqueue(
                NewJob(command=["x"], submitter="a", device_id="box:gpu0")
            )
            svc.store.queue.run_pass()
            svc.logs.append(job.id, b"output\n")
            store_helpers.release(svc.store, job.id, "succeeded", 0)
            ids.append(job.id)
            clock.advance(1)  # distinct ends: the pass takes the oldest first
        monkeypatch.setattr(service, "RETENTION_BATCH", 2)

        def prune() -> list[str]:
            return asyncio.run(service.prune_logs(svc, svc.peers.fence)).value

        assert prune() == []  # nothing ended an hour ago yet
        clock.advance(3600)
        assert prune() == ids[:2]
        assert prune() == ids[2:4]
        assert prune() == ids[4:]
        assert prune() == []
        for job_id in ids:
            assert stored(svc.logs, job_id) == b""
            assert svc.store.views.job(job_id).state == "succeeded"
    finally:
        svc.executor.shutdown(wait=True)
        svc.store.close()


def test_controllers_sharing_a_database_append_to_and_read_one_log(
    pg_cluster: pg.Cluster,
) -> None:
    # EXT-PG-4: a worker's chunks may reach any controller; any other reads them all.
    url = pg_cluster.fresh_database()
    a, b, reader = (DatabaseLogStore(url, CAP) for _ in range(3))
    try:
        data = output(150 * KIB)
        for n, at in enumerate(range(0, len(data), 3000)):
            (a if n % 2 else b).append("shared", data[at : at + 3000])
        got = stored(reader, "shared")
        m = MARKER.search(got)
        assert m is not None
        assert got[: m.start()] == data[:HEAD] and got[m.end() :] == data[-TAIL:]
    finally:
        for logs in (a, b, reader):
            logs.close()
