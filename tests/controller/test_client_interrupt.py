"""Ctrl-C while a submit is on its way (CLI-106, EXT-PYAPI-3): the controller may have
queued the job already, so the Python API holds the interrupt back until the answer
names the job, cancels it, and only then raises ``KeyboardInterrupt``."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from controller_harness import Harness

from resource_controller.client.sync import Client


def _interrupted_on_return(real: Any) -> Any:
    """``real``, with a SIGINT to this process just before its answer is handed back."""

    def call(*args: Any, **kw: Any) -> Any:
        answer = real(*args, **kw)
        os.kill(os.getpid(), signal.SIGINT)
        return answer

    return call


@pytest.mark.parametrize("how", ["hold", "run"])
def test_an_interrupt_during_the_submit_cancels_the_job(rc: Harness, how: str) -> None:
    rc.register(devices=("gpu0",))
    with Client(rc.url, "ctok", submitter="tester") as client:
        first = client.hold(ttl="10m", device="gpubox:gpu0", wait=False)  # the device taken
        if how == "hold":
            client.low.hold = _interrupted_on_return(client.low.hold)  # type: ignore[method-assign]
            with pytest.raises(KeyboardInterrupt):
                client.hold(ttl="10m", device="gpubox:gpu0")
        else:
            client.low.submit = _interrupted_on_return(client.low.submit)  # type: ignore[method-assign]
            with pytest.raises(KeyboardInterrupt):
                client.run(["true"], device="gpubox:gpu0")
        (job,) = [j for j in client.jobs(limit=10) if j.id != first.id]
    assert job.state == "killed" and job.started_at is None  # left the queue
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
