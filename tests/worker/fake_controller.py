"""An in-memory controller for agent tests, reached through httpx's transport hook.

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
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
import worker_helpers
from worker_helpers import new_job_id

from resource_controller.clock import Clock
from resource_controller.worker import agent as agent_mod
from resource_controller.worker import config as wc
from resource_controller.worker import outbox
from resource_controller.worker.timings import Timings


class FakeController:
    """The worker routes, in memory, with knobs for failures."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
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
        self.answers: list[httpx.Response] = []
        self.poll_hold = 0.05
        #: Called with the requested ``wait`` text when a poll is about to answer 204
        #: (a test advancing a fake clock by the time the poll "took").
        self.on_idle_poll: Callable[[str], None] | None = None
        self.register_status = 200
        self.register_hang = False
        #: Answers to terminal reports, in order, before answering 200: a status code
        #: (with a generic error body) or a whole response.
        self.terminal_failures: list[int | httpx.Response] = []
        #: Answers to fault reports, in order, before answering 200.
        self.fault_failures: list[int | httpx.Response] = []
        #: While true, status and fault reports get no answer at all (a refused
        #: connection), as when the controller is down.
        self.reports_unreachable = False
        #: Called at every status or fault request, before it is answered.
        self.on_report: Callable[[httpx.Request], None] | None = None
        self.instance = "instance-a"

    def hand_out(self, *assignments: dict[str, Any], kills: list[str] | None = None) -> None:
        body: dict[str, Any] = {"assignments": list(assignments)}
        if kills:
            body["kills"] = kills
        self.answers.append(httpx.Response(200, json=body))

    def terminal(self, job_id: str) -> list[dict[str, Any]]:
        """Terminal report bodies received for ``job_id`` (every attempt that arrived)."""
        return [b for j, b in self.statuses if j == job_id and b["state"] != "running"]

    def states(self, job_id: str) -> list[str]:
        return [b["state"] for j, b in self.statuses if j == job_id]

    def event_index(self, kind: str, key: str = "") -> list[int]:
        return [i for i, (k, j, _) in enumerate(self.events) if k == kind and (not key or j == key)]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        resp = await self._route(request)
        resp.headers["Rc-Controller-Instance"] = self.instance
        return resp

    @staticmethod
    def _answer(item: int | httpx.Response) -> httpx.Response:
        if isinstance(item, httpx.Response):
            return item
        return httpx.Response(item, json={"error": "x", "message": "refused by the test"})

    async def _route(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        parts = path.strip("/").split("/")
        if path == "/v1/workers/register":
            if self.register_hang:
                await asyncio.sleep(3600)
            self.registrations.append(json.loads(request.content))
            self.events.append(("register", "", len(self.registrations)))
            if self.register_status != 200:
                return httpx.Response(self.register_status, json={"error": "unauthorized"})
            return httpx.Response(200, json={"worker_id": "w-1"})
        if parts[:2] == ["v1", "workers"] and parts[3] == "heartbeat":
            body = json.loads(request.content or b"{}")
            self.heartbeats.append(body)
            self.heartbeat_paths.append(path)
            self.heartbeat_times.append(time.monotonic())
            self.events.append(("heartbeat", "", body))
            return httpx.Response(self.heartbeat_status)
        if parts[:2] == ["v1", "workers"] and parts[3] == "labels":
            body = json.loads(request.content)
            self.label_pushes.append(body)
            self.events.append(("labels", "", body))
            return httpx.Response(200)
        if parts[:2] == ["v1", "workers"] and parts[3] == "assignments":
            self.poll_times.append(time.monotonic())
            self.poll_waits.append(request.url.params.get("wait", ""))
            if self.answers:
                answer = self.answers.pop(0)
                self.events.append(("poll", "", answer.status_code))
                return answer
            await asyncio.sleep(self.poll_hold)
            if self.on_idle_poll is not None:
                self.on_idle_poll(self.poll_waits[-1])
            self.events.append(("poll", "", 204))
            return httpx.Response(204)
        if parts[:2] == ["v1", "jobs"] and parts[3] == "logs":
            self.logs.setdefault(parts[2], bytearray()).extend(request.content)
            self.log_queries.append(parse_qs(request.url.query.decode()))
            self.events.append(("log", parts[2], request.content))
            return httpx.Response(200)
        if parts[:2] == ["v1", "jobs"] and parts[3] == "status":
            return self._status(parts[2], request)
        if parts[:2] == ["v1", "devices"] and parts[3] == "fault":
            if self.on_report is not None:
                self.on_report(request)
            if self.reports_unreachable:
                raise httpx.ConnectError("connection refused", request=request)
            body = json.loads(request.content)
            self.faults.append((parts[2], body))
            if self.fault_failures:
                return self._answer(self.fault_failures.pop(0))
            self.events.append(("fault", parts[2], body["reason"]))
            return httpx.Response(200)
        return httpx.Response(404)

    def _status(self, job_id: str, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        terminal = body["state"] != "running"
        if terminal and self.on_report is not None:
            self.on_report(request)
        if terminal and self.reports_unreachable:
            raise httpx.ConnectError("connection refused", request=request)
        self.statuses.append((job_id, body))
        if terminal and self.terminal_failures:
            return self._answer(self.terminal_failures.pop(0))
        self.events.append(("status", job_id, body["state"]))
        return httpx.Response(200)


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
            transport=httpx.MockTransport(ctl.handle),
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
