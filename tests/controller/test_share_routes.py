"""A fair share between people over the API (EXT-SHARE-1, EXT-SHARE-2): submit's checks,
the ``waiting_for`` entries and the job view, passes that end waiting jobs, the limits
file read again, explain and ``/metrics``."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import QUIET, TOKENS, Harness, assert_error, open_controller

from resource_controller.clock import FakeClock
from resource_controller.controller import serve, service
from resource_controller.controller.wake import perform
from resource_controller.core.share import SubmitterLimits
from support.served import ServedController


def limited(rc: Harness, limits: SubmitterLimits) -> None:
    rc.svc.store.limits = limits


def finish(rc: Harness, job_id: str, worker: str, state: str = "succeeded") -> None:
    code = 0 if state == "succeeded" else 1
    r = rc.report(job_id, worker, state, exit_code=code)
    assert r.status_code == 200, r.text


# ---- EXT-SHARE-1 ------------------------------------------------------------------------------


def test_a_job_asking_more_than_its_limit_is_refused_at_submit(rc: Harness) -> None:
    rc.register("gpubox", ("gpu0", "gpu1", "gpu2"))
    limited(rc, SubmitterLimits(default=1, names={"alice": 2}))
    message = assert_error(rc.submit_raw(count=3), 400, "bad_request")
    assert "3 device(s)" in message and "limit of 2" in message and "alice" in message
    ids = ["gpubox:gpu0", "gpubox:gpu1"]
    assert_error(rc.submit_raw(submitter="bob", device_ids=ids), 400, "bad_request")
    assert rc.client.get("/v1/jobs").json()["jobs"] == []  # nothing was queued
    assert rc.submit(count=2)["state"] == "assigned"


def test_waiting_for_says_submitter_limit_and_nothing_else(rc: Harness) -> None:
    rc.register("gpubox", ("gpu0", "gpu1"))
    limited(rc, SubmitterLimits(default=1))
    rc.submit()
    waiting = rc.submit()
    behind = rc.submit(submitter="bob")
    assert waiting["state"] == "queued" and behind["state"] == "assigned"
    view = rc.client.get(f"/v1/jobs/{waiting['id']}").json()
    assert view["waiting_for"] == [{"submitter_limit": 1, "submitter": "alice"}]
    state = rc.client.get("/v1/state").json()
    assert state["queued_waiting_for"] == {
        waiting["id"]: [{"submitter_limit": 1, "submitter": "alice"}]
    }


def test_held_devices_per_submitter_in_metrics(rc: Harness) -> None:
    rc.register("gpubox", ("gpu0", "gpu1", "gpu2"))
    rc.submit(count=2)
    rc.submit(submitter="bob", kind="hold", command=None, max_runtime_seconds=60, reason="r")
    text = rc.client.get("/metrics").text
    assert 'rc_submitter_devices_held{submitter="alice"} 2.0' in text
    assert 'rc_submitter_devices_held{submitter="bob"} 1.0' in text


def test_explain_carries_the_asking_submitters_limit(rc: Harness) -> None:
    rc.register("gpubox", ("gpu0", "gpu1"))
    query = {"selector": "gpu!=x", "submitter": "alice"}
    assert "submitter_limit" not in rc.client.get("/v1/explain", params=query).json()
    limited(rc, SubmitterLimits(names={"alice": 2}))
    rc.submit()
    out = rc.client.get("/v1/explain", params=query).json()
    assert (out["submitter"], out["submitter_limit"], out["submitter_held"]) == ("alice", 2, 1)
    bob = rc.client.get("/v1/explain", params={**query, "submitter": "bob"}).json()
    assert "submitter_limit" not in bob


# ---- EXT-SHARE-2 ------------------------------------------------------------------------------


def test_after_waits_then_runs_and_the_view_says_so(rc: Harness) -> None:
    first, worker = rc.running_job()
    second = rc.submit(device_id="gpubox:gpu0", after=[first])
    assert second["after"] == [first] and "after_any" not in second
    view = rc.client.get(f"/v1/jobs/{second['id']}").json()
    assert view["waiting_for"] == [{"after": first}]
    finish(rc, first, worker)
    assert rc.job(second["id"])["state"] == "assigned"  # the report's own pass (EXT-FAST-1)


def test_a_job_named_twice_is_waited_for_once(rc: Harness) -> None:
    first, worker = rc.running_job()
    second = rc.submit(after=[first, first])
    assert second["after"] == [first]
    finish(rc, first, worker)
    assert rc.job(second["id"])["state"] == "assigned"


def test_a_failed_dependency_ends_the_waiting_job_killed(rc: Harness) -> None:
    first, worker = rc.running_job()
    second = rc.submit(after=[first])
    anyway = rc.submit(after=[first], after_any=True)
    assert anyway["after_any"] is True
    finish(rc, first, worker, "failed")
    job = rc.job(second["id"])
    assert job["state"] == "killed" and job["kill_reason"] == f"dependency_failed: {first}"
    assert rc.job(anyway["id"])["state"] == "assigned"


def test_a_job_naming_an_already_failed_job_is_ended_by_its_submit(rc: Harness) -> None:
    first, worker = rc.running_job()
    finish(rc, first, worker, "failed")
    job = rc.submit(after=[first])
    assert job["state"] == "killed" and job["kill_reason"] == f"dependency_failed: {first}"


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"after": ["no-such-job"]}, "after: no job has the ID 'no-such-job'"),
        ({"after": [""]}, "empty job ID"),
        ({"after_any": True}, "after_any needs after"),
        ({"after": "x"}, "after"),
        ({"after": [f"{i:036d}" for i in range(65)]}, "at most 64 job IDs"),
        ({"after": ["x" * 65]}, "at most 64 bytes"),
    ],
)
def test_bad_after_is_refused_naming_it(rc: Harness, fields: dict[str, Any], words: str) -> None:
    rc.register()
    assert words in assert_error(rc.submit_raw(**fields), 400, "bad_request")


def test_no_wait_with_after_is_refused(rc: Harness) -> None:
    first, _ = rc.running_job()
    message = assert_error(rc.submit_raw(after=[first], no_wait=True), 400, "bad_request")
    assert "no_wait" in message


def test_a_dependency_on_itself_cannot_be_made(rc: Harness) -> None:
    """A job's ID exists only once it is queued, so naming it beforehand is an unknown
    job (above); the one submit that can name it is a retry under its own idempotency
    key, which answers with the job as it is instead of making another."""
    rc.register()
    key_job = rc.submit(idempotency_key="k1")
    again = rc.submit_raw(idempotency_key="k1", after=[key_job["id"]])
    assert again.status_code == 201 and again.json()["id"] == key_job["id"]  # its key's job


def test_a_chain_fails_in_one_report(rc: Harness) -> None:
    first, worker = rc.running_job()
    chain = [first]
    for _ in range(5):
        chain.append(rc.submit(after=[chain[-1]])["id"])
    finish(rc, first, worker, "failed")
    for before, job_id in itertools.pairwise(chain):
        assert rc.job(job_id)["kill_reason"] == f"dependency_failed: {before}"


# ---- the limits file, read again (SIGHUP's operation) -----------------------------------------


@pytest.fixture
def with_file(tmp_path: Path, clock: FakeClock) -> Iterator[tuple[Harness, Path]]:
    path = tmp_path / "limits.yaml"
    path.write_text("limits:\n  alice: 1\n")
    settings = dataclasses.replace(QUIET, limits_file=str(path))
    svc = serve.open_services(tmp_path / "data", TOKENS, settings, clock)
    server = ServedController(svc)
    server.start()
    h = Harness(server, clock, tmp_path / "data")
    try:
        yield h, path
    finally:
        h.close()


def reread(rc: Harness) -> Any:
    """What a SIGHUP does, run on the controller's own loop."""
    loop = rc.server.loop
    assert loop is not None
    done = asyncio.run_coroutine_threadsafe(
        perform(rc.svc.hub, service.reload_limits(rc.svc)), loop
    )
    return done.result(timeout=10)


def test_reading_the_file_again_applies_it_and_places_what_it_allows(
    with_file: tuple[Harness, Path],
) -> None:
    rc, path = with_file
    rc.register("gpubox", ("gpu0", "gpu1"))
    assert rc.svc.store.limits == SubmitterLimits(None, {"alice": 1})
    rc.submit()
    second = rc.submit()
    assert second["state"] == "queued"
    path.write_text('limits:\n  alice: 2\n  "*": 1\n')
    assert reread(rc) == SubmitterLimits(1, {"alice": 2})
    # The pass it kicks runs on the scheduler loop (EXT-FAST-1), not in the reading.
    deadline = time.monotonic() + 5
    while rc.job(second["id"])["state"] != "assigned":
        assert time.monotonic() < deadline, "the pass after the reading did not place it"
        time.sleep(0.01)


def test_a_bad_file_read_again_keeps_the_limits_in_force(
    with_file: tuple[Harness, Path], caplog: pytest.LogCaptureFixture
) -> None:
    rc, path = with_file
    path.write_text("limits:\n  alice: -1\n")
    assert reread(rc) is None
    assert rc.svc.store.limits == SubmitterLimits(None, {"alice": 1})
    assert "line 2" in caplog.text


def test_a_bad_file_stops_the_controller_at_start_naming_the_line(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "limits.yaml"
    path.write_text("limits:\n  alice: 4\n  bob: lots\n")
    settings = dataclasses.replace(QUIET, limits_file=str(path))
    with pytest.raises(serve.ServeError, match=r"limits.yaml line 3: bob"):
        serve.open_services(tmp_path / "data", TOKENS, settings, clock)
    assert not (tmp_path / "data").exists()  # refused before the data directory


def test_the_flag_alone_limits_everyone(tmp_path: Path, clock: FakeClock) -> None:
    settings = dataclasses.replace(QUIET, max_devices_per_submitter=3)
    svc = serve.open_services(tmp_path / "data", TOKENS, settings, clock)
    try:
        assert svc.store.limits == SubmitterLimits(default=3)
    finally:
        svc.store.close()


def test_the_usual_controller_has_no_limit(tmp_path: Path, clock: FakeClock) -> None:
    server = open_controller(tmp_path / "data", clock)
    try:
        assert not server.svc.store.limits.on
    finally:
        server.stop()


def test_a_named_tokens_jobs_count_under_its_name(tmp_path: Path, clock: FakeClock) -> None:
    """EXT-SHARE-1 with EXT-WHO-2: ``alice@laptop`` and ``alice@server`` under alice's
    token are one person with one limit."""
    tokens = TOKENS + ",alicetok:client:alice"
    server = ServedController(serve.open_services(tmp_path / "data", tokens, QUIET, clock))
    server.start()
    rc = Harness(server, clock, tmp_path / "data")
    try:
        rc.register("gpubox", ("gpu0", "gpu1"))
        limited(rc, SubmitterLimits(names={"alice": 1}))
        alice = rc.new_client("alicetok")
        body = {"command": ["x"], "submitter": "alice@laptop"}
        first = alice.post("/v1/jobs", json=body).json()
        second = alice.post("/v1/jobs", json={**body, "submitter": "alice@server"}).json()
        assert first["state"] == "assigned" and second["state"] == "queued"
        assert second["submitter"] == "alice@server"
        view = rc.client.get(f"/v1/jobs/{second['id']}").json()
        assert view["waiting_for"] == [{"submitter_limit": 1, "submitter": "alice"}]
        # Without the token the recorded submitter is the name: not alice's limit.
        assert rc.submit(submitter="alice@server")["state"] == "assigned"
    finally:
        rc.close()
