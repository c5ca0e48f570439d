"""The controller suite's harness: a real ``rc serve`` app on loopback, per test.

Every test gets a fresh data directory, a ``FakeClock`` (so ages and the 30 s kill
re-delivery are exact without sleeping) and a uvicorn server from ``make_server`` on an
ephemeral 127.0.0.1 port, running in its own thread with its own event loop. Long polls
and log follows need a real socket: ``httpx.ASGITransport`` buffers whole bodies
(style/EXAMPLES.md §8).

The periodic scheduling pass is stretched to 30 s, so anything that "happens at once"
here happened because the controller reacted to the change (EXT-FAST-1), not because
the 1 s safety net (SRV-030) happened to tick. The reaper is stretched to an hour, so
advancing the fake clock never sweeps behind a test's back; reaper tests shorten it
again through ``RC_TEST_TIMINGS`` syntax (``open_controller(..., timings=...)``).
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from resource_controller.clock import FakeClock
from resource_controller.controller import serve, table
from resource_controller.controller.deps import Route, Services, Settings
from resource_controller.store.logs import LogStore
from support.served import ServedController as LiveServer

TOKENS = "wtok:worker,ctok:client,atok:admin"
WORKER, CLIENT, ADMIN = "wtok", "ctok", "atok"
START = 1_800_000_000.0  #: the fake clock's first instant (2027-01-15T08:00:00Z)

#: Client-side bound on every request: a controller that never answers fails the
#: test instead of hanging it. Longer than any wait a test expects to be woken from.
TIMEOUT = httpx.Timeout(15.0)


#: Loop timings of the ordinary harness: no periodic pass ever runs during a test.
QUIET = Settings(schedule_interval=30.0, sweep_interval=3600.0)


def open_controller(
    data: Path,
    clock: FakeClock,
    timings: str = "",
    retain: bool = False,
    database: str = "",
    webhook_url: str = "",
) -> LiveServer:
    """A started controller; ``timings`` as ``RC_TEST_TIMINGS`` would give them;
    ``database`` a PostgreSQL URL, else SQLite in ``data``; ``webhook_url`` where its
    notices go (none by default)."""
    settings = dataclasses.replace(QUIET, retain_disconnected_jobs=retain, webhook_url=webhook_url)
    svc = serve.open_services(
        data, TOKENS, settings, clock, test_timings=timings, database=database
    )
    server = LiveServer(svc)
    server.start()
    # On PostgreSQL leadership is taken just after start (controller/peers.py): a test
    # begins with this controller leading, as it always does on SQLite.
    deadline = time.monotonic() + 10
    while not svc.peers.leading and time.monotonic() < deadline:
        time.sleep(0.01)
    assert svc.peers.leading, "the controller under test did not take the leadership"
    return server


@dataclass
class Harness:
    """One controller under test plus role clients and small request helpers."""

    server: LiveServer
    clock: FakeClock
    data: Path
    _clients: list[httpx.Client] = field(default_factory=list)
    _pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=8, thread_name_prefix="rc-test")
    )

    def __post_init__(self) -> None:
        self.worker = self.new_client(WORKER)
        self.client = self.new_client(CLIENT)
        self.admin = self.new_client(ADMIN)
        self.anon = self.new_client(None)

    # ---- plumbing -------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def svc(self) -> Services:
        return self.server.svc

    def new_client(self, token: str | None, timeout: httpx.Timeout = TIMEOUT) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # Plain HTTP on loopback: skip building a TLS context per client (it costs ~30 ms).
        c = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, verify=False)
        self._clients.append(c)
        return c

    def background(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Future[Any]:
        """Run a blocking call (a long poll, a follow) off the test thread."""
        return self._pool.submit(fn, *args, **kw)

    def wait_idle(self, timeout: float = 2.0) -> bool:
        """True once the server has no request in flight (every handler returned)."""
        deadline = time.monotonic() + timeout
        while self.server.server.server_state.tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    # ---- the stored output, wherever the store keeps it -------------------------------

    def stored_log(self, job_id: str) -> bytes | None:
        """A job's stored output, read from the store itself (its file, or its rows on
        PostgreSQL); None when the job has no log at all."""
        if job_id not in self.logged_jobs():
            return None
        snap = self.svc.logs.snapshot(job_id)
        try:
            out = b""
            while chunk := snap.read():
                out += chunk
            return out
        finally:
            snap.close()

    def logged_jobs(self) -> set[str]:
        """The jobs the store keeps a log for (created on a first append or follow)."""
        logs = self.svc.logs
        if isinstance(logs, LogStore):
            return {p.stem for p in logs.directory.glob("*.log")}
        url = self.svc.store.database_url
        with psycopg.connect(url or "", autocommit=True) as conn:
            return {r[0] for r in conn.execute("SELECT job_id FROM job_logs")}

    def close(self) -> None:
        """End waiting polls and follows, drop every connection, then stop the server."""
        try:
            self.server.begin_shutdown()
            self._pool.shutdown(wait=True, cancel_futures=True)
            for c in self._clients:
                c.close()
        finally:
            self.server.stop()

    # ---- worker side ----------------------------------------------------------------

    def register(self, host: str = "gpubox", devices: Any = ("gpu0",), **extra: Any) -> str:
        decl = [d if isinstance(d, dict) else {"name": d} for d in devices]
        r = self.worker.post("/v1/workers/register", json={"host": host, "devices": decl, **extra})
        assert r.status_code == 200, r.text
        return str(r.json()["worker_id"])

    def poll(self, worker_id: str, wait: str | None = "100ms", **kw: Any) -> httpx.Response:
        params = {"wait": wait} if wait is not None else {}
        client: httpx.Client = kw.pop("client", self.worker)
        return client.get(f"/v1/workers/{worker_id}/assignments", params=params, **kw)

    def take(self, worker_id: str) -> list[dict[str, Any]]:
        """Collect this worker's pending assignments (they become ``running``)."""
        r = self.poll(worker_id)
        assert r.status_code == 200, (r.status_code, r.text)
        return list(r.json()["assignments"])

    def report(self, job_id: str, worker_id: str, state: str, **fields: Any) -> httpx.Response:
        body = {"worker_id": worker_id, "state": state, **fields}
        return self.worker.post(f"/v1/jobs/{job_id}/status", json=body)

    def append(self, job_id: str, chunk: bytes, **params: Any) -> httpx.Response:
        return self.worker.post(f"/v1/jobs/{job_id}/logs", content=chunk, params=params)

    def fault(self, device_id: str, reason: str = "verify failed: leftover pid 42") -> None:
        r = self.worker.post(f"/v1/devices/{device_id}/fault", json={"reason": reason})
        assert r.status_code == 200, r.text

    # ---- client side ----------------------------------------------------------------

    def submit_raw(self, **fields: Any) -> httpx.Response:
        body: dict[str, Any] = {"command": ["python", "train.py"], "submitter": "alice"}
        body.update(fields)
        return self.client.post("/v1/jobs", json=body)

    def submit(self, **fields: Any) -> dict[str, Any]:
        r = self.submit_raw(**fields)
        assert r.status_code == 201, r.text
        return dict(r.json())

    def job(self, job_id: str) -> dict[str, Any]:
        r = self.client.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return dict(r.json()["job"])

    def device(self, device_id: str) -> dict[str, Any]:
        views = self.client.get("/v1/devices").json()
        return next(v for v in views if v["device"]["id"] == device_id)

    def running_job(self, device_id: str = "gpubox:gpu0", host: str = "gpubox") -> tuple[str, str]:
        """Register ``host`` if needed, submit to ``device_id``, hand it out; (job id, worker id)."""
        wid = self.register(host, (device_id.split(":", 1)[1],))
        job = self.submit(device_id=device_id)
        assert job["state"] == "assigned", job
        assert [a["job_id"] for a in self.take(wid)] == [job["id"]]
        return job["id"], wid


def assert_error(r: httpx.Response, status: int, code: str) -> str:
    """The API-002 error body: exactly ``error`` and ``message``; returns the message."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    assert set(body) == {"error", "message"}, body
    assert body["error"] == code, body
    assert isinstance(body["message"], str) and body["message"], body
    return str(body["message"])


def assert_empty_ok(r: httpx.Response) -> None:
    """API-008: 200 with no body and no JSON content type."""
    assert r.status_code == 200, (r.status_code, r.text)
    assert r.content == b""
    assert "application/json" not in r.headers.get("content-type", "")


class Follower:
    """A log follow read on a background thread; events arrive on a queue with timestamps."""

    def __init__(self, rc: Harness, job_id: str, **params: str) -> None:
        self.events: queue.Queue[tuple[str, Any, float]] = queue.Queue()
        self.client = rc.new_client(CLIENT)
        self.future = rc.background(self._run, job_id, params)

    def _run(self, job_id: str, params: dict[str, str]) -> None:
        try:
            with self.client.stream("GET", f"/v1/jobs/{job_id}/logs", params=params) as r:
                self.events.put(("headers", r, time.monotonic()))
                for chunk in r.iter_raw():
                    self.events.put(("chunk", chunk, time.monotonic()))
            self.events.put(("end", None, time.monotonic()))
        except Exception as exc:
            self.events.put(("error", exc, time.monotonic()))

    def next(self, timeout: float = 5.0) -> tuple[str, Any, float]:
        kind, value, at = self.events.get(timeout=timeout)
        if kind == "error":
            raise value
        return kind, value, at

    def read_until(self, expected: bytes, timeout: float = 5.0) -> bytes:
        """Collect chunks until ``expected`` bytes have arrived (or fail after ``timeout``)."""
        got = b""
        deadline = time.monotonic() + timeout
        while len(got) < len(expected):
            kind, value, _ = self.next(max(0.01, deadline - time.monotonic()))
            assert kind == "chunk", (kind, got)
            got += value
        return got


#: The route table by (lowercase method, template), as the OpenAPI document keys them.
ROUTES: dict[tuple[str, str], Route] = {(r.method.lower(), r.path): r for r in table.ROUTES}


def role_of(route: Route) -> str:
    """The role a route needs in words; "none" when it takes no token."""
    return route.role.value if route.role else "none"
