"""The reaper loop end to end (SRV-031/032, STORE-100..105), recovery at registration
(API-031 step 6, STORE-121..123), pending jobs (EXT-OUTBOX-2) and the test-only
``RC_TEST_TIMINGS`` hook.

The controller runs on a ``FakeClock`` with a sweep every few hundredths of a real
second; a test moves the fake clock and waits (bounded) for a pass to have acted. A
jump of the fake clock is, from the controller's point of view, exactly a pause, so
the stall guard holds judging back for three on-schedule passes after every jump; the
waits below cover that.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    START,
    TOKENS,
    Follower,
    Harness,
    assert_empty_ok,
    assert_error,
    open_controller,
)

from resource_controller.clock import FakeClock
from resource_controller.controller import serve
from resource_controller.controller.deps import Settings
from resource_controller.controller.routes import jobs as job_routes
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob
from support import store_helpers

FAST = "sweep_interval=0.02,hold_off=0"
T0 = "2027-01-15T08:00:00Z"  #: START as the API writes it

Make = Callable[..., Harness]


@pytest.fixture
def make_rc(tmp_path: Path, clock: FakeClock) -> Iterator[Make]:
    """Start a controller with the given ``RC_TEST_TIMINGS`` text and retention flag."""
    made: list[Harness] = []

    def make(timings: str = FAST, retain: bool = False) -> Harness:
        data = tmp_path / "data"
        h = Harness(open_controller(data, clock, timings, retain), clock, data)
        made.append(h)
        return h

    try:
        yield make
    finally:
        for h in made:
            h.close()


def eventually(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Poll ``check`` until it returns something truthy (a reaper pass acted)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, "the reaper never acted"
        time.sleep(0.01)


def device_state(rc: Harness, device_id: str = "gpubox:gpu0") -> str:
    return str(rc.device(device_id)["device"]["state"])


def heartbeat(rc: Harness, wid: str, **body: Any) -> None:
    assert_empty_ok(rc.worker.post(f"/v1/workers/{wid}/heartbeat", json=body))


# ======================================================================================
# The reaper loop
# ======================================================================================


def test_a_silent_workers_device_goes_unknown_then_unhealthy_and_its_job_lost(
    make_rc: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No safety-net re-check during this test: only the reaper's wake can end the follow.
    monkeypatch.setattr(job_routes, "FOLLOW_RECHECK", 60.0)
    rc = make_rc()
    job_id, _ = rc.running_job()
    follower = Follower(rc, job_id)
    assert follower.next()[0] == "headers"
    rc.clock.advance(31)
    eventually(lambda: device_state(rc) == "unknown")
    assert rc.job(job_id)["state"] == "running"  # unknown is not a quarantine
    assert rc.device("gpubox:gpu0")["job_id"] == job_id
    rc.clock.advance(270)  # 301 s of silence
    eventually(lambda: device_state(rc) == "unhealthy")
    view = rc.device("gpubox:gpu0")
    assert view["quarantine_reason"] == "worker_lost" and "job_id" not in view
    job = rc.job(job_id)
    assert (job["state"], job["kill_reason"]) == ("lost", "worker lost")
    # The follower of the lost job is released (the reaper wakes it).
    kind, _, _ = follower.next()
    assert kind == "end"


def test_a_pass_long_after_the_previous_one_writes_nobody_off(
    make_rc: Make, caplog: pytest.LogCaptureFixture
) -> None:
    # The stall guard: a jump of the clock between two passes looks like a paused
    # controller. The first pass after it only demotes to unknown; judging resumes
    # after three on-schedule passes.
    rc = make_rc("sweep_interval=0.3,hold_off=0")
    job_id, _ = rc.running_job()
    rc.clock.advance(400)
    eventually(lambda: device_state(rc) != "busy")
    assert device_state(rc) == "unknown"
    assert rc.job(job_id)["state"] == "running"
    eventually(lambda: device_state(rc) == "unhealthy")
    assert rc.job(job_id)["kill_reason"] == "worker lost"
    assert "paused or starved" in caplog.text


def test_the_worker_heard_in_time_keeps_everything(make_rc: Make) -> None:
    rc = make_rc()
    job_id, wid = rc.running_job()
    for _ in range(4):
        rc.clock.advance(25)
        heartbeat(rc, wid, running_job_ids=[job_id])
        time.sleep(0.1)  # several passes
    assert device_state(rc) == "busy"
    assert rc.job(job_id)["state"] == "running"


def test_no_sweep_runs_before_one_interval(make_rc: Make) -> None:
    # SRV-031: the first pass runs one interval after start, not at start.
    # The interval is long next to the few requests before the check, so a loaded
    # machine cannot let the first pass in early by accident.
    rc = make_rc("sweep_interval=3,hold_off=0")
    rc.register()
    rc.clock.advance(400)
    time.sleep(0.2)
    assert device_state(rc) == "ready"
    eventually(lambda: device_state(rc) != "ready")


def test_inside_the_start_up_hold_off_only_unknown_then_the_same_verdict(
    tmp_path: Path, clock: FakeClock
) -> None:
    # SRV-032 / STORE-100: a controller restarted after 10 minutes down judges nothing for
    # its first 30 s; afterwards it reaches the verdict it would have reached anyway.
    data = tmp_path / "data"
    data.mkdir()
    store = Store(data / "rc.db", clock)
    store.devices.register("gpubox", "boot-1", [("gpu0", 0)])
    job = store.queue.enqueue(NewJob(command=["train"], submitter="alice", device_id="gpubox:gpu0"))
    store.queue.run_pass()
    store.close()
    clock.advance(600)
    rc = Harness(open_controller(data, clock, "sweep_interval=0.02,hold_off=30"), clock, data)
    try:
        eventually(lambda: device_state(rc) == "unknown")
        time.sleep(0.3)  # well over three on-schedule passes, all inside the window
        assert device_state(rc) == "unknown"
        assert rc.job(job.id)["state"] == "assigned"
        clock.advance(30)
        eventually(lambda: device_state(rc) == "unhealthy")
        assert rc.device("gpubox:gpu0")["quarantine_reason"] == "worker_lost"
        assert rc.job(job.id)["kill_reason"] == "worker lost"
    finally:
        rc.close()


def test_an_unrenewed_lease_expires_and_a_pending_one_is_kept(make_rc: Make) -> None:
    # STORE-103 and EXT-OUTBOX-2 side by side: gpu0's job finished but its report is
    # stuck in the worker's outbox (named as pending); gpu1's job is named by no one.
    rc = make_rc()
    wid = rc.register("gpubox", ("gpu0", "gpu1"))
    pending = rc.submit(device_id="gpubox:gpu0")["id"]
    forgotten = rc.submit(device_id="gpubox:gpu1")["id"]
    rc.take(wid)
    for _ in range(2):  # 400 s: past the 5 min lease of a job without runtime
        rc.clock.advance(200)
        heartbeat(rc, wid, running_job_ids=[], pending_job_ids=[pending])
    eventually(lambda: rc.job(forgotten)["state"] == "lost")
    assert rc.job(forgotten)["kill_reason"] == "lease expired"
    view = rc.device("gpubox:gpu1")
    assert (view["device"]["state"], view["quarantine_reason"]) == ("unhealthy", "lease_expired")
    # The pending job's lease was renewed: its device stays busy, not freed, not quarantined.
    time.sleep(0.1)
    assert device_state(rc, "gpubox:gpu0") == "busy"
    assert rc.job(pending)["state"] == "running"
    (lease,) = store_helpers.live_leases(rc.svc.store)
    assert lease.job_id == pending and lease.expires_at == rc.svc.now() + 900
    # The report lands from the same worker ID: accepted, device freed (EXT-OUTBOX-3).
    assert_empty_ok(rc.report(pending, wid, "succeeded", exit_code=0))
    assert rc.job(pending)["exit_code"] == 0
    assert device_state(rc, "gpubox:gpu0") == "ready"


def test_pending_names_bring_an_unknown_device_back_busy(make_rc: Make) -> None:
    rc = make_rc()
    job_id, wid = rc.running_job()
    rc.clock.advance(40)
    eventually(lambda: device_state(rc) == "unknown")
    heartbeat(rc, wid, pending_job_ids=[job_id])
    assert device_state(rc) == "busy"


# ======================================================================================
# Retention mode (SRV-040) and the finalised kill (API-046)
# ======================================================================================


def test_retention_keeps_the_job_of_a_written_off_worker(make_rc: Make) -> None:
    rc = make_rc(retain=True)
    job_id, wid = rc.running_job()
    rc.clock.advance(400)
    eventually(lambda: device_state(rc) == "unhealthy")
    assert rc.device("gpubox:gpu0")["quarantine_reason"] == "worker_lost"
    time.sleep(0.1)
    assert rc.job(job_id)["state"] == "running"
    # The worker comes back naming it: the device is restored to busy (STORE-096 step 2b).
    heartbeat(rc, wid, running_job_ids=[job_id])
    view = rc.device("gpubox:gpu0")
    assert view["device"]["state"] == "busy" and "quarantine_reason" not in view


def test_retention_kill_of_a_disconnected_job_is_finalised(make_rc: Make) -> None:
    rc = make_rc(retain=True)
    job_id, wid = rc.running_job()
    rc.clock.advance(31)
    eventually(lambda: device_state(rc) == "unknown")
    assert_empty_ok(rc.client.post(f"/v1/jobs/{job_id}/kill", json={"submitter": "alice"}))
    job = rc.job(job_id)
    assert (job["state"], job["kill_reason"]) == ("killed", "killed by alice")
    view = rc.device("gpubox:gpu0")
    assert view["device"]["state"] == "unknown"  # nothing proves the device is empty
    assert "job_id" not in view  # the lease was released at once
    # The kill flag is kept for the old worker, should it come back with the process alive.
    r = rc.poll(wid)
    assert r.status_code == 200 and r.json()["kills"] == [job_id]


def test_default_mode_kill_of_a_disconnected_job_is_only_requested(make_rc: Make) -> None:
    rc = make_rc(retain=False)
    job_id, wid = rc.running_job()
    rc.clock.advance(31)
    eventually(lambda: device_state(rc) == "unknown")
    assert_empty_ok(rc.client.post(f"/v1/jobs/{job_id}/kill", json={"submitter": "alice"}))
    assert rc.job(job_id)["state"] == "running"
    assert rc.device("gpubox:gpu0")["job_id"] == job_id
    assert rc.poll(wid).json()["kills"] == [job_id]


# ======================================================================================
# Recovery at registration (API-031 step 6) and describe's history
# ======================================================================================


def test_registration_with_a_proof_returns_its_quarantined_device(rc: Harness) -> None:
    job_id, wid = rc.running_job()
    rc.clock.advance(5)
    # The same boot ID: no reboot proof, so the upsert reaps the job and quarantines the
    # device ("registration"); the isolation proof then lifts exactly that quarantine.
    assert rc.register("gpubox", ("gpu0",), recovery={"isolated": True}) == wid
    assert rc.job(job_id)["state"] == "lost"
    view = rc.device("gpubox:gpu0")
    assert view["device"]["state"] == "ready" and "quarantine_reason" not in view
    d = rc.client.get("/v1/devices/gpubox:gpu0/describe").json()
    assert d["recoveries"] == {
        "recoveries": [{"at": "2027-01-15T08:00:05Z", "reason": "registration"}],
        "remaining": 2,
        "limit": 3,
        "window_seconds": 3600,
    }
    # A waiting job is placed at once on the recovered device (EXT-FAST-1).
    assert rc.submit(device_id="gpubox:gpu0")["state"] == "assigned"


@pytest.mark.parametrize(
    "recovery",
    [None, {}, {"survivors_checked": True, "survivors_found": True}, {"survivors_found": True}],
)
def test_registration_without_a_valid_proof_leaves_it_quarantined(
    rc: Harness, recovery: dict[str, bool] | None
) -> None:
    rc.running_job()
    extra = {} if recovery is None else {"recovery": recovery}
    rc.register("gpubox", ("gpu0",), **extra)
    view = rc.device("gpubox:gpu0")
    assert view["quarantine_reason"] == "registration"
    d = rc.client.get("/v1/devices/gpubox:gpu0/describe").json()
    assert d["recoveries"] == {"recoveries": [], "remaining": 3, "limit": 3, "window_seconds": 3600}


def test_a_fault_is_never_recovered_at_registration(rc: Harness) -> None:
    rc.register()
    rc.fault("gpubox:gpu0", "verify failed: ecc")
    rc.register("gpubox", ("gpu0",), recovery={"isolated": True})
    assert rc.device("gpubox:gpu0")["quarantine_reason"] == "verify failed: ecc"


def test_the_flap_guard_holds_the_fourth_recovery_in_an_hour(rc: Harness) -> None:
    for n in range(4):
        rc.running_job()
        rc.clock.advance(60)
        rc.register("gpubox", ("gpu0",), recovery={"survivors_checked": True})
        state = device_state(rc)
        assert state == ("ready" if n < 3 else "unhealthy"), n
    d = rc.client.get("/v1/devices/gpubox:gpu0/describe").json()
    assert d["quarantine_reason"] == "registration"
    assert [r["reason"] for r in d["recoveries"]["recoveries"]] == ["registration"] * 3
    assert d["recoveries"]["remaining"] == 0
    # Newest first.
    ats = [r["at"] for r in d["recoveries"]["recoveries"]]
    assert ats == sorted(ats, reverse=True)


def test_a_recovery_failure_never_fails_the_registration(
    rc: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id, wid = rc.running_job()

    def broken(*_: Any) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(rc.svc.store.devices, "auto_recover", broken)
    r = rc.worker.post(
        "/v1/workers/register",
        json={"host": "gpubox", "devices": [{"name": "gpu0"}], "recovery": {"isolated": True}},
    )
    assert r.status_code == 200 and r.json() == {"worker_id": wid}
    # The device simply stays quarantined, which nothing schedules onto.
    assert rc.device("gpubox:gpu0")["quarantine_reason"] == "registration"
    assert rc.job(job_id)["state"] == "lost"


def test_describe_of_a_device_never_recovered(rc: Harness) -> None:
    rc.register()
    d = rc.client.get("/v1/devices/gpubox:gpu0/describe").json()
    assert d["recoveries"]["recoveries"] == [] and d["recoveries"]["remaining"] == 3


def test_a_terminal_report_from_the_same_worker_id_is_accepted_before_registering(
    rc: Harness,
) -> None:
    # EXT-OUTBOX-3: a restarted worker (same host, so the same worker ID) re-sends its
    # outbox before it registers; the lease is still live, so the report counts.
    job_id, wid = rc.running_job()
    assert wid == str(uuid.uuid5(uuid.NAMESPACE_DNS, "gpubox"))
    rc.clock.advance(120)
    assert_empty_ok(rc.report(job_id, wid, "failed", exit_code=7, reason="exit status 7"))
    job = rc.job(job_id)
    assert (job["state"], job["exit_code"]) == ("failed", 7)
    rc.register()
    assert device_state(rc) == "ready"  # nothing left in flight to reap
    # Another worker ID is still refused.
    other = rc.register("otherbox")
    second = rc.submit(device_id="gpubox:gpu0")["id"]
    assert_error(rc.report(second, other, "succeeded", exit_code=0), 403, "not_job_owner")


# ======================================================================================
# RC_TEST_TIMINGS (a test hook, never for users)
# ======================================================================================


def test_production_numbers_without_the_hook() -> None:
    s = serve.apply_test_timings(Settings(), None)
    assert (s.sweep_interval, s.grace, s.unhealthy_after, s.hold_off) == (10, 30, 300, 30)
    assert s.schedule_interval == 1
    assert serve.apply_test_timings(Settings(), "  ") == Settings()


def test_every_timing_can_be_set() -> None:
    s = serve.apply_test_timings(
        Settings(retain_disconnected_jobs=True),
        " sweep_interval=0.05, grace=2,unhealthy_after=4.5,hold_off=0,schedule_interval=0.1 ",
    )
    assert s == dataclasses.replace(
        Settings(retain_disconnected_jobs=True),
        sweep_interval=0.05,
        grace=2,
        unhealthy_after=4.5,
        hold_off=0,
        schedule_interval=0.1,
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("grace", "malformed entry 'grace'"),
        ("=3", "malformed entry '=3'"),
        ("grace=1,,hold_off=2", "malformed entry ''"),
        ("lease_ttl=5", "unknown timing 'lease_ttl'"),
        ("Grace=5", "unknown timing 'Grace'"),
        ("grace=soon", "grace='soon' is not a number"),
        ("grace=", "grace='' is not a number"),
        ("grace=-1", "grace must be a finite non-negative number"),
        ("grace=inf", "grace must be a finite non-negative number"),
        ("grace=nan", "grace must be a finite non-negative number"),
        ("sweep_interval=0", "sweep_interval must be a finite positive number"),
        ("schedule_interval=0", "schedule_interval must be a finite positive number"),
        ("grace=1,grace=2", "grace given twice"),
    ],
)
def test_timing_errors(raw: str, message: str) -> None:
    with pytest.raises(serve.ServeError) as e:
        serve.apply_test_timings(Settings(), raw)
    assert str(e.value).startswith(f"RC_TEST_TIMINGS: {message}")


SERVE = (
    "import sys; from pathlib import Path; from resource_controller.controller import serve; "
    "sys.exit(serve.run(sys.argv[1], Path(sys.argv[2]), False))"
)


def serve_once(tmp_path: Path, tokens: str, timings: str) -> tuple[int, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "RC_WEBHOOK_URL"}
    env |= {"RC_TOKENS": tokens, "RC_TEST_TIMINGS": timings}
    proc = subprocess.run(
        [sys.executable, "-c", SERVE, "127.0.0.1:0", str(tmp_path / "data")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return proc.returncode, proc.stderr.splitlines()


def test_a_bad_hook_is_a_start_up_error(tmp_path: Path) -> None:
    # One "rc: " line, exit 1, and the data directory is never created.
    assert serve_once(tmp_path, TOKENS, "grace=1,lease_ttl=5") == (
        1,
        [
            "rc: RC_TEST_TIMINGS: unknown timing 'lease_ttl' (known: sweep_interval, grace, "
            "unhealthy_after, hold_off, schedule_interval)"
        ],
    )
    assert not (tmp_path / "data").exists()


def test_tokens_are_still_checked_first(tmp_path: Path) -> None:
    # SRV-020: token validation stays the first start-up step.
    code, lines = serve_once(tmp_path, "a:superuser", "bogus")
    assert (code, lines) == (1, ['rc: unknown role "superuser" in RC_TOKENS'])


def test_the_harness_clock_starts_where_the_tests_think() -> None:
    assert FakeClock(START).now() == START
    assert T0.startswith("2027-01-15T08:00:00")
