"""How the relayed commands open a job's relay, against a real controller (CLI-085).

``rc run --tty``, ``rc run -i`` and ``rc cp`` each open the output half first, then the
input half; a refusal fails with an error naming the half and the controller's code.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from client.live import CLIENT, WORKER, LiveController
from resource_controller.cli import common, cp, stdin, tty
from resource_controller.client import api
from resource_controller.controller.relay import Half
from resource_controller.h1 import aio

BOUND = 10.0

#: (controller URL, job ID) to the error the command reports for the failed open.
Opener = Callable[[str, str], Coroutine[Any, Any, str]]


async def tty_error(url: str, job_id: str) -> str:
    with open(os.devnull, "rb") as keys, open(os.devnull, "wb") as screen:
        state = await tty._session(url, CLIENT, job_id, keys.fileno(), screen.fileno())
    return state.error


async def stdin_error(url: str, job_id: str) -> str:
    with open(os.devnull, "rb") as keys, open(os.devnull, "wb") as screen:
        state = await stdin._session(url, CLIENT, job_id, keys.fileno(), screen.fileno())
    return state.error


async def cp_error(url: str, job_id: str) -> str:
    with pytest.raises(common.Failure) as info:
        await cp._open_relay(url, CLIENT, job_id)
    return str(info.value)


async def reported(opener: Opener, url: str, job_id: str) -> str:
    async with asyncio.timeout(BOUND):
        return await opener(url, job_id)


OPENERS = pytest.mark.parametrize(
    "opener", [tty_error, stdin_error, cp_error], ids=["run --tty", "run -i", "cp"]
)


@pytest.fixture
def pipe_job(controller: LiveController) -> str:
    """A ``stdio: pipe`` job assigned to box:gpu0, whose worker is registered but never
    polls: nothing but the test talks to the controller meanwhile."""
    body = {"host": "box", "devices": [{"name": "gpu0"}]}
    worker = controller.http(WORKER)
    assert worker.request("POST", "/v1/workers/register", body=body).status == 200
    worker.close()
    with api.JsonClient(controller.url, CLIENT, submitter="tester") as client:
        job = client.submit(["cat"], device="box:gpu0", stdio="pipe")
    assert job["state"] == "assigned", job
    return str(job["id"])


async def only_one_request_in_flight(controller: LiveController) -> None:
    """Until the controller has nothing in flight but the test's own held half."""
    tasks = controller.served.server.server_state.tasks
    async with asyncio.timeout(BOUND):
        while len(tasks) > 1:
            await asyncio.sleep(0.01)


@OPENERS
def test_an_occupied_output_half_fails_naming_it_and_the_input_half_is_never_opened(
    controller: LiveController, pipe_job: str, opener: Opener
) -> None:
    # CLI-085: one client per half; the refusal names the output half and `conflict`.
    # CLI-119: a second client on an occupied half is refused.
    async def scenario() -> str:
        held = await aio.relay(controller.url, "GET", f"/v1/jobs/{pipe_job}/tty/out", CLIENT)
        try:
            error = await reported(opener, controller.url, pipe_job)
            await only_one_request_in_flight(controller)
            # CLI-085: the output half comes first, so its refusal left the input
            # half unrequested: never attached, its direction never opened and closed.
            session = controller.svc.hub.relay.sessions[pipe_job]
            assert session.halves == {Half.CLIENT_OUT}
            assert not session.input.closed
            return error
        finally:
            held.close()

    error = asyncio.run(scenario())
    assert "output half" in error and "input half" not in error, error
    assert "conflict: " in error and "already connected" in error, error


@OPENERS
def test_an_unknown_job_fails_naming_the_output_half_and_not_found(
    controller: LiveController, opener: Opener
) -> None:
    # CLI-085: both halves would be refused; the one named is the one opened first.
    error = asyncio.run(reported(opener, controller.url, "no-such-job"))
    assert "output half" in error and "input half" not in error, error
    assert "not_found: " in error, error
    assert controller.svc.hub.relay.sessions == {}
