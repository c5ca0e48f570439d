"""The Python API's ``after`` (EXT-SHARE-2, EXT-PYAPI-2): a pipeline run against a live
controller (what it sends and refuses: ``test_submit.py``)."""

from __future__ import annotations

import asyncio

from client.live import CLIENT, FakeWorker, LiveController, run_for_real
from resource_controller import AsyncClient, Client


def test_a_pipeline_runs_in_order(controller: LiveController, worker: FakeWorker) -> None:
    worker.behaviour = run_for_real
    with Client(controller.url, CLIENT, submitter="me") as rc:
        first = rc.submit(["sleep", "0.5"], device="box:gpu0")
        second = rc.submit(["echo", "second"], after=first)  # a handle
        third = rc.run(["echo", "third"], after=[second.id[:8]], capture=True)  # a prefix
        assert third.exit_code == 0 and third.output == b"third\n"
        assert second.raw["after"] == [first.id]
        for job in (first, second):
            job.refresh()
            assert job.state == "succeeded"
        assert first.finished_at is not None and second.started_at is not None
        assert second.started_at >= first.finished_at


def test_a_failed_dependency_ends_the_run_with_its_reason(
    controller: LiveController, worker: FakeWorker
) -> None:
    worker.behaviour = run_for_real

    async def go() -> None:
        async with AsyncClient(controller.url, CLIENT, submitter="me") as rc:
            first = await rc.submit(["false"], device="box:gpu0")
            result = await rc.run(["echo", "never"], after=first.id, capture=True)
            assert result.exit_code == 1 and result.output == b""
            assert result.job.kill_reason == f"dependency_failed: {first.id}"
            assert result.job.after == [first.id]

    asyncio.run(go())
