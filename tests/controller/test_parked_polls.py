"""A terminal report answers the worker's waiting poll in its own commit (EXT-FAST-1):
the release, the next grant and its hand-out are one transaction, and exactly one poll
gets the work, never none and never two."""

from __future__ import annotations

import asyncio
import time

from controller_harness import Harness

from resource_controller.controller.parked import ParkedPolls


def _wait_parked(rc: Harness, count: int = 1, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while len(rc.svc.hub.parked) < count:
        assert time.monotonic() < deadline, "the poll never parked"
        time.sleep(0.005)


def test_the_report_hands_the_next_job_to_the_waiting_poll_in_one_commit(rc: Harness) -> None:
    first, wid = rc.running_job()
    second = rc.submit(device_id="gpubox:gpu0")
    assert second["state"] == "queued"
    polled = rc.background(rc.poll, wid, "10s")
    _wait_parked(rc)
    commits = rc.svc.store.gen
    assert rc.report(first, wid, "succeeded", exit_code=0).status_code == 200
    r = polled.result(timeout=10)
    assert r.status_code == 200, r.text
    assert [a["job_id"] for a in r.json()["assignments"]] == [second["id"]]
    # The release, the grant and the hand-out: one transaction, the poll's none.
    assert rc.svc.store.gen == commits + 1
    assert rc.job(second["id"])["state"] == "running"
    assert len(rc.svc.hub.parked) == 0


def test_a_report_that_places_nothing_leaves_the_poll_waiting(rc: Harness) -> None:
    first, wid = rc.running_job()
    polled = rc.background(rc.poll, wid, "300ms")
    _wait_parked(rc)
    assert rc.report(first, wid, "succeeded", exit_code=0).status_code == 200
    assert polled.result(timeout=10).status_code == 204
    assert len(rc.svc.hub.parked) == 0


def test_work_placed_for_another_worker_is_not_taken_by_this_poll(rc: Harness) -> None:
    first, wid = rc.running_job()
    other = rc.register("otherbox", ("gpu0",))
    queued = rc.submit(device_id="gpubox:gpu0")
    polled = rc.background(rc.poll, other, "300ms")
    _wait_parked(rc)
    assert rc.report(first, wid, "succeeded", exit_code=0).status_code == 200
    assert polled.result(timeout=10).status_code == 204
    # Still assigned to its own worker, whose next poll takes it.
    assert rc.job(queued["id"])["state"] == "assigned"
    assert [a["job_id"] for a in rc.take(wid)] == [queued["id"]]


def test_a_claimed_poll_waits_for_its_answer_and_a_left_one_is_never_claimed() -> None:
    async def scenario() -> None:
        polls = ParkedPolls()
        left = polls.park("w")
        assert polls.leave(left) and polls.claim("w") is None
        parked = polls.park("w")
        claimed = polls.claim("w")
        assert claimed is parked and len(polls) == 0
        assert not polls.leave(parked)  # claimed first: it must await the answer
        claimed.give(([], ["job-1"]))
        assert await asyncio.wait_for(parked.answer, 1) == ([], ["job-1"])
        # Newest first, one claim each.
        a, b = polls.park("w"), polls.park("w")
        assert polls.claim("w") is b and polls.claim("w") is a and polls.claim("w") is None

    asyncio.run(scenario())
