"""The event stream (EVT-001..014, AUTH-004) and webhook notifications (HOOKN-001..040),
over real HTTP on loopback: SSE readers on ``GET /v1/events``, webhook receivers on
their own loopback ports (one that records, one that never answers)."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import queue
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from controller_harness import (
    CLIENT,
    WORKER,
    Harness,
    assert_empty_ok,
    assert_error,
    open_controller,
)

from resource_controller.clock import FakeClock
from resource_controller.controller import events, serve, webhooks

AT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d*[1-9])?Z$")  # API-004, sub-second
FAST = "sweep_interval=0.02,hold_off=0"

#: Every kind seen on either channel in this module's session, for the report at the end.
SEEN: dict[str, set[str]] = {"events": set(), "webhooks": set()}


# ---- receivers and readers -----------------------------------------------------------


class Recorder:
    """A webhook receiver on loopback that records every POST (and when it came) and
    answers each of ``answers`` in turn, then 200."""

    def __init__(self, answers: Iterable[int] = ()) -> None:
        self.bodies: queue.Queue[tuple[dict[str, Any], dict[str, str]]] = queue.Queue()
        self.answers = list(answers)
        self.times: list[float] = []
        #: Each POST's request target.
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", "0")))
                outer.times.append(time.monotonic())
                outer.paths.append(self.path)
                outer.bodies.put((json.loads(raw), dict(self.headers)))
                self.send_response(outer.answers.pop(0) if outer.answers else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def next(self, timeout: float = 5.0) -> dict[str, Any]:
        body, _ = self.bodies.get(timeout=timeout)
        SEEN["webhooks"].add(body["event"])
        return body

    def none_within(self, seconds: float) -> bool:
        try:
            self.bodies.get(timeout=seconds)
        except queue.Empty:
            return True
        return False

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Silent:
    """A receiver that accepts connections and never answers a byte."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.held.append(conn)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for c in self.held:
            c.close()
        self.sock.close()


class Reader:
    """An SSE reader on a background thread: every frame, parsed, on a queue."""

    def __init__(self, url: str, headers: dict[str, str], params: dict[str, str]) -> None:
        self.frames: queue.Queue[Any] = queue.Queue()
        self.response: queue.Queue[httpx.Response] = queue.Queue()
        self.client = httpx.Client(base_url=url, headers=headers, timeout=httpx.Timeout(30.0))
        self.thread = threading.Thread(target=self._run, args=(params,), daemon=True)
        self.thread.start()
        self.r = self.response.get(timeout=5)

    def _run(self, params: dict[str, str]) -> None:
        try:
            with self.client.stream("GET", "/v1/events", params=params) as r:
                self.response.put(r)
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.frames.put(json.loads(line[len("data: ") :]))
                    elif line.startswith(":"):
                        self.frames.put(("comment", line))
        except Exception as exc:
            self.frames.put(("error", exc))

    def next(self, timeout: float = 5.0) -> dict[str, Any]:
        got = self.frames.get(timeout=timeout)
        assert isinstance(got, dict), got
        assert set(got) <= {"kind", "at", "payload"} and AT.match(got["at"]), got
        SEEN["events"].add(got["kind"] + (" +payload" if "payload" in got else ""))
        return got

    def until(
        self, match: Callable[[dict[str, Any]], bool], timeout: float = 5.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            got = self.next(max(0.01, deadline - time.monotonic()))
            if match(got):
                return got

    def drain(self, seconds: float = 0.2) -> list[dict[str, Any]]:
        out = []
        deadline = time.monotonic() + seconds
        while True:
            try:
                out.append(self.next(max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                return out

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def readers(rc: Harness) -> Iterator[Callable[..., Reader]]:
    made: list[Reader] = []

    def make(token: str = CLIENT, by: str = "header", base: str | None = None) -> Reader:
        headers = {"Authorization": f"Bearer {token}"} if by == "header" else {}
        params = {"token": token} if by == "query" else {}
        r = Reader(base or rc.url, headers, params)
        made.append(r)
        # Subscribed once the headers are out (the subscription precedes them).
        return r

    try:
        yield make
    finally:
        rc.server.begin_shutdown()
        for r in made:
            r.close()


def job_event(job_id: str, state: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["kind"] == "jobs" and e.get("payload") == {"job_id": job_id, "state": state}


# ---- the event stream ----------------------------------------------------------------


def test_the_stream_answers_with_sse_headers_by_header_and_by_query(
    rc: Harness, readers: Callable[..., Reader]
) -> None:  # EVT-001, AUTH-004
    for by in ("header", "query"):
        r = readers(by=by).r
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        assert r.headers["x-content-type-options"] == "nosniff"
        assert "rc-controller-instance" in r.headers


def test_a_header_token_wins_over_the_query(rc: Harness) -> None:  # AUTH-004
    bad = rc.new_client("nope")
    assert_error(bad.get("/v1/events", params={"token": CLIENT}), 401, "unauthorized")
    assert_error(rc.worker.get("/v1/events", params={"token": CLIENT}), 403, "forbidden")
    assert_error(rc.anon.get("/v1/events"), 401, "unauthorized")
    assert_error(rc.anon.get("/v1/events", params={"token": "nope"}), 401, "unauthorized")
    assert_error(rc.anon.get("/v1/events", params={"token": WORKER}), 403, "forbidden")


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/state"), ("GET", "/v1/devices"), ("POST", "/v1/jobs"), ("GET", "/metrics")],
)
def test_a_query_token_is_ignored_everywhere_else(rc: Harness, method: str, path: str) -> None:
    r = rc.anon.request(method, path, params={"token": CLIENT}, json={})
    assert_error(r, 401, "unauthorized")  # AUTH-004


def test_submit_assign_run_and_end_publish_jobs_events(
    rc: Harness, readers: Callable[..., Reader]
) -> None:  # EVT-010
    wid = rc.register()
    reader = readers(by="query")
    first = rc.submit(device_id="gpubox:gpu0")
    assert reader.until(job_event(first["id"], "assigned"))
    second = rc.submit(device_id="gpubox:gpu0")
    assert reader.until(job_event(second["id"], "queued"))
    rc.take(wid)  # a hand-out publishes nothing (EVT-006)
    assert_empty_ok(rc.report(first["id"], wid, "running"))
    assert reader.until(job_event(first["id"], "running"))
    assert_empty_ok(rc.report(first["id"], wid, "succeeded", exit_code=0))
    assert reader.until(job_event(first["id"], "succeeded"))
    # The scheduler loop places the queued one on the freed device: a bare "jobs" (EVT-011).
    bare = reader.until(lambda e: e["kind"] == "jobs" and "payload" not in e)
    assert bare == {"kind": "jobs", "at": bare["at"]}
    # A repeated terminal report publishes again.
    assert_empty_ok(rc.report(first["id"], wid, "succeeded", exit_code=0))
    assert reader.until(job_event(first["id"], "succeeded"))


def test_kill_and_no_wait_publish_killed_or_the_current_state(
    rc: Harness, readers: Callable[..., Reader]
) -> None:  # EVT-010
    rc.register()
    reader = readers()
    running = rc.submit(device_id="gpubox:gpu0")
    queued = rc.submit(device_id="gpubox:gpu0")
    refused = rc.submit_raw(device_id="gpubox:gpu0", no_wait=True)
    assert refused.status_code == 409
    reader.until(lambda e: e.get("payload", {}).get("state") == "killed")
    kill = {"submitter": "alice"}
    assert_empty_ok(rc.client.post(f"/v1/jobs/{queued['id']}/kill", json=kill))
    assert reader.until(job_event(queued["id"], "killed"))
    assert_empty_ok(rc.client.post(f"/v1/jobs/{running['id']}/kill", json=kill))
    assert reader.until(job_event(running["id"], "assigned"))


def test_an_array_submit_and_kill_publish_one_bare_jobs_event_each(
    rc: Harness, readers: Callable[..., Reader]
) -> None:
    # EXT-ARRAY-1: one event per task would overflow every reader's 32-frame buffer.
    rc.register()
    reader = readers()
    made = rc.submit(device_id="gpubox:gpu0", array="0-99")
    assert made["size"] == 100
    frames = reader.drain(0.5)
    assert [f for f in frames if f["kind"] == "jobs"] != []
    assert all("payload" not in f for f in frames if f["kind"] == "jobs"), frames
    assert len(frames) <= 2, frames
    assert_empty_ok(rc.client.post(f"/v1/jobs/{made['id']}/kill", json={"submitter": "alice"}))
    frames = reader.drain(0.5)
    assert [f["kind"] for f in frames] == ["jobs"] and "payload" not in frames[0], frames


def test_device_changes_publish_the_full_device_list(
    rc: Harness, readers: Callable[..., Reader]
) -> None:  # EVT-012
    reader = readers()
    rc.register()
    event = reader.until(lambda e: e["kind"] == "devices")
    assert event["payload"] == rc.client.get("/v1/devices").json()
    rc.fault("gpubox:gpu0", "fan stopped")
    event = reader.until(lambda e: e["kind"] == "devices")
    assert event["payload"] == rc.client.get("/v1/devices").json()
    assert event["payload"][0]["device"]["state"] == "unhealthy"
    assert_empty_ok(rc.admin.post("/v1/devices/gpubox:gpu0/clear"))
    event = reader.until(lambda e: e["kind"] == "devices")
    assert event["payload"][0]["device"]["state"] == "ready"
    assert rc.admin.delete("/v1/devices/gpubox:gpu0").status_code == 200
    assert reader.until(lambda e: e["kind"] == "devices")["payload"] == []


def test_no_other_kinds_and_nothing_for_heartbeats_or_logs(
    rc: Harness, readers: Callable[..., Reader]
) -> None:  # EVT-006, EVT-014
    job_id, wid = rc.running_job()
    reader = readers()
    assert_empty_ok(rc.worker.post(f"/v1/workers/{wid}/heartbeat", json={}))
    assert_empty_ok(rc.append(job_id, b"hello\n"))
    assert reader.drain(0.3) == []


def test_keepalive_every_interval(
    rc: Harness, readers: Callable[..., Reader], monkeypatch: pytest.MonkeyPatch
) -> None:  # EVT-003
    monkeypatch.setattr(events, "KEEPALIVE", 0.05)
    reader = readers()
    assert reader.frames.get(timeout=5) == ("comment", ": keepalive")


def test_a_full_buffer_drops_for_that_reader_only() -> None:  # EVT-005
    import asyncio

    async def go() -> tuple[int, int, int]:
        b = events.Broadcaster(lambda: 1_800_000_000.25)
        slow, fast = b.subscribe(), b.subscribe()
        for i in range(events.BUFFER + 5):
            b.job(str(i), "queued")
            while not fast.queue.empty():
                fast.queue.get_nowait()
        return slow.queue.qsize(), slow.dropped, fast.dropped

    assert asyncio.run(go()) == (events.BUFFER, 5, 0)
    frame = events.frame(
        "jobs", 1_800_000_000.25, {"job_id": "j", "state": "queued"}, with_payload=True
    )
    assert frame == (
        b'data: {"kind":"jobs","at":"2027-01-15T08:00:00.25Z",'
        b'"payload":{"job_id":"j","state":"queued"}}\n\n'
    )
    assert events.frame("devices", 1_800_000_000.0) == (
        b'data: {"kind":"devices","at":"2027-01-15T08:00:00Z"}\n\n'
    )


def test_a_reader_that_stops_reading_is_cut(
    rc: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:  # EVT-005: a write that misses its deadline disconnects the reader
    monkeypatch.setattr(events, "WRITE_DEADLINE", 0.3)
    rc.register("gpubox", ("gpu0",), labels={"gpu0": {"note": "x" * 60000}})
    sock = socket.create_connection(rc.server.sock.getsockname())
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(f"GET /v1/events?token={CLIENT} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    deadline = time.monotonic() + 10
    while rc.svc.hub.events.subscribers == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # Every label push publishes the whole (large) device list; nobody reads it.
    while rc.svc.hub.events.subscribers and time.monotonic() < deadline:
        r = rc.worker.post("/v1/workers/x/labels", json={"host": "gpubox", "devices": ["gpu0"]})
        assert r.status_code in (200, 400, 404)
        rc.register("gpubox", ("gpu0",), labels={"gpu0": {"note": "y" * 60000}})
    assert rc.svc.hub.events.subscribers == 0
    sock.close()
    assert rc.client.get("/v1/state").status_code == 200  # the controller is fine


# ---- webhooks ------------------------------------------------------------------------


def with_webhook(
    tmp_path: Path, clock: FakeClock, url: str, timings: str = "", database: str = ""
) -> Harness:
    """A controller that posts its notices to ``url``; ``database`` as ``open_controller``."""
    server = open_controller(tmp_path / "data", clock, timings, database=database, webhook_url=url)
    return Harness(server, clock, tmp_path / "data")


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.close()


def test_watchdog_trip_verify_failed_and_device_unhealthy(
    tmp_path: Path, clock: FakeClock, recorder: Recorder
) -> None:  # HOOKN-002, HOOKN-010, HOOKN-011, HOOKN-012a
    rc = with_webhook(tmp_path, clock, recorder.url)
    try:
        job_id, wid = rc.running_job()
        # A job printing the words is not a trip; the reason must START with them.
        assert_empty_ok(rc.report(job_id, wid, "killed", reason="max_runtime exceeded (5s)"))
        body = recorder.next()
        assert body == {
            "event": "watchdog_trip",
            "device": "gpubox:gpu0",
            "job": job_id,
            "reason": "max_runtime exceeded (5s)",
            "at": body["at"],
        }
        assert AT.match(body["at"])
        # The same report retried: one event, not two.
        assert_empty_ok(rc.report(job_id, wid, "killed", reason="max_runtime exceeded (5s)"))
        other = rc.submit(device_id="gpubox:gpu0")["id"]
        rc.take(wid)
        assert_empty_ok(rc.report(other, wid, "failed", reason="said idle: no output for 3s"))
        assert recorder.none_within(0.3)
        hold = rc.submit(device_id="gpubox:gpu0", kind="hold", command=None, max_runtime_seconds=5)
        rc.take(wid)
        assert_empty_ok(rc.report(hold["id"], wid, "killed", reason="max_runtime exceeded (5s)"))
        assert recorder.none_within(0.3)  # a hold reaching its TTL is not a trip
        busy = rc.submit(device_id="gpubox:gpu0")["id"]
        rc.take(wid)
        rc.fault("gpubox:gpu0", "verify failed: leftover pid 42")
        assert fields(recorder.next()) == (
            "verify_failed",
            "gpubox:gpu0",
            busy,
            "verify failed: leftover pid 42",
        )
        rc.fault("gpubox:gpu0", "fan stopped")
        assert fields(recorder.next()) == ("device_unhealthy", "gpubox:gpu0", busy, "fan stopped")
        assert_error(
            rc.worker.post("/v1/devices/nope:gpu9/fault", json={"reason": "x"}), 404, "not_found"
        )
        assert recorder.none_within(0.3)  # a fault against an unknown device: no event
    finally:
        rc.close()


def fields(body: dict[str, Any]) -> tuple[str, str, str, str]:
    assert set(body) == {"event", "device", "job", "reason", "at"} and AT.match(body["at"]), body
    return body["event"], body["device"], body["job"], body["reason"]


def test_device_recovered_at_registration(
    tmp_path: Path, clock: FakeClock, recorder: Recorder
) -> None:  # HOOKN-014
    rc = with_webhook(tmp_path, clock, recorder.url)
    try:
        rc.running_job()
        rc.register("gpubox", ("gpu0",), recovery={"isolated": True})
        event, device, job, reason = fields(recorder.next())
        assert (event, device, job) == ("device_recovered", "gpubox:gpu0", "")
        assert reason.startswith("was quarantined for registration; ")
        assert "isolated PID namespace" in reason
    finally:
        rc.close()


def test_a_sweep_raises_worker_lost_job_lost_lease_expired_in_order(
    tmp_path: Path, clock: FakeClock, recorder: Recorder
) -> None:  # HOOKN-012c, HOOKN-013, HOOKN-015, HOOKN-016, HOOKN-020, STORE-172
    rc = with_webhook(tmp_path, clock, recorder.url, FAST)
    reader = Reader(rc.url, {"Authorization": f"Bearer {CLIENT}"}, {})
    try:
        wid = rc.register("gpubox", ("gpu0", "gpu1"))
        kept = rc.submit(device_id="gpubox:gpu0")["id"]
        forgotten = rc.submit(device_id="gpubox:gpu1")["id"]
        rc.take(wid)
        for _ in range(2):  # past the 5 min lease of a job without runtime
            rc.clock.advance(200)
            assert_empty_ok(
                rc.worker.post(f"/v1/workers/{wid}/heartbeat", json={"running_job_ids": [kept]})
            )
        assert fields(recorder.next()) == (
            "lease_expired",
            "gpubox:gpu1",
            forgotten,
            "lease expired",
        )
        assert fields(recorder.next()) == (
            "device_unhealthy",
            "gpubox:gpu1",
            "",
            "lease_expired",
        )
        bare = reader.until(lambda e: e["kind"] == "devices" and "payload" not in e)  # EVT-013
        assert set(bare) == {"kind", "at"}
        rc.clock.advance(400)  # the worker is written off now
        assert fields(recorder.next(10)) == ("worker_lost", "gpubox:gpu0", "", "worker_lost")
        assert fields(recorder.next()) == ("job_lost", "", kept, "worker lost")
        # gpu1 was already out (lease_expired): nothing more, and no repeats next sweeps.
        assert recorder.none_within(0.3)
    finally:
        reader.close()
        rc.close()


def test_a_receiver_that_never_answers_delays_nothing(tmp_path: Path, clock: FakeClock) -> None:
    # HOOKN-003, HOOKN-006: a hanging endpoint costs notifications and nothing else.
    silent = Silent()
    rc = with_webhook(tmp_path, clock, silent.url)
    try:
        job_id, wid = rc.running_job()
        started = time.monotonic()
        for i in range(20):
            rc.fault("gpubox:gpu0", f"verify failed: {i}")
        assert_empty_ok(rc.report(job_id, wid, "killed", reason="max_runtime exceeded (1s)"))
        assert rc.job(job_id)["state"] == "killed"
        assert_empty_ok(rc.admin.post("/v1/devices/gpubox:gpu0/clear"))
        assert rc.submit(device_id="gpubox:gpu0")["state"] == "assigned"
        assert time.monotonic() - started < 3.0
    finally:
        began = time.monotonic()
        rc.close()
        # The drain on shutdown is bounded (HOOKN-040).
        assert time.monotonic() - began < 12.0
        silent.close()


def test_the_queue_is_bounded_and_drops_without_blocking() -> None:  # HOOKN-003
    import asyncio

    async def go() -> tuple[int, int]:
        n = webhooks.Notifier("http://127.0.0.1:9/")
        for i in range(webhooks.QUEUE + 10):
            n.emit(webhooks.Notice("worker_lost", 0.0, device=str(i)))
        await n.close(0.1)
        n.emit(webhooks.Notice("worker_lost", 0.0))  # after shutdown began: dropped
        return n._queue.qsize(), n.dropped

    assert asyncio.run(go()) == (webhooks.QUEUE, 11)


def deliver_one(
    url: str, backoff: float = webhooks.FIRST_BACKOFF, post_timeout: float = webhooks.POST_TIMEOUT
) -> webhooks.Notifier:
    """Run a notifier until its one event is delivered or dropped."""

    async def go() -> webhooks.Notifier:
        n = webhooks.Notifier(url, backoff=backoff, post_timeout=post_timeout)
        n.start()
        n.emit(webhooks.Notice("worker_lost", 0.0, device="gpubox:gpu0"))
        async with asyncio.timeout(10):
            while n.delivered + n.dropped == 0:
                await asyncio.sleep(0.01)
        await n.close(1.0)
        return n

    return asyncio.run(go())


def test_the_delivery_bounds_are_the_specs() -> None:  # HOOKN-004
    n = webhooks.Notifier("http://127.0.0.1:9/")
    assert (webhooks.ATTEMPTS, n.backoff, n.post_timeout) == (3, 1.0, 10.0)


def test_a_failed_post_is_retried_after_the_backoff_then_delivered() -> None:  # HOOKN-004
    receiver = Recorder(answers=[500, 500])
    try:
        n = deliver_one(receiver.url, backoff=0.5)
    finally:
        receiver.close()
    assert (n.delivered, n.dropped, receiver.bodies.qsize()) == (1, 0, 3)
    first, second = (b - a for a, b in itertools.pairwise(receiver.times))
    assert 0.5 <= first < 1.0 <= second  # the backoff, then twice it


def test_an_event_refused_three_times_is_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:  # HOOKN-004
    receiver = Recorder(answers=[500] * 4)
    try:
        with caplog.at_level(logging.WARNING, logger="resource_controller.controller.webhooks"):
            n = deliver_one(receiver.url, backoff=0.01)
    finally:
        receiver.close()
    assert (n.delivered, n.dropped, receiver.bodies.qsize()) == (0, 1, 3)
    assert receiver.answers == [500]  # no fourth attempt
    assert "webhook worker_lost event dropped after 3 attempts: status 500" in caplog.text


def test_each_post_is_bounded_and_a_timeout_is_a_failed_attempt() -> None:  # HOOKN-004
    silent = Silent()
    try:
        started = time.monotonic()
        n = deliver_one(silent.url, backoff=0.01, post_timeout=0.2)
        took = time.monotonic() - started
    finally:
        silent.close()
    assert (n.delivered, n.dropped) == (0, 1)
    assert 0.6 <= took < 3.0


def test_a_delivery_carries_no_credentials() -> None:  # HOOKN-005
    receiver = Recorder()
    try:
        n = deliver_one(receiver.url)
        body, headers = receiver.bodies.get(timeout=1)
    finally:
        receiver.close()
    assert n.delivered == 1 and body["event"] == "worker_lost"
    names = {k.lower() for k in headers}
    assert names <= {"host", "accept", "accept-encoding", "connection", "user-agent"} | {
        "content-length",
        "content-type",
    }, names
    assert not any(word in name for name in names for word in ("auth", "token", "sign", "secret"))
    assert not any(v.lower().startswith(("bearer", "basic")) for v in headers.values())


def test_sweep_mapping_degrades_when_reads_fail() -> None:  # HOOKN-020
    m = webhooks.sweep_notices
    got = m(0.0, ["h:a"], [], ["L1"], None, {"L1": "h:b"})
    assert [(n.event, n.device, n.reason) for n in got] == [
        ("device_unhealthy", "h:a", ""),
        ("lease_expired", "h:b", "lease expired"),
    ]
    got = m(0.0, [], [], ["L1"], {"h:b": "lease_expired"}, None)
    assert [(n.event, n.device, n.job) for n in got] == [("lease_expired", "", "L1")]
    # A device announced once per sweep, even when a lease on it also expired.
    got = m(0.0, ["h:a"], [], ["L1"], {"h:a": "lease_expired"}, {"L1": "h:a"})
    assert [n.event for n in got] == ["device_unhealthy", "lease_expired"]


def test_without_a_url_no_notifier_exists(rc: Harness) -> None:  # HOOKN-001
    assert rc.svc.hub.notifier is None


def test_the_flag_wins_over_the_environment() -> None:  # SRV-002
    assert serve.webhook_url("http://a/", {"RC_WEBHOOK_URL": "http://b/"}) == "http://a/"
    assert serve.webhook_url("", {"RC_WEBHOOK_URL": "http://b/"}) == "http://b/"
    assert serve.webhook_url("", {}) == ""


def wait_for_state(rc: Harness, device_id: str, state: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while rc.device(device_id)["device"]["state"] != state:
        assert time.monotonic() < deadline, rc.device(device_id)
        time.sleep(0.02)


def test_no_notice_for_what_is_not_one_of_the_seven(
    tmp_path: Path, clock: FakeClock, recorder: Recorder, database: Path | str
) -> None:
    """HOOKN-021: a running report, a no_wait refusal, a cancel, an rc kill, a device
    demoted to unknown and a re-registration raise no notice; a fault before and after
    each does (HOOKN-011, HOOKN-012), so the receiver is shown to be listening."""
    url = database if isinstance(database, str) else ""
    rc = with_webhook(tmp_path, clock, recorder.url, FAST, url)
    try:
        wid = rc.register("gpubox", ("gpu0", "gpu1"))
        rc.fault("gpubox:gpu1", "fan stopped")
        assert fields(recorder.next()) == ("device_unhealthy", "gpubox:gpu1", "", "fan stopped")
        killed = rc.submit(device_id="gpubox:gpu0")["id"]
        rc.take(wid)
        assert_empty_ok(rc.report(killed, wid, "running"))
        assert recorder.none_within(0.3)  # HOOKN-021: a running report
        assert rc.submit_raw(device_id="gpubox:gpu0", no_wait=True).status_code == 409
        assert recorder.none_within(0.3)  # HOOKN-021: a no_wait refusal
        cancelled = rc.submit(device_id="gpubox:gpu0")["id"]
        assert_empty_ok(rc.client.post(f"/v1/jobs/{cancelled}/kill", json={"submitter": "alice"}))
        assert rc.job(cancelled)["state"] == "killed"
        assert recorder.none_within(0.3)  # HOOKN-021: a queued job cancelled
        assert_empty_ok(rc.client.post(f"/v1/jobs/{killed}/kill", json={"submitter": "alice"}))
        assert_empty_ok(rc.report(killed, wid, "killed", reason="cancelled"))
        assert rc.job(killed)["state"] == "killed"
        assert recorder.none_within(0.3)  # HOOKN-021: a running job killed by rc kill
        stranded = rc.submit(device_id="gpubox:gpu0")["id"]
        rc.take(wid)
        rc.clock.advance(60)  # past the 30 s grace, far short of the 300 s write-off
        wait_for_state(rc, "gpubox:gpu0", "unknown")
        assert recorder.none_within(0.3)  # HOOKN-021: a device demoted to unknown
        rc.register("gpubox", ("gpu0", "gpu1"))  # reconciles its stranded job
        assert rc.job(stranded)["state"] == "lost"
        assert recorder.none_within(0.3)  # HOOKN-021: a re-registration
        rc.fault("gpubox:gpu0", "verify failed: leftover pid 42")
        assert fields(recorder.next()) == (
            "verify_failed",
            "gpubox:gpu0",
            "",
            "verify failed: leftover pid 42",
        )
    finally:
        rc.close()


def test_kinds_seen_in_this_session() -> None:
    """Runs last in this module: prints what both channels carried (for the record)."""
    print(json.dumps({k: sorted(v) for k, v in SEEN.items()}))


# ---- health --------------------------------------------------------------------------


def test_healthz_needs_no_token_and_reports_the_store(rc: Harness) -> None:  # EXT-METRICS-3
    r = rc.anon.get("/healthz")
    assert (r.status_code, r.json()) == (200, {"status": "ok", "leader": True})
    assert r.headers["content-type"].startswith("application/json")
    assert_error(rc.anon.get("/v1/state"), 401, "unauthorized")  # AUTH-031 still holds
    rc.svc.store.close()
    r = rc.anon.get("/healthz")
    assert r.status_code == 503 and r.json()["status"] != "ok"


# ---- metrics -------------------------------------------------------------------------


def scrape(rc: Harness) -> dict[str, float]:
    r = rc.client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_metrics_report_the_real_state(rc: Harness) -> None:  # EXT-METRICS-1
    assert_error(rc.anon.get("/metrics"), 401, "unauthorized")
    assert_error(rc.worker.get("/metrics"), 403, "forbidden")
    wid = rc.register("gpubox", ("gpu0", "gpu1", "gpu2"))
    rc.fault("gpubox:gpu2", "fan stopped")
    a = rc.submit(device_id="gpubox:gpu0")["id"]
    rc.submit(device_id="gpubox:gpu1")
    rc.submit(device_id="gpubox:gpu0")
    rc.clock.advance(7)
    rc.take(wid)
    assert_empty_ok(rc.report(a, wid, "succeeded", exit_code=0))
    rc.job(a)
    rc.clock.advance(2)
    m = scrape(rc)
    state = rc.client.get("/v1/state").json()
    by_state: dict[str, int] = {}
    for v in state["devices"]:
        by_state[v["device"]["state"]] = by_state.get(v["device"]["state"], 0) + 1
    for s in ("ready", "busy", "unknown", "unhealthy"):
        assert m[f'rc_devices{{state="{s}"}}'] == by_state.get(s, 0), s
    assert m['rc_devices{state="unhealthy"}'] == 1
    # The third job took gpu0 once the first ended: one active, one running, none queued.
    assert m["rc_queue_depth"] == len(state["queued"]) == 0
    assert m['rc_jobs{state="succeeded"}'] == 1
    assert m['rc_jobs{state="assigned"}'] + m['rc_jobs{state="running"}'] == len(state["jobs"])
    assert m['rc_heartbeat_age_seconds{host="gpubox"}'] == 9
    # Two hand-outs, each 7 s after its submit.
    assert m["rc_submit_to_start_seconds_count"] == 2
    assert m["rc_submit_to_start_seconds_sum"] == 14
    assert m["rc_scheduling_pass_seconds_count"] >= 1
    route = 'rc_http_request_duration_seconds_count{method="GET",route="/v1/jobs/{job_id}"}'
    assert m[route] == 1
    assert not any(a in k for k in m)  # the raw path never becomes a label
    assert rc.anon.get("/no/such/path").status_code == 404
    assert scrape(rc)['rc_http_request_duration_seconds_count{method="GET",route="unmatched"}'] == 1


def test_webhook_deliveries_and_drops_are_counted(
    tmp_path: Path, clock: FakeClock, recorder: Recorder
) -> None:  # EXT-METRICS-1
    rc = with_webhook(tmp_path, clock, recorder.url)
    try:
        rc.register()
        rc.fault("gpubox:gpu0", "verify failed: x")
        recorder.next()
        deadline = time.monotonic() + 5
        while scrape(rc).get('rc_webhook_deliveries_total{event="verify_failed"}') != 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        rc.close()


def test_a_webhook_url_that_cannot_be_posted_to_stops_the_start() -> None:
    # Nothing goes through a proxy: one meant for the URL is named, not bypassed.
    proxied = {"HTTPS_PROXY": "http://proxy.test:3128"}
    with pytest.raises(serve.ServeError, match=r"^HTTPS_PROXY is set, but hooks\.test"):
        serve.webhook_url("https://hooks.test/x", proxied)
    assert serve.webhook_url("https://hooks.test/x", {**proxied, "no_proxy": "hooks.test"})
    assert serve.webhook_url("http://hooks.test/x", proxied)  # for https:// only
    with pytest.raises(serve.ServeError, match=r"^webhook URL 'ftp://h/' is not an http"):
        serve.webhook_url("ftp://h/", {})


def test_the_path_and_query_of_the_url_are_posted_to() -> None:
    receiver = Recorder()
    try:
        n = deliver_one(receiver.url + "/in?key=abc")
        receiver.bodies.get(timeout=1)
    finally:
        receiver.close()
    assert n.delivered == 1
    assert receiver.paths == ["/hook/in?key=abc"]
