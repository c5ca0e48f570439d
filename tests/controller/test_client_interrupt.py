"""Ctrl-C while a submit is on its way (CLI-106, EXT-PYAPI-3): the controller may have
queued the job already, so the Python API holds the interrupt back until the answer
names the job, cancels it, and only then raises ``KeyboardInterrupt``."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
from controller_harness import Harness

from resource_controller.client.aio import AsyncClient
from resource_controller.client.calls import Call
from resource_controller.client.sync import Client


def _interrupted_on_return(real: Any) -> Any:
    """``real``, with a SIGINT to this process just before a submit's answer is handed back."""

    def request(call: Call) -> Any:
        answer = real(call)
        if (call.method, call.path) == ("POST", "/v1/jobs"):
            os.kill(os.getpid(), signal.SIGINT)
        return answer

    return request


@pytest.mark.parametrize("how", ["hold", "run"])
def test_an_interrupt_during_the_submit_cancels_the_job(rc: Harness, how: str) -> None:
    rc.register(devices=("gpu0",))
    with Client(rc.url, "ctok", submitter="tester") as client:
        first = client.hold(ttl="10m", device="gpubox:gpu0", wait=False)  # the device taken
        http = client.low._http
        http.request = _interrupted_on_return(http.request)  # type: ignore[method-assign]
        with pytest.raises(KeyboardInterrupt):
            if how == "hold":
                client.hold(ttl="10m", device="gpubox:gpu0")
            else:
                client.run(["true"], device="gpubox:gpu0")
        (job,) = [j for j in client.jobs(limit=10) if j.id != first.id]
    assert job.state == "killed" and job.started_at is None  # left the queue
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_cancel_while_the_async_submit_is_answered_cancels_the_job(rc: Harness) -> None:
    rc.register(devices=("gpu0",))

    async def main() -> None:
        async with AsyncClient(rc.url, "ctok", submitter="tester") as client:
            await client.hold(ttl="10m", device="gpubox:gpu0", wait=False)  # the device taken
            real = client._http.request
            holding: list[asyncio.Task[Any]] = []

            async def answered_late(call: Call) -> Any:
                answer = await real(call)
                if (call.method, call.path) == ("POST", "/v1/jobs"):
                    holding[0].cancel()  # the hold is queued; its answer still on its way
                    await asyncio.sleep(0.05)
                return answer

            client._http.request = answered_late  # type: ignore[method-assign]
            holding.append(
                asyncio.create_task(client.hold(ttl="10m", device="gpubox:gpu0", wait=False))
            )
            with pytest.raises(asyncio.CancelledError):
                await holding[0]

    asyncio.run(main())
    with Client(rc.url, "ctok", submitter="tester") as client:
        (job,) = [j for j in client.jobs(limit=10) if j.state != "assigned"]
    assert job.state == "killed"  # withdrawn, not left queued for the device
