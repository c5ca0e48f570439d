"""The reaper's sweep (store.md §13), heartbeats after silence (§12) and post-sweep reads (§21).

Time only moves through the injected ``FakeClock``; every state here is reached through
the store's own operations except where a test says it arranges one directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from resource_controller.clock import FakeClock
from resource_controller.core.expiry import SweepRules
from resource_controller.store.facade import Store
from resource_controller.store.records import SweepResult
from support import store_helpers

from .dbview import Raw, invariant_violations, state_of, wid

if TYPE_CHECKING:
    from conftest import Factory


def sweep(store: Store, **rules: Any) -> SweepResult:
    return store.devices.sweep(SweepRules(**rules))


def reported(result: SweepResult) -> tuple[set[str], set[str], set[str], set[str]]:
    return (
        set(result.devices_unknown),
        set(result.devices_unhealthy),
        set(result.jobs_lost),
        set(result.leases_expired),
    )


NOTHING: tuple[set[str], set[str], set[str], set[str]] = (set(), set(), set(), set())


@pytest.fixture(autouse=True)
def _invariants_hold_after_each_test(raw: Raw) -> Iterator[None]:
    yield
    assert invariant_violations(raw) == []  # STORE-180..182


# ======================================================================================
# STORE-101 demotion
# ======================================================================================


def test_a_worker_heard_within_the_grace_changes_nothing(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    d0, d1 = make.worker()
    make.start(d0)
    clock.advance(29)
    result = sweep(store)
    assert reported(result) == NOTHING and result.judging
    assert [state_of(store, d)[0] for d in (d0, d1)] == ["busy", "ready"]


def test_grace_demotes_ready_and_busy_devices_to_unknown(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    # STORE-101 second branch; STORE-021 "ready, busy -> unknown" with reason ''.
    d0, d1 = make.worker()
    job = make.start(d0)
    clock.advance(30)  # exactly the grace
    assert reported(sweep(store)) == ({d0, d1}, set(), set(), set())
    assert state_of(store, d0) == ("unknown", "", "")
    assert state_of(store, d1) == ("unknown", "", "")
    # Unknown is not a quarantine: the job runs on, its lease is untouched.
    assert store.views.job(job.id).state == "running"
    assert len(raw.live_leases(d0)) == 1
    # Already unknown: not reported again.
    clock.advance(10)
    assert reported(sweep(store)) == NOTHING


def test_a_silent_worker_is_written_off_after_five_minutes(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    # STORE-101 first branch; STORE-102; STORE-021 "ready, busy, unknown -> unhealthy".
    d0, d1, d2 = make.worker(devices=3)
    running = make.start(d0)
    assigned = make.submit(device=d2)
    store.queue.run_pass()  # assigned, never handed out
    clock.advance(30)
    sweep(store)  # d0..d2 unknown on the way
    clock.advance(270)  # 300 s of silence
    now = store.now()
    result = sweep(store)
    assert reported(result) == (set(), {d0, d1, d2}, {running.id, assigned.id}, set())
    for d in (d0, d1, d2):
        assert state_of(store, d) == ("unhealthy", "worker_lost", "")
    for job_id in (running.id, assigned.id):
        j = store.views.job(job_id)
        assert (j.state, j.kill_reason, j.finished_at) == ("lost", "worker lost", now)
        assert [r["released_at"] for r in raw.leases_of(job_id)] == [now]
    # Idempotent: nothing is reported twice.
    clock.advance(10)
    assert reported(sweep(store)) == NOTHING


def test_a_ready_device_goes_straight_to_worker_lost(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    (d0,) = make.worker(devices=1)
    clock.advance(1000)
    assert reported(sweep(store)) == (set(), {d0}, set(), set())
    assert state_of(store, d0) == ("unhealthy", "worker_lost", "")


def test_only_the_silent_workers_devices_are_touched(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    (mine,) = make.worker(devices=1)
    (theirs,) = make.worker(host="other", devices=1)
    job = make.start(theirs)
    clock.advance(299)
    store.reports.heartbeat(wid("other"), [job.id])
    clock.advance(1)
    assert reported(sweep(store)) == (set(), {mine}, set(), set())
    assert state_of(store, theirs)[0] == "busy"


@pytest.mark.parametrize("reason", ["fault", "registration", "lease_expired", ""])
def test_an_unhealthy_device_keeps_its_reason_but_its_jobs_are_reaped(
    store: Store, make: Factory, raw: Raw, clock: FakeClock, reason: str
) -> None:
    # STORE-101: "an already-unhealthy device keeps its reason and is not reported, but is
    # still reaped"; STORE-031.
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    raw.force_device(d0, "unhealthy", reason, "the detail")
    clock.advance(300)
    assert reported(sweep(store)) == (set(), set(), {job.id}, set())
    assert state_of(store, d0) == ("unhealthy", reason, "the detail")
    assert store.views.job(job.id).kill_reason == "worker lost"


def test_the_reap_takes_every_active_job_on_the_device_whatever_its_worker(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    # STORE-102: keyed by device, not by worker.
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    raw.write("UPDATE jobs SET worker_id = 'someone-else' WHERE id = ?", job.id)
    clock.advance(300)
    assert reported(sweep(store)) == (set(), {d0}, {job.id}, set())


def test_a_device_without_a_worker_row_is_ignored(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    (d0,) = make.worker(devices=1)
    raw.write("DELETE FROM workers")
    clock.advance(10_000)
    assert reported(sweep(store)) == NOTHING
    assert state_of(store, d0)[0] == "ready"


# ======================================================================================
# STORE-100 the start-up hold-off (and the stall guard's veto, which acts the same)
# ======================================================================================


@pytest.mark.parametrize("veto", ["hold_off", "stalled"])
def test_inside_the_window_only_unknown_then_the_same_verdict_after(
    store: Store, make: Factory, raw: Raw, clock: FakeClock, veto: str
) -> None:
    d0, d1 = make.worker()
    job = make.start(d0)  # lease: 5 min without a runtime
    deadline = store_helpers.live_leases(store)[0].expires_at
    clock.advance(600)  # the controller was down: silence and the deadline kept running
    start = store.now()
    window: dict[str, Any] = (
        {"hold_off_until": start + 30} if veto == "hold_off" else {"stalled": True}
    )
    result = sweep(store, **window)
    assert not result.judging
    assert reported(result) == ({d0, d1}, set(), set(), set())  # unknown, nothing more
    assert store.views.job(job.id).state == "running"
    (lease,) = store_helpers.live_leases(store)
    assert lease.expires_at == deadline  # it forgives nothing: no deadline moved
    clock.advance(29)
    assert reported(sweep(store, **window)) == NOTHING
    # The first sweep allowed to judge reaches the verdict it would have reached anyway.
    clock.advance(1)
    after = {"hold_off_until": start + 30}  # now == hold-off: judging
    result = sweep(store, **after)
    assert result.judging
    assert reported(result) == (set(), {d0, d1}, {job.id}, set())
    assert state_of(store, d0) == ("unhealthy", "worker_lost", "")


def test_inside_the_window_no_lease_expires(store: Store, make: Factory, clock: FakeClock) -> None:
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    clock.advance(300)
    store.reports.heartbeat(wid(), [])  # the worker lives but never named the job
    result = sweep(store, hold_off_until=store.now() + 1)
    assert reported(result) == NOTHING
    assert store.views.job(job.id).state == "running"
    clock.advance(1)
    assert reported(sweep(store, hold_off_until=store.now())) == (set(), set(), set(), {job.id})


# ======================================================================================
# STORE-103 lease expiry
# ======================================================================================


def test_a_lease_expires_at_exactly_its_deadline(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    # STORE-053; STORE-103; STORE-021 "any -> unhealthy (lease_expired)".
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    (lease,) = store_helpers.live_leases(store)
    clock.advance(lease.expires_at - store.now() - 1)
    store.reports.heartbeat(wid(), [])  # alive, but the job is never named: nobody renews it
    assert reported(sweep(store)) == NOTHING
    clock.advance(1)
    store.reports.heartbeat(wid(), [])
    now = store.now()
    assert now == lease.expires_at
    assert reported(sweep(store)) == (set(), set(), set(), {job.id})
    j = store.views.job(job.id)
    assert (j.state, j.kill_reason, j.finished_at) == ("lost", "lease expired", now)
    assert state_of(store, d0) == ("unhealthy", "lease_expired", "")  # quarantined, not freed
    assert [r["released_at"] for r in raw.leases_of(job.id)] == [now]


def test_a_renewed_lease_does_not_expire(store: Store, make: Factory, clock: FakeClock) -> None:
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    for _ in range(6):  # an hour of honest work, heartbeats every 10 minutes
        clock.advance(600)
        store.reports.heartbeat(wid(), [job.id])
        assert reported(sweep(store)) == NOTHING
    assert store.views.job(job.id).state == "running"


@pytest.mark.parametrize("reason", ["fault", "registration", "worker_lost", ""])
def test_expiry_keeps_an_existing_reason(
    store: Store, make: Factory, raw: Raw, clock: FakeClock, reason: str
) -> None:
    # STORE-103 "(keeps an existing reason)"; STORE-031.
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    raw.force_device(d0, "unhealthy", reason, "the detail")
    clock.advance(300)
    store.reports.heartbeat(wid(), [])
    assert reported(sweep(store)) == (set(), set(), set(), {job.id})
    assert state_of(store, d0) == ("unhealthy", reason, "the detail")


def test_a_job_less_lease_is_released_by_its_own_id_and_reported_by_it(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    # STORE-054 / STORE-103: release by lease ID; report the lease ID.
    d0, d1 = make.worker()
    now = store.now()
    raw.force_device(d0, "busy")
    raw.force_device(d1, "busy")
    expired = raw.insert_jobless_lease(d0, now, now + 10)
    later = raw.insert_jobless_lease(d1, now, now + 100)
    clock.advance(10)
    store.reports.heartbeat(wid(), [])
    assert reported(sweep(store)) == (set(), set(), set(), {expired})
    assert raw.live_leases(d0) == []
    assert [r["id"] for r in raw.live_leases(d1)] == [later]  # another '' lease untouched
    assert state_of(store, d0) == ("unhealthy", "lease_expired", "")
    assert state_of(store, d1)[0] == "busy"


def test_a_lease_whose_job_already_ended_is_released_but_not_reported(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    # STORE-103: "reported only if that update changed it".
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    raw.write("UPDATE jobs SET state = 'failed' WHERE id = ?", job.id)  # a stray row
    clock.advance(300)
    store.reports.heartbeat(wid(), [])
    assert reported(sweep(store)) == NOTHING
    assert raw.live_leases(d0) == []
    assert state_of(store, d0)[0] == "unhealthy"
    assert store.views.job(job.id).state == "failed"


def test_leases_the_reap_released_are_not_expired_again(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # STORE-103: read after the reap; the job is lost once, for its worker.
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    clock.advance(1000)  # silent and past the lease deadline at once
    assert reported(sweep(store)) == (set(), {d0}, {job.id}, set())
    assert store.views.job(job.id).kill_reason == "worker lost"
    assert state_of(store, d0) == ("unhealthy", "worker_lost", "")


def test_a_hold_expires_with_its_ttl(store: Store, make: Factory, clock: FakeClock) -> None:
    (d0,) = make.worker(devices=1)
    hold = make.start(d0, kind="hold", reason="debugging", max_runtime_seconds=60)
    clock.advance(659)
    store.reports.heartbeat(wid(), [])
    assert reported(sweep(store)) == NOTHING
    clock.advance(1)
    store.reports.heartbeat(wid(), [])
    assert reported(sweep(store)) == (set(), set(), set(), {hold.id})


# ======================================================================================
# STORE-105 retention mode
# ======================================================================================


def test_retention_demotes_but_never_loses_a_job_to_silence(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    d0, d1 = make.worker()
    job = make.start(d0)
    clock.advance(30)
    assert reported(sweep(store, retain=True)) == ({d0, d1}, set(), set(), set())
    clock.advance(270)
    assert reported(sweep(store, retain=True)) == (set(), {d0, d1}, set(), set())
    assert state_of(store, d0) == ("unhealthy", "worker_lost", "")
    # Hours later the job is still running and its lease still live: job leases never expire.
    clock.advance(6 * 3600)
    assert reported(sweep(store, retain=True)) == NOTHING
    assert store.views.job(job.id).state == "running"
    assert len(raw.live_leases(d0)) == 1


def test_retention_still_expires_holds(store: Store, make: Factory, clock: FakeClock) -> None:
    d0, d1 = make.worker()
    job = make.start(d0)
    hold = make.start(d1, kind="hold", reason="debugging", max_runtime_seconds=60)
    clock.advance(3600)
    store.reports.heartbeat(wid(), [])  # the worker is alive; neither lease is renewed
    assert reported(sweep(store, retain=True)) == (set(), set(), set(), {hold.id})
    assert state_of(store, d1) == ("unhealthy", "lease_expired", "")
    assert store.views.job(job.id).state == "running"
    assert state_of(store, d0)[0] == "busy"


def test_retention_worker_lost_device_returns_busy_when_its_job_is_named(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # STORE-096 step 2b after a real write-off in retention mode.
    d0, d1 = make.worker()
    job = make.start(d0)
    clock.advance(400)
    sweep(store, retain=True)
    assert state_of(store, d0)[1] == "worker_lost"
    store.reports.heartbeat(wid(), [job.id], retain=True)
    assert state_of(store, d0) == ("busy", "", "")
    assert store_helpers.live_leases(store)[0].expires_at == store.now() + 900
    assert state_of(store, d1) == ("unhealthy", "worker_lost", "")  # unleased: stays out


def test_default_mode_write_off_is_not_undone_by_naming_the_lost_job(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    clock.advance(300)
    sweep(store)
    store.reports.heartbeat(wid(), [job.id])  # the job is lost: naming it proves nothing now
    assert state_of(store, d0) == ("unhealthy", "worker_lost", "")


# ======================================================================================
# STORE-183: no sweep, with any clock movement, makes a device ready
# ======================================================================================


@pytest.mark.parametrize("retain", [False, True])
def test_no_sweep_readies_a_device(
    store: Store, make: Factory, raw: Raw, clock: FakeClock, retain: bool
) -> None:
    devices = make.worker(devices=4)
    make.start(devices[0])
    make.start(devices[1], kind="hold", reason="x", max_runtime_seconds=5)
    raw.force_device(devices[2], "unhealthy", "fault", "bad")
    for step in (0, 1, 29, 30, 31, 270, 300, 900, 3600, -5000, 7200):
        clock.advance(step)
        before = {d.id: d.state for d in store_helpers.devices(store)}
        for rules in ({}, {"hold_off_until": store.now() + 30}, {"stalled": True}):
            sweep(store, retain=retain, **rules)
            after = {d.id: d.state for d in store_helpers.devices(store)}
            for d, s in after.items():
                assert s != "ready" or before[d] == "ready", (d, before[d], step, rules)


# ======================================================================================
# §12 heartbeats after silence, and EXT-OUTBOX-2 pending jobs
# ======================================================================================


@pytest.mark.parametrize("retain", [False, True])
def test_a_heartbeat_after_silence_returns_unknown_devices(
    store: Store, make: Factory, clock: FakeClock, retain: bool
) -> None:
    # STORE-096 steps 4-5 after a real demotion: leased -> busy, unleased -> ready.
    d0, d1 = make.worker()
    job = make.start(d0)
    clock.advance(45)
    assert set(sweep(store, retain=retain).devices_unknown) == {d0, d1}
    store.reports.heartbeat(wid(), [job.id], retain=retain)
    assert state_of(store, d0) == ("busy", "", "")
    assert state_of(store, d1) == ("ready", "", "")


def test_pending_jobs_are_renewed_like_running_ones(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # EXT-OUTBOX-2 on STORE-096 step 2a: a finished-but-unreported job keeps its lease.
    d0, d1 = make.worker()
    running = make.start(d0)
    pending = make.start(d1)
    clock.advance(120)
    store.reports.heartbeat(wid(), [running.id], pending=[pending.id])
    now = store.now()
    assert {x.job_id: x.expires_at for x in store_helpers.live_leases(store)} == {
        running.id: now + 900,
        pending.id: now + 900,
    }
    # Someone else's pending job renews nothing, like a running one (STORE-096 step 2).
    (theirs,) = make.worker(host="other", devices=1)
    their_job = make.start(theirs)
    before = {x.job_id: x.expires_at for x in store_helpers.live_leases(store)}[their_job.id]
    clock.advance(5)
    store.reports.heartbeat(wid(), [], pending=[their_job.id])
    assert {x.job_id: x.expires_at for x in store_helpers.live_leases(store)}[
        their_job.id
    ] == before


def test_a_pending_job_keeps_its_device_busy_through_a_long_outage(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    # EXT-OUTBOX-2: the device stays busy (not free, not quarantined) until the report
    # lands, however long that takes, as long as the worker keeps naming the job.
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    for _ in range(8):  # two hours with the terminal report stuck in the outbox
        clock.advance(840)
        store.reports.heartbeat(wid(), [], pending=[job.id])
        assert reported(sweep(store)) == NOTHING
        assert state_of(store, d0) == ("busy", "", "")
    out = store_helpers.release(store, job.id, "succeeded", 0, "")
    assert not out.was_terminal and out.job.exit_code == 0
    assert state_of(store, d0)[0] == "ready"


@pytest.mark.parametrize("retain", [False, True])
def test_pending_names_return_an_unknown_device_to_busy(
    store: Store, make: Factory, clock: FakeClock, retain: bool
) -> None:
    # STORE-096 step 4 (retention mode needs the job named: pending counts).
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    clock.advance(60)
    sweep(store, retain=retain)
    assert state_of(store, d0)[0] == "unknown"
    store.reports.heartbeat(wid(), [], retain=retain, pending=[job.id])
    assert state_of(store, d0) == ("busy", "", "")


def test_pending_names_restore_a_worker_lost_device(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # STORE-096 step 2b with the job named as pending (retention keeps the job active).
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    clock.advance(400)
    sweep(store, retain=True)
    store.reports.heartbeat(wid(), [], retain=True, pending=[job.id])
    assert state_of(store, d0) == ("busy", "", "")


def test_a_pending_finalised_kill_keeps_its_device_out_until_the_report_lands(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # A pending name counts as named for STORE-096 step 3: the flag stays, so step 5
    # keeps the device unknown until the worker stops naming the job.
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    clock.advance(60)
    sweep(store, retain=True)
    assert (
        store.queue.request_kill(job.id, "killed by alice", finalize_disconnected=True)
        == "finalized"
    )
    store.reports.heartbeat(wid(), [], retain=True, pending=[job.id])
    assert state_of(store, d0)[0] == "unknown"
    assert store.views.job(job.id).kill_requested == 1
    assert store_helpers.release(
        store, job.id, "succeeded", 0
    ).was_terminal  # the late report: no change
    store.reports.heartbeat(wid(), [], retain=True)
    assert store.views.job(job.id).state == "killed"
    assert state_of(store, d0)[0] == "ready"


def test_a_terminal_report_from_the_same_worker_is_accepted_after_its_restart(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # EXT-OUTBOX-3: a restarted worker re-sends its outbox before registering; the job
    # is still the worker's (the ID is derived from the host), its lease still live.
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    clock.advance(200)
    store.reports.heartbeat(wid(), [], pending=[job.id])
    assert store.views.job(job.id).worker_id == wid()
    out = store_helpers.release(store, job.id, "failed", 3, "exit status 3")
    assert (out.job.state, out.job.exit_code) == ("failed", 3)
    assert state_of(store, d0)[0] == "ready"
    # Its registration afterwards finds nothing in flight to reap.
    assert store.devices.register("box", "boot-1", [("gpu0", 0)]).reaped == []


# ======================================================================================
# §21 post-sweep reads
# ======================================================================================


def test_quarantine_reasons_and_details(store: Store, make: Factory, raw: Raw) -> None:
    # STORE-170.
    d0, d1 = make.worker()
    raw.force_device(d0, "unhealthy", "lease_expired", "lapsed")
    assert store.views.quarantine_reasons([d0, d1, "nope:gpu9"]) == {d0: "lease_expired", d1: ""}
    assert store_helpers.quarantine_details(store, [d0, "nope:gpu9"]) == {d0: "lapsed"}
    assert (
        store.views.quarantine_reasons([]) == {}
        and store_helpers.quarantine_details(store, []) == {}
    )


def test_lease_devices_maps_expired_ids_to_devices(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    # STORE-171: job IDs and lease IDs, live or released; the newest row wins.
    d0, d1 = make.worker()
    first = make.start(d0)
    store_helpers.release(store, first.id, "succeeded", 0)
    clock.advance(1)
    job = make.start(d0)
    now = store.now()
    raw.force_device(d1, "busy")
    jobless = raw.insert_jobless_lease(d1, now, now + 5)
    clock.advance(300)
    store.reports.heartbeat(wid(), [])
    result = sweep(store)
    assert set(result.leases_expired) == {job.id, jobless}
    (job_lease,) = raw.leases_of(job.id)
    got = store.views.lease_devices([*result.leases_expired, "nothing"])
    assert got == {job.id: d0, job_lease["id"]: d0, jobless: d1}
    assert store.views.lease_devices([]) == {}
