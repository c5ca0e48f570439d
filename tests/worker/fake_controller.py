"""A fake controller for agent tests, reached through the worker's own HTTP client.

It implements the worker routes of controller-api.md §6 closely enough for the agent:
registration, heartbeats, long polls, log appends, status and fault reports. Jobs it
hands out are real processes run by the real agent.

Why not the real controller (``test_worker_live`` serves it on loopback for the tests
that can use it): these tests are about what the worker does when the controller
misbehaves in ways the real one never does on purpose, and about the exact bytes the
worker sends. The fake answers a terminal report 409, 500 or not at all for as many
attempts as a test asks, hangs a registration, refuses a fault, switches its
``Rc-Controller-Instance``, hands out exactly the assignment bodies a test writes (the
reference controller's ``null`` maps, unknown fields, malformed answers), answers
long polls at once or advances a test's fake clock while it "waits", and records
every request in order, before any validation could change it.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import h11
import worker_helpers
from worker_helpers import new_job_id

from resource_controller.clock import Clock
from resource_controller.h1 import aio, core
from resource_controller.worker import agent as agent_mod
from resource_controller.worker import config as wc
from resource_controller.worker import outbox
from resource_controller.worker.timings import Timings


class Request:
    """One request as it arrived, before anything looked at it."""

    def __init__(self, method: str, target: str, headers: dict[str, str], content: bytes):
        self.method = method
        self.target = target
        url = urlsplit(target)
        self.path = url.path
        self.query = url.query
        self.params = {k: v[-1] for k, v in parse_qs(url.query).items()}
        #: Names lowercased.
        self.headers = headers
        self.content = content


class Reply:
    """What the fake answers: a status, and a JSON or raw body."""

    def __init__(self, status: int, *, json: Any = None, content: bytes = b"") -> None:
        self.status_code = status
        self.content = content if json is None else _dumps(json)
        self.headers: dict[str, str] = {}
        if json is not None:
            self.headers["Content-Type"] = "application/json"


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


class Unreachable(Exception):
    """Raised by a route: the connection closes without an answer."""


Route = Callable[[Request], Awaitable[Reply]]


class Wire:
    """Serves ``route`` over HTTP/1.1 (h11's server side) on connections the worker's
    own client opens through its ``connect`` seam: each one a socket pair, the far end
    served by a task in the test's loop."""

    def __init__(self, route: Route) -> None:
        self.route = route
        self.connections = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def connect(self, end: core.Endpoint, timeout: float | None) -> aio.Streams:
        mine, theirs = socket.socketpair()
        self.connections += 1
        reader, writer = await asyncio.open_connection(sock=theirs)
        task = asyncio.create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.open_connection(sock=mine)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await _read_request(conn, reader)
                if request is None:
                    return
                try:
                    reply = await self.route(request)
                except Unreachable:
                    return
                headers = [*reply.headers.items(), ("Content-Length", str(len(reply.content)))]
                reason = HTTPStatus(reply.status_code).phrase.encode()
                out = conn.send(
                    h11.Response(status_code=reply.status_code, headers=headers, reason=reason)
                )
                out = (out or b"") + (conn.send(h11.Data(data=reply.content)) or b"")
                writer.write(out + (conn.send(h11.EndOfMessage()) or b""))
                await writer.drain()
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (ConnectionError, h11.RemoteProtocolError):
            return
        finally:
            writer.close()


async def _read_request(conn: h11.Connection, reader: asyncio.StreamReader) -> Request | None:
    """The next request on ``conn``; ``None`` once the worker closed it."""
    head: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(65536))
        elif isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage) and head is not None:
            fields = {k.decode().lower(): v.decode() for k, v in head.headers}
            return Request(head.method.decode(), head.target.decode(), fields, bytes(body))
        else:
            return None


class FakeController:
    """The worker routes, with knobs for failures, behind a ``Wire``."""

    def __init__(self) -> None:
        self.wire = Wire(self.handle)
        self.requests: list[Request] = []
        self.registrations: list[dict[str, Any]] = []
        self.heartbeats: list[dict[str, Any]] = []
        self.heartbeat_paths: list[str] = []
        self.heartbeat_times: list[float] = []
        #: What every heartbeat is answered.
        self.heartbeat_status = 200
        #: Bodies of ``POST /v1/workers/{id}/labels`` (PROBE-050), in order.
        self.label_pushes: list[dict[str, Any]] = []
        self.statuses: list[tuple[str, dict[str, Any]]] = []
        self.faults: list[tuple[str, dict[str, Any]]] = []
        self.logs: dict[str, bytearray] = {}
        self.log_queries: list[dict[str, list[str]]] = []
        #: What happened, in order: ("status", job, state), ("log", job, bytes),
        #: ("register", "", n), ("fault", device, reason), ("heartbeat", "", body),
        #: ("poll", "", status). Reports appear only once accepted.
        self.events: list[tuple[str, str, Any]] = []
        self.poll_times: list[float] = []
        self.poll_waits: list[str] = []
        self.answers: list[Reply] = []
        self.poll_hold = 0.05
        #: Called with the requested ``wait`` text when a poll is about to answer 204
        #: (a test advancing a fake clock by the time the poll "took").
        self.on_idle_poll: Callable[[str], None] | None = None
        self.register_status = 200
        self.register_hang = False
        #: Answers to terminal reports, in order, before answering 200: a status code
        #: (with a generic error body) or a whole response.
        self.terminal_failures: list[int | Reply] = []
        #: Answers to fault reports, in order, before answering 200.
        self.fault_failures: list[int | Reply] = []
        #: While true, status and fault reports get no answer at all (the connection
        #: closes unanswered), as when the controller is down.
        self.reports_unreachable = False
        #: Called at every status or fault request, before it is answered.
        self.on_report: Callable[[Request], None] | None = None
        self.instance = "instance-a"

    def hand_out(self, *assignments: dict[str, Any], kills: list[str] | None = None) -> None:
        body: dict[str, Any] = {"assignments": list(assignments)}
        if kills:
            body["kills"] = kills
        self.answers.append(Reply(200, json=body))

    def terminal(self, job_id: str) -> list[dict[str, Any]]:
        """Terminal report bodies received for ``job_id`` (every attempt that arrived)."""
        return [b for j, b in self.statuses if j == job_id and b["state"] != "running"]

    def states(self, job_id: str) -> list[str]:
        return [b["state"] for j, b in self.statuses if j == job_id]

    def event_index(self, kind: str, key: str = "") -> list[int]:
        return [i for i, (k, j, _) in enumerate(self.events) if k == kind and (not key or j == key)]

    async def handle(self, request: Request) -> Reply:
        self.requests.append(request)
        resp = await self._route(request)
        resp.headers["Rc-Controller-Instance"] = self.instance
        return resp

    @staticmethod
    def _answer(item: int | Reply) -> Reply:
        if isinstance(item, Reply):
            return item
        return Reply(item, json={"error": "x", "message": "refused by the test"})

    async def _route(self, request: Request) -> Reply:
        path = request.path
        parts = path.strip("/").split("/")
        if path == "/v1/workers/register":
            if self.register_hang:
                await asyncio.sleep(3600)
            self.registrations.append(json.loads(request.content))
            self.events.append(("register", "", len(self.registrations)))
            if self.register_status != 200:
                return Reply(self.register_status, json={"error": "unauthorized"})
            return Reply(200, json={"worker_id": "w-1"})
        if parts[:2] == ["v1", "workers"] and parts[3] == "heartbeat":
            body = json.loads(request.content or b"{}")
            self.heartbeats.append(body)
            self.heartbeat_paths.append(path)
            self.heartbeat_times.append(time.monotonic())
            self.events.append(("heartbeat", "", body))
            return Reply(self.heartbeat_status)
        if parts[:2] == ["v1", "workers"] and parts[3] == "labels":
            body = json.loads(request.content)
            self.label_pushes.append(body)
            self.events.append(("labels", "", body))
            return Reply(200)
        if parts[:2] == ["v1", "workers"] and parts[3] == "assignments":
            self.poll_times.append(time.monotonic())
            self.poll_waits.append(request.params.get("wait", ""))
            if self.answers:
                answer = self.answers.pop(0)
                self.events.append(("poll", "", answer.status_code))
                return answer
            await asyncio.sleep(self.poll_hold)
            if self.on_idle_poll is not None:
                self.on_idle_poll(self.poll_waits[-1])
            self.events.append(("poll", "", 204))
            return Reply(204)
        if parts[:2] == ["v1", "jobs"] and parts[3] == "logs":
            self.logs.setdefault(parts[2], bytearray()).extend(request.content)
            self.log_queries.append(parse_qs(request.query))
            self.events.append(("log", parts[2], request.content))
            return Reply(200)
        if parts[:2] == ["v1", "jobs"] and parts[3] == "status":
            return self._status(parts[2], request)
        if parts[:2] == ["v1", "devices"] and parts[3] == "fault":
            if self.on_report is not None:
                self.on_report(request)
            if self.reports_unreachable:
                raise Unreachable
            body = json.loads(request.content)
            self.faults.append((parts[2], body))
            if self.fault_failures:
                return self._answer(self.fault_failures.pop(0))
            self.events.append(("fault", parts[2], body["reason"]))
            return Reply(200)
        return Reply(404)

    def _status(self, job_id: str, request: Request) -> Reply:
        body = json.loads(request.content)
        terminal = body["state"] != "running"
        if terminal and self.on_report is not None:
            self.on_report(request)
        if terminal and self.reports_unreachable:
            raise Unreachable
        self.statuses.append((job_id, body))
        if terminal and self.terminal_failures:
            return self._answer(self.terminal_failures.pop(0))
        self.events.append(("status", job_id, body["state"]))
        return Reply(200)


#: The devices ``make_config`` declares unless told otherwise.
DEVICES: tuple[str | wc.DeviceConfig, ...] = (
    "gpu0",
    wc.DeviceConfig(name="gpu1", max_runtime=3600.9, labels={"rack": "r3"}),
)


def make_config(
    *, devices: Sequence[str | wc.DeviceConfig] = DEVICES, **settings: Any
) -> wc.WorkerConfig:
    settings.setdefault("heartbeat_interval", 0.1)
    settings.setdefault("state_dir", worker_helpers.STATE_DIR)
    return wc.make_config(
        "http://controller.test",
        list(devices),
        token="worker-token",
        host="box",
        **settings,
    )


def job(command: list[str], **fields: Any) -> dict[str, Any]:
    return {"job_id": new_job_id(), "device_id": "box:gpu0", "command": command, **fields}


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def outbox_files(state_dir: str | None = None) -> list[Path]:
    """The report files in a state directory's outbox (the current test's by default)."""
    directory = Path(state_dir or worker_helpers.STATE_DIR) / outbox.SUBDIR
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.endswith(".json"))


class Running:
    """An agent serving a fake controller inside the test's loop."""

    def __init__(
        self,
        ctl: FakeController,
        config: wc.WorkerConfig | None = None,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        timings: Timings = worker_helpers.FAST,
    ) -> None:
        self.ctl = ctl
        self.agent = agent_mod.Agent(
            config or make_config(),
            clock,
            connect=ctl.wire.connect,
            rng=rng,
            timings=timings,
        )
        self.stop = asyncio.Event()
        self._polls_before = len(ctl.poll_times)
        self.task = asyncio.create_task(self.agent.run(self.stop))

    async def started(self) -> Running:
        """Wait for this agent's first poll."""
        await until(lambda: len(self.ctl.poll_times) > self._polls_before or self.task.done())
        return self

    async def finish(self, timeout: float = 20.0) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, timeout)
