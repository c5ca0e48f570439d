"""Log reads that no request can turn against the controller (EXT-LIMITS-1, EXT-LIMITS-4).

A snapshot streams from the file in bounded chunks read off the event loop, so several
snapshots of a large log neither hold it in memory nor stall other requests; an offset
is a byte count in 0..2^63-1, and one past the end reads nothing in either mode.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import psutil
import pytest
from controller_harness import CLIENT, Follower, Harness, assert_empty_ok, assert_error

MiB = 1 << 20
LOG_SIZE = 96 * MiB
READERS = 5


def _write_log(rc: Harness, job_id: str, size: int) -> bytes:
    """A large log written straight into the log store, as a long job would leave it."""
    block = bytes(range(256)) * 4096  # 1 MiB, every byte value
    path = rc.data / "logs" / f"{job_id}.log"
    with open(path, "ab") as f:
        for _ in range(size // len(block)):
            f.write(block)
    return block


class PeakRss:
    """Samples this process's resident set (the controller runs in it) on a thread."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.base = self.proc.memory_info().rss
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak - self.base


@pytest.mark.sqlite_only  # the file store's pread path, 96 MiB written straight to its file
def test_concurrent_snapshots_of_a_large_log_stay_small_and_others_are_answered(
    rc: Harness,
) -> None:
    # EXT-LIMITS-4: five snapshots of a 96 MiB log used to take about twice the file
    # each (read whole, then copied); streamed, the growth is a few chunks.
    job_id, _ = rc.running_job()
    block = _write_log(rc, job_id, LOG_SIZE)
    started = threading.Barrier(READERS + 1)
    release = threading.Event()

    def snapshot() -> tuple[int, bool]:
        c = rc.new_client(CLIENT)
        got, intact = 0, True
        with c.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "false"}) as r:
            assert r.status_code == 200
            chunks = r.iter_raw(256 * 1024)
            first = next(chunks)
            intact = block.startswith(first)
            got += len(first)
            started.wait(timeout=10)
            release.wait(timeout=10)  # hold the snapshot open while others are asked
            for chunk in chunks:
                got += len(chunk)
        return got, intact

    rss = PeakRss()
    readers: list[Future[tuple[int, bool]]] = [rc.background(snapshot) for _ in range(READERS)]
    started.wait(timeout=20)
    # Every snapshot is open and part-read: a cheap request is answered meanwhile.
    asked = time.monotonic()
    r = rc.client.get("/v1/whoami")
    answered = time.monotonic() - asked
    assert r.status_code == 200 and r.json()["role"] == "client"
    assert all(not f.done() for f in readers)
    release.set()
    results = [f.result(timeout=120) for f in readers]
    growth = rss.stop()
    print(f"whoami answered in {answered * 1000:.1f} ms; RSS growth {growth / MiB:.1f} MiB")
    assert results == [(LOG_SIZE, True)] * READERS
    assert growth < 64 * MiB, f"RSS grew by {growth / MiB:.1f} MiB"


def test_snapshot_is_every_stored_byte_in_order(rc: Harness) -> None:
    # API-049 across many chunks: the streamed body is the file exactly.
    job_id, _ = rc.running_job()
    payload = bytes(range(256)) * 5000 + b"tail"  # ~1.2 MiB, several chunks
    for at in range(0, len(payload), 1 << 18):
        rc.svc.logs.append(job_id, payload[at : at + (1 << 18)])
    r = rc.client.get(f"/v1/jobs/{job_id}/logs", params={"follow": "false"})
    assert r.status_code == 200
    assert r.content == payload
    r = rc.client.get(f"/v1/jobs/{job_id}/logs", params={"follow": "false", "offset": "1000001"})
    assert r.content == payload[1000001:]


OFFSET_MAX = 2**63 - 1


def test_offset_range(rc: Harness) -> None:
    # EXT-LIMITS-1: an offset is 0..2^63-1, else 400 bad_request; past the end a snapshot
    # is empty. (2^44 used to fail seek with an OSError, 2^63 with a ValueError: 500s.)
    job_id, _ = rc.running_job()
    rc.append(job_id, b"0123456789")
    url = f"/v1/jobs/{job_id}/logs"
    for past in [10, 11, 2**31, 2**44, 2**62, OFFSET_MAX]:
        r = rc.client.get(url, params={"follow": "false", "offset": str(past)})
        assert r.status_code == 200, (past, r.status_code, r.text)
        assert r.content == b"", past
    for bad in [str(OFFSET_MAX + 1), str(2**64), "9" * 20, "1" * 5000, "0x10", " 1", "١"]:
        r = rc.client.get(url, params={"follow": "false", "offset": bad})
        assert_error(r, 400, "bad_request")
        r = rc.client.get(url, params={"offset": bad})  # follow mode too
        assert_error(r, 400, "bad_request")
    # Leading zeros are still a byte count.
    r = rc.client.get(url, params={"follow": "false", "offset": "0" * 30 + "7"})
    assert r.status_code == 200 and r.content == b"789"


def test_follow_past_the_end_waits_and_ends_cleanly(rc: Harness) -> None:
    # EXT-LIMITS-1: a follow from past the end waits for more; the job's end closes the
    # response properly (it used to be cut mid-stream by the failed read).
    job_id, wid = rc.running_job()
    rc.append(job_id, b"0123456789")
    followers = []
    for offset in ["100", str(2**44), str(OFFSET_MAX), str(2**62)]:
        f = Follower(rc, job_id, offset=offset)
        kind, r, _ = f.next()
        assert kind == "headers" and r.status_code == 200
        rc.append(job_id, b"more")  # still short of the offset: nothing to send
        time.sleep(0.05)
        assert f.events.empty()
        followers.append(f)
    assert_empty_ok(rc.report(job_id, wid, "succeeded", exit_code=0))
    for f in followers:  # each ends cleanly at the job's end, with nothing sent
        kind, _, _ = f.next()
        assert kind == "end"
        f.future.result(timeout=5)


def test_follow_from_an_offset_inside_the_log_replays_the_rest(rc: Harness) -> None:
    # EXT-CLI-5 with reads off the event loop: the rest of a multi-chunk log, in order.
    job_id, wid = rc.running_job()
    payload = bytes(range(256)) * 1000  # 256,000 bytes: eight 32 KiB chunks
    rc.append(job_id, payload)
    f = Follower(rc, job_id, offset="1000")
    assert f.next()[0] == "headers"
    assert f.read_until(payload[1000:]) == payload[1000:]
    rc.append(job_id, b"!")
    assert f.read_until(b"!") == b"!"
    rc.report(job_id, wid, "succeeded", exit_code=0)
    assert f.next()[0] == "end"
