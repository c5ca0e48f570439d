"""Several devices for one job, on the real store (EXT-GANG-1..6, EXT-EPOCH-3a).

Each case checks the store's own rows (``Raw``) beside what the store answers, and ends
with the whole-database invariant check, which knows that an active job holds exactly
its N devices (never a partial allocation) and every device at most one live lease.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from resource_controller import errors
from resource_controller.clock import FakeClock
from resource_controller.core import expiry
from resource_controller.store import leases
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob
from support import store_helpers

from .dbview import Raw, invariant_violations, state_of, wid

if TYPE_CHECKING:
    from conftest import Factory


def _live(raw: Raw, job_id: str) -> list[str]:
    return sorted(r["device_id"] for r in raw.leases_of(job_id) if r["released_at"] is None)


def test_a_two_device_job_gets_two_devices_of_one_host_in_one_grant(
    store: Store, make: Factory, raw: Raw
) -> None:
    make.worker("a", devices=1)
    b = make.worker("b", devices=3)
    job = make.submit(count=2)
    assert job.device_count == 2 and job.devices == ()
    store.queue.run_pass()
    got = store.views.job(job.id)
    # EXT-GANG-1: two devices of the one host that has two; ascending, first = device_id.
    assert got.state == "assigned"
    assert got.devices == (b[0], b[1]) and got.device_id == b[0]
    rows = raw.leases_of(job.id)
    assert sorted(r["device_id"] for r in rows) == [b[0], b[1]]
    # EXT-EPOCH-3a: consecutive epochs in one transaction; the job's is the largest.
    epochs = sorted(r["epoch"] for r in rows)
    assert epochs[1] == epochs[0] + 1 and got.lease_epoch == epochs[1]
    assert {r["acquired_at"] for r in rows} == {store.now()}
    assert [state_of(store, d)[0] for d in b] == ["busy", "busy", "ready"]
    assert invariant_violations(raw) == []


def test_all_or_nothing_when_the_host_has_too_few_free(
    store: Store, make: Factory, raw: Raw
) -> None:
    box = make.worker("box", devices=2)
    one = make.start(device=box[0])
    gang = make.submit(count=2)
    store.queue.run_pass()
    # One free device is not enough: nothing is granted, the free one is reserved.
    assert store.views.job(gang.id).state == "queued"
    assert raw.leases_of(gang.id) == []
    assert state_of(store, box[1])[0] == "ready"
    assert raw.reservations() == {(gang.id, box[0]), (gang.id, box[1])}
    store_helpers.release(store, one.id, "succeeded", 0)
    store.queue.run_pass()
    assert _live(raw, gang.id) == box
    assert invariant_violations(raw) == []


def test_a_stale_snapshot_rolls_the_whole_assignment_back(
    store: Store, make: Factory, raw: Raw
) -> None:
    box = make.worker("box", devices=2)
    gang = make.submit(count=2)
    snapshot = [store_helpers.device(store, d) for d in box]
    store_helpers.allocate_directly(store, box[1], "bob")  # taken after the snapshot was read
    job = store.views.job(gang.id)
    outcome = leases.try_assign(store.tx, store.now(), job, [d for d in snapshot if d])
    assert outcome == "not_ready"
    # Nothing of the half that could flip remains: box[0] is still ready, no lease.
    assert state_of(store, box[0])[0] == "ready"
    assert raw.leases_of(gang.id) == [] and store.views.job(gang.id).state == "queued"
    assert invariant_violations(raw) == []


def test_submit_refuses_what_no_single_host_could_ever_hold(store: Store, make: Factory) -> None:
    make.worker("a", devices=2)
    make.worker("b", devices=2)
    # Four devices exist, but never three on one host (EXT-GANG-2).
    with pytest.raises(errors.NoMatchingDevice, match="no host has 3 devices"):
        make.submit(count=3)
    store.devices.apply_facts("a", ["gpu0", "gpu1"], {"gpu0": {"big": "1"}}, None, None, None)
    with pytest.raises(errors.NoMatchingDevice):
        make.submit(selector="big=1", count=2)  # every one of the N must match
    assert make.submit(count=2).device_count == 2


def test_a_pinned_list_is_checked_and_kept(store: Store, make: Factory, raw: Raw) -> None:
    # What needs no database (one host, a count that fits the list, a list sorted) is
    # the submit's to check (``controller/submits.py``, tests/controller/test_gang_routes.py).
    a = make.worker("a", devices=3)
    with pytest.raises(errors.UnknownDevice):
        make.submit(device_ids=(a[0], "a:gpu9"))
    job = make.submit(device_ids=(a[0], a[2]))
    assert job.devices == (a[0], a[2]) and job.device_id == a[0] and job.device_count == 2
    store.queue.run_pass()
    assert _live(raw, job.id) == [a[0], a[2]]
    assert state_of(store, a[1])[0] == "ready"


def test_the_runtime_is_the_smallest_ceiling_among_the_devices(store: Store, make: Factory) -> None:
    store.devices.register("box", "b1", [("gpu0", 600), ("gpu1", 300), ("gpu2", 0)])
    job = make.submit(device_ids=("box:gpu0", "box:gpu1", "box:gpu2"))
    assert job.max_runtime_seconds == 300  # EXT-GANG-5: inherited, the smallest
    with pytest.raises(errors.RuntimeAboveCeiling, match="box:gpu1"):
        make.submit(device_ids=("box:gpu0", "box:gpu1"), max_runtime_seconds=400)
    assert store.queue.cancel(job.id, "killed by alice")
    picked = make.submit(count=2)
    store.queue.run_pass()
    got = store.views.job(picked.id)
    # The two lowest IDs of the one host, gpu0 (600 s) and gpu1 (300 s): the smaller.
    assert got.devices == ("box:gpu0", "box:gpu1") and got.max_runtime_seconds == 300


def test_release_kill_and_cancel_end_every_lease_together(
    store: Store, make: Factory, raw: Raw
) -> None:
    box = make.worker("box", devices=4)
    g1 = make.start(count=2)
    g2 = make.start(count=2)
    assert set(g1.devices) | set(g2.devices) == set(box)
    store_helpers.release(store, g1.id, "succeeded", 0)
    assert _live(raw, g1.id) == []
    assert [state_of(store, d)[0] for d in g1.devices] == ["ready", "ready"]
    # A finalised kill (worker gone) releases both leases and leaves both devices out.
    for d in g2.devices:
        raw.force_device(d, "unknown")
    assert (
        store.queue.request_kill(g2.id, "killed by alice", finalize_disconnected=True)
        == "finalized"
    )
    assert _live(raw, g2.id) == []
    assert [state_of(store, d)[0] for d in g2.devices] == ["unknown", "unknown"]
    queued = make.submit(count=3)
    assert store.queue.cancel(queued.id, "killed by alice")
    assert invariant_violations(raw) == []


def test_an_expired_lease_ends_the_job_and_quarantines_all_its_devices(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    make.worker("box", devices=3)
    g = make.start(count=2)
    clock.advance(leases.NO_RUNTIME_TTL + 1)
    store.reports.heartbeat(wid("box"), [])  # the worker lives but no longer names the job
    result = store.devices.sweep(expiry.SweepRules())
    assert result.leases_expired == [g.id]
    assert store.views.job(g.id).state == "lost"
    assert _live(raw, g.id) == []
    for d in g.devices:
        assert state_of(store, d)[:2] == ("unhealthy", "lease_expired")
    assert invariant_violations(raw) == []


def test_worker_death_and_reregistration_free_every_device(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    make.worker("box", devices=4)
    g = make.start(count=3)
    clock.advance(6 * 60)  # silent past unhealthy-after
    result = store.devices.sweep(expiry.SweepRules())
    assert g.id in result.jobs_lost and _live(raw, g.id) == []
    assert invariant_violations(raw) == []
    # Registration reap: a new gang, then the worker re-registers (no reboot proof).
    for i in range(4):
        raw.force_device(f"box:gpu{i}", "ready")
    store.devices.register("box", "boot-1", [(f"gpu{i}", 0) for i in range(4)])
    g2 = make.start(count=2)
    reg = store.devices.register("box", "boot-1", [(f"gpu{i}", 0) for i in range(4)])
    assert reg.reaped == [g2.id]
    for d in g2.devices:
        assert state_of(store, d)[:2] == ("unhealthy", "registration")
    assert invariant_violations(raw) == []


def test_a_heartbeat_renews_every_lease_of_the_job(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    make.worker("box", devices=2)
    g = make.start(count=2)
    clock.advance(60)
    store.reports.heartbeat(wid("box"), [g.id])
    assert {r["expires_at"] for r in raw.leases_of(g.id)} == {store.now() + leases.RENEWAL}


def test_jobs_on_a_device_include_a_gang_on_its_second_device(store: Store, make: Factory) -> None:
    box = make.worker("box", devices=2)
    g = make.start(count=2)
    assert [j.id for j in store.views.list_jobs(10, device=box[1])] == [g.id]
    assert store.views.active_job_on(box[1]) == g.id
    # A device whose ID is a prefix of another's is not matched by the other's list.
    assert store.views.list_jobs(10, device="box:gpu") == []


def test_a_gang_at_the_head_is_not_starved_by_one_device_jobs(
    store: Store, make: Factory, raw: Raw
) -> None:
    """EXT-GANG-3: each device that frees goes to the waiting gang until it has N."""
    box = make.worker("box", devices=4)
    running = [make.start(device=d) for d in box]
    gang = make.submit(count=2)
    passes = 0
    stream: list[str] = []
    while store.views.job(gang.id).state == "queued":
        passes += 1
        assert passes <= 4, "the gang should start once two devices have freed"
        # A steady stream of one-device jobs behind it.
        stream.append(make.submit().id)
        victim = running.pop(0)
        store_helpers.release(store, victim.id, "succeeded", 0)
        store.queue.run_pass()
        for placed in store.views.active():
            if placed.id in stream:
                # Only a device the gang did not need may go to the stream.
                assert placed.device_id not in store.views.job(gang.id).devices
    assert passes == 2
    assert len(_live(raw, gang.id)) == 2
    assert invariant_violations(raw) == []


def test_new_job_defaults_are_one_device() -> None:
    assert NewJob(command=["x"], submitter="a").count == 1
