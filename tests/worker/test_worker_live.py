"""The agent against the real controller on loopback: submit, run, log, kill, hold,
an outcome that outlives a worker restart, and a controller restart.

The controller (``rc serve``'s app and store) runs in its own thread and event loop on
an ephemeral 127.0.0.1 port; the agent runs in the test's loop; a client submits jobs
over HTTP. Nothing is faked on either side; where a test needs the network to fail,
``Recording``, in front of the real controller where the agent opens its connections,
leaves that request unanswered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import worker_helpers
from fake_controller import Reply, Request, Unreachable, Wire
from live_controller import HOST, LiveController
from worker_helpers import FAST, SESSION_PREFIX, run

from resource_controller.worker import agent as agent_mod
from resource_controller.worker import config as wc


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[LiveController]:
    ctl = LiveController(tmp_path / "data")
    yield ctl
    ctl.stop()


def live_config(url: str, **settings: Any) -> wc.WorkerConfig:
    settings = {"heartbeat_interval": 0.5, "poll_wait": 5, **settings}
    return wc.make_config(
        url,
        ["gpu0", "gpu1"],
        token="wtok",
        host=HOST,
        state_dir=worker_helpers.STATE_DIR,
        **settings,
    )


async def with_worker(ctl: LiveController, scenario: Any) -> Any:
    """Run ``scenario(client)`` while a registered agent serves the controller."""
    agent = agent_mod.Agent(live_config(ctl.url), timings=FAST)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    client = httpx.AsyncClient(
        base_url=ctl.url, headers={"Authorization": "Bearer ctok"}, timeout=10
    )
    try:
        deadline = time.monotonic() + 10
        while not agent.worker_id:
            assert not task.done() and time.monotonic() < deadline
            await asyncio.sleep(0.01)
        return await scenario(client)
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
        await client.aclose()


async def submit(client: httpx.AsyncClient, **fields: Any) -> str:
    body = {"device_id": f"{HOST}:gpu0", "submitter": "tester", **fields}
    r = await client.post("/v1/jobs", json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def until_state(
    client: httpx.AsyncClient, job_id: str, states: set[str], timeout: float = 15.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        r = await client.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        job: dict[str, Any] = r.json()["job"]
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, f"job stuck in {job['state']}"
        await asyncio.sleep(0.05)


def test_job_runs_end_to_end(controller: LiveController) -> None:
    async def scenario(client: httpx.AsyncClient) -> None:
        script = (
            'echo "hello $RC_DEVICE $CUDA_VISIBLE_DEVICES"; echo "epoch=$RC_LEASE_EPOCH"; exit 3'
        )
        job_id = await submit(client, command=["sh", "-c", script], env={"TAG": SESSION_PREFIX})
        job = await until_state(client, job_id, {"failed", "succeeded", "killed", "lost"})
        assert (job["state"], job["exit_code"]) == ("failed", 3)
        r = await client.get(f"/v1/jobs/{job_id}/logs", params={"follow": "false"})
        # The epoch reached the job, and the logs and the report echoing it were
        # accepted (the controller refuses a stale one: EXT-EPOCH-3).
        assert job["lease_epoch"] >= 1
        assert r.text == f"hello {HOST}:gpu0 0\nepoch={job['lease_epoch']}\n"

    run(with_worker(controller, scenario), 40)


def test_kill_reaches_the_running_job(controller: LiveController) -> None:
    async def scenario(client: httpx.AsyncClient) -> None:
        job_id = await submit(client, command=["sh", "-c", "echo up; exec sleep 30"])
        await until_state(client, job_id, {"running"})
        deadline = time.monotonic() + 10
        while not (await client.get(f"/v1/jobs/{job_id}/logs?follow=false")).text:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        r = await client.post(f"/v1/jobs/{job_id}/kill", json={"submitter": "tester"})
        assert r.status_code == 200, r.text
        job = await until_state(client, job_id, {"killed", "failed", "succeeded", "lost"})
        assert job["state"] == "killed"
        assert job["kill_reason"] == "cancelled"

    run(with_worker(controller, scenario), 40)


def test_hold_ends_at_its_ttl(controller: LiveController) -> None:  # WRK-126
    async def scenario(client: httpx.AsyncClient) -> None:
        job_id = await submit(client, kind="hold", max_runtime_seconds=1, reason="probe")
        job = await until_state(client, job_id, {"killed", "failed", "succeeded", "lost"})
        assert job["state"] == "killed"
        assert job["kill_reason"] == "max_runtime exceeded (1s)"

    run(with_worker(controller, scenario), 40)


def test_shutdown_reports_running_jobs_killed(controller: LiveController) -> None:  # WRK-130
    async def scenario(client: httpx.AsyncClient) -> str:
        job_id = await submit(client, command=["sleep", "30"], env={"TAG": SESSION_PREFIX})
        await until_state(client, job_id, {"running"})
        return job_id

    async def go() -> None:
        job_id = await with_worker(controller, scenario)
        async with httpx.AsyncClient(
            base_url=controller.url, headers={"Authorization": "Bearer ctok"}, timeout=10
        ) as client:
            job = await until_state(client, job_id, {"killed", "failed", "succeeded", "lost"})
        assert (job["state"], job["kill_reason"]) == ("killed", "cancelled: worker stopped")

    run(go(), 40)


# ---- outcomes survive, controllers restart ---------------------------------------


class Recording:
    """Plugged in where the agent opens its connections: each request is noted, then
    passed to the real controller (``refuse``: matching ones go unanswered, their
    connection closed, as when the controller is unreachable)."""

    def __init__(self, url: str, refuse: Callable[[Request], bool] | None = None) -> None:
        self.seen: list[tuple[str, str]] = []
        self.refuse = refuse
        self.connect = Wire(self._forward).connect
        self._upstream = httpx.AsyncClient(base_url=url, timeout=None)

    async def _forward(self, request: Request) -> Reply:
        self.seen.append((request.method, request.path))
        if self.refuse is not None and self.refuse(request):
            raise Unreachable
        passed = {
            k: v for k, v in request.headers.items() if k in ("authorization", "content-type")
        }
        resp = await self._upstream.request(
            request.method, request.target, content=request.content, headers=passed
        )
        reply = Reply(resp.status_code, content=resp.content)
        reply.headers = {
            k: v
            for k, v in resp.headers.items()
            if k not in ("content-length", "transfer-encoding")
        }
        return reply

    async def aclose(self) -> None:
        await self._upstream.aclose()


def terminal_report(request: Request) -> bool:
    return request.path.endswith("/status") and b'"running"' not in request.content


def test_outcome_outlives_a_worker_restart(
    controller: LiveController,
) -> None:  # EXT-OUTBOX-1, EXT-OUTBOX-3
    timings = replace(FAST, shutdown_wait=0.5)

    async def go() -> None:
        client = httpx.AsyncClient(
            base_url=controller.url, headers={"Authorization": "Bearer ctok"}, timeout=10
        )
        # The first worker runs the job but none of its terminal reports gets through.
        refusing = Recording(controller.url, refuse=terminal_report)
        first = agent_mod.Agent(
            live_config(controller.url), connect=refusing.connect, timings=timings
        )
        stop = asyncio.Event()
        task = asyncio.create_task(first.run(stop))
        await until_polling(refusing, task)
        job_id = await submit(client, command=["sh", "-c", "exit 5"])
        deadline = time.monotonic() + 15
        while first.pending_job_ids != [job_id]:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        stop.set()
        await asyncio.wait_for(task, 20)
        assert (await until_state(client, job_id, {"running"}))["state"] == "running"
        # A new process on the same state directory: delivers, then registers.
        seen = Recording(controller.url)
        second = agent_mod.Agent(live_config(controller.url), connect=seen.connect, timings=timings)
        stop = asyncio.Event()
        task = asyncio.create_task(second.run(stop))
        await until_polling(seen, task)
        job = await until_state(client, job_id, {"failed", "succeeded", "killed", "lost"})
        devices = (await client.get("/v1/devices")).json()
        stop.set()
        await asyncio.wait_for(task, 20)
        await client.aclose()
        await refusing.aclose()
        await seen.aclose()
        assert (job["state"], job["exit_code"]) == ("failed", 5)  # the real outcome
        paths = [path for _, path in seen.seen]
        assert paths.index(f"/v1/jobs/{job_id}/status") < paths.index("/v1/workers/register")
        gpu0 = next(d for d in devices if d["device"]["id"] == f"{HOST}:gpu0")
        assert gpu0["device"]["state"] == "ready"  # not quarantined

    run(go(), 60)


def test_a_controller_restart_leads_to_a_reregistration(
    tmp_path: Path,
) -> None:  # WRK-151 (instance changed), WRK-150
    ctl = LiveController(tmp_path / "data")

    async def go() -> LiveController:
        nonlocal ctl
        seen = Recording(ctl.url)
        timings = replace(FAST, reregister_jitter=0.05)
        agent = agent_mod.Agent(
            live_config(ctl.url, poll_wait=1), connect=seen.connect, timings=timings
        )
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            await until_polling(seen, task)
            first_instance = agent.contact.instance
            port = int(ctl.url.rsplit(":", 1)[1])
            await asyncio.to_thread(ctl.stop)
            ctl = await asyncio.to_thread(LiveController, tmp_path / "data", port)
            deadline = time.monotonic() + 15
            while agent.contact.instance == first_instance or agent.contact.owed:
                assert time.monotonic() < deadline and not task.done()
                await asyncio.sleep(0.05)
            assert seen.seen.count(("POST", "/v1/workers/register")) == 2
            # Still serving: a job submitted to the new controller runs.
            async with httpx.AsyncClient(
                base_url=ctl.url, headers={"Authorization": "Bearer ctok"}, timeout=10
            ) as client:
                job_id = await submit(client, command=["true"])
                job = await until_state(client, job_id, {"failed", "succeeded", "killed", "lost"})
                assert job["state"] == "succeeded"
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)
            await seen.aclose()
        return ctl

    try:
        run(go(), 60)
    finally:
        ctl.stop()


async def until_polling(seen: Recording, task: asyncio.Task[None]) -> None:
    """Wait for the agent's first poll: the poll loop starts only after registration."""
    deadline = time.monotonic() + 10
    while not any(path.endswith("/assignments") for _, path in seen.seen):
        assert not task.done() and time.monotonic() < deadline
        await asyncio.sleep(0.01)
