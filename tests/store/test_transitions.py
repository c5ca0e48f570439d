"""Every device and job transition the store implements today, one behaviour per test.

Time comes from the injected ``FakeClock``; states a sweep would produce (``unknown``,
``unhealthy``/``worker_lost``) are arranged directly in the database here. The sweep
itself, with real clock movement, is in ``test_sweep.py``; recovery in ``test_recovery.py``.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from resource_controller import errors
from resource_controller.clock import FakeClock
from resource_controller.core.selectors import SelectorError
from resource_controller.core.share import SubmitterLimits
from resource_controller.core.transitions import JOB, Op
from resource_controller.store import jobs, leases, moves, passes, sql
from resource_controller.store.facade import Store
from resource_controller.store.records import Assigned, DeviceRecord, JobRecord
from support import store_helpers

from .dbview import Raw, invariant_violations, state_of, wid

if TYPE_CHECKING:
    from conftest import Factory


def label(store: Store, host: str, per_device: dict[str, dict[str, str]]) -> None:
    """Replace the detected labels of the named devices of ``host``."""
    names = [n for n in per_device if n]
    store.devices.apply_facts(host, names, per_device, None, None, None)


@pytest.fixture(autouse=True)
def _invariants_hold_after_each_test(raw: Raw) -> Iterator[None]:
    # STORE-180..182 must hold whatever a test did through the store.
    yield
    assert invariant_violations(raw) == []


# ======================================================================================
# §3 device transitions (STORE-021)
# ======================================================================================


def test_registration_declares_new_devices_ready(store: Store, raw: Raw) -> None:
    # STORE-021 row "(no row) -> ready"; STORE-110 step 5; STORE-112.
    now = store.now()
    reg = store.devices.register("box", "boot-1", [("gpu0", 0), ("gpu1", 3600), ("gpu2", -5)])
    assert reg.worker_id == wid() and not reg.reboot_proof and reg.reaped == []
    devs = {d.id: d for d in store_helpers.devices(store)}
    assert sorted(devs) == ["box:gpu0", "box:gpu1", "box:gpu2"]
    for name, d in zip(["gpu0", "gpu1", "gpu2"], devs.values(), strict=True):
        assert (d.host, d.name, d.worker_id, d.state) == ("box", name, wid(), "ready")
        assert (d.quarantine_reason, d.quarantine_detail) == ("", "")
        assert d.last_heartbeat_at == now
    assert [d.max_runtime_seconds for d in devs.values()] == [0, 3600, 0]  # negative stored as 0
    w = raw.worker(wid())
    assert (w["host"], w["boot_id"], w["last_heartbeat_at"]) == ("box", "boot-1", now)


def test_assignment_makes_the_device_busy_and_grants_a_lease(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # STORE-021 "ready -> busy"; STORE-065 steps 4-5; STORE-050 kind/reason/holder copied.
    (d0,) = make.worker(devices=1)
    job = make.submit(
        device=d0, submitter="bob", kind="hold", reason="debugging", max_runtime_seconds=60
    )
    clock.advance(5)
    now = store.now()
    assert store.queue.run_pass().assigned == [Assigned(job.id, wid())]
    j = store.views.job(job.id)
    assert (j.state, j.device_id, j.worker_id, j.started_at) == ("assigned", d0, wid(), None)
    assert state_of(store, d0)[0] == "busy"
    (lease,) = store_helpers.live_leases(store)
    assert (lease.device_id, lease.holder, lease.job_id) == (d0, "bob", job.id)
    assert (lease.kind, lease.reason) == ("hold", "debugging")
    assert (lease.acquired_at, lease.expires_at, lease.released_at) == (now, now + 660, None)


@pytest.mark.parametrize("terminal", ["succeeded", "failed", "killed", "lost"])
def test_release_ends_the_job_and_frees_its_busy_device(
    store: Store, make: Factory, raw: Raw, clock: FakeClock, terminal: str
) -> None:
    # STORE-021 "busy -> ready"; STORE-041 release row; STORE-082 step 4.
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    clock.advance(7)
    now = store.now()
    out = store_helpers.release(store, job.id, terminal, exit_code=3, reason="the reason")
    assert not out.was_terminal
    j = store.views.job(job.id)
    assert (j.state, j.exit_code, j.kill_reason, j.finished_at) == (
        terminal,
        3,
        "the reason",
        now,
    )
    assert out.job == j
    assert state_of(store, d0)[0] == "ready"
    assert [r["released_at"] for r in raw.leases_of(job.id)] == [now]
    assert store_helpers.live_leases(store) == []


def test_release_leaves_a_faulted_device_out_of_the_pool(store: Store, make: Factory) -> None:
    # STORE-082 step 4: an unhealthy device stays out; STORE-131 does not touch the job.
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    store.devices.set_state(d0, "unhealthy", "verify: ecc errors")
    assert store.views.job(job.id).state == "running"
    store_helpers.release(store, job.id, "failed", 1, "exit status 1")
    assert state_of(store, d0) == ("unhealthy", "fault", "verify: ecc errors")
    assert store_helpers.live_leases(store) == []
    waiting = make.submit(device=d0)
    assert store.queue.run_pass().assigned == []
    assert store.views.job(waiting.id).state == "queued"


def test_release_leaves_an_unknown_device_for_the_next_heartbeat(
    store: Store, make: Factory, raw: Raw
) -> None:
    # STORE-082 step 4: "an unknown one waits for the next heartbeat"; STORE-096 step 5.
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    raw.force_device(d0, "unknown")
    store_helpers.release(store, job.id, "succeeded", 0)
    assert state_of(store, d0)[0] == "unknown"
    store.reports.heartbeat(wid(), [])
    assert state_of(store, d0)[0] == "ready"


# ---- registration reap (STORE-110/111) --------------------------------------------------


@pytest.mark.parametrize(
    ("old_boot", "new_boot"),
    [("boot-1", "boot-1"), ("", "boot-2"), ("boot-1", ""), ("", "")],
)
def test_registration_without_reboot_proof_reaps_and_quarantines(
    store: Store, make: Factory, raw: Raw, clock: FakeClock, old_boot: str, new_boot: str
) -> None:
    # STORE-110 step 1 (proof needs both IDs non-empty and different), STORE-111,
    # STORE-021 "any -> unhealthy (registration)".
    d0, d1 = make.worker(devices=2, boot_id=old_boot)
    running = make.start(d0)
    assigned = make.submit(device=d1)
    store.queue.run_pass()
    assert store.views.job(assigned.id).state == "assigned"
    clock.advance(3)
    now = store.now()
    reg = store.devices.register("box", new_boot, [("gpu0", 0), ("gpu1", 0)])
    assert not reg.reboot_proof
    assert sorted(reg.reaped) == sorted([running.id, assigned.id])
    for job_id in (running.id, assigned.id):
        j = store.views.job(job_id)
        assert (j.state, j.kill_reason, j.finished_at) == ("lost", "worker re-registered", now)
        assert [r["released_at"] for r in raw.leases_of(job_id)] == [now]
    assert state_of(store, d0) == ("unhealthy", "registration", "")
    assert state_of(store, d1) == ("unhealthy", "registration", "")
    assert raw.worker(wid())["boot_id"] == new_boot  # overwritten, even with ''
    waiting = make.submit(device=d0)
    assert store.queue.run_pass().assigned == []
    assert store.views.job(waiting.id).state == "queued"


def test_registration_with_nothing_in_flight_reaps_nothing(store: Store, make: Factory) -> None:
    # STORE-111: only assigned/running jobs are reaped; queued and terminal ones stay.
    (d0,) = make.worker(devices=1)
    done = make.start(d0)
    store_helpers.release(store, done.id, "succeeded", 0)
    queued = make.submit(device=d0, priority=-1)
    other = make.submit(device=d0, priority=-1)
    store.queue.cancel(other.id, "killed by alice")
    reg = store.devices.register("box", "boot-1", [("gpu0", 0)])
    assert reg.reaped == []
    assert [store.views.job(j.id).state for j in (done, queued, other)] == [
        "succeeded",
        "queued",
        "killed",
    ]
    assert state_of(store, d0)[0] == "ready"


@pytest.mark.parametrize("reason", ["fault", "worker_lost", "lease_expired", ""])
def test_registration_quarantine_keeps_an_existing_reason(
    store: Store, make: Factory, raw: Raw, reason: str
) -> None:
    # STORE-031: a process-caused quarantine never relabels an unhealthy device.
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    if reason == "fault":
        store.devices.set_state(d0, "unhealthy", "ecc errors")
    else:
        raw.force_device(d0, "unhealthy", reason, "ecc errors")
    store.devices.register("box", "boot-1", [("gpu0", 0)])
    assert store.views.job(job.id).state == "lost"
    assert state_of(store, d0) == ("unhealthy", reason, "ecc errors")


def test_registration_with_reboot_proof_frees_the_devices_of_reaped_jobs(
    store: Store, make: Factory, raw: Raw
) -> None:
    # STORE-111 with proof; STORE-021 "busy, unknown -> ready (reboot proof)";
    # a fault is never lifted by a reboot (STORE-030).
    d0, d1, d2 = make.worker(devices=3, boot_id="boot-1")
    j0 = make.start(d0)
    j1 = make.start(d1)
    j2 = make.start(d2)
    raw.force_device(d1, "unknown")
    store.devices.set_state(d2, "unhealthy", "bad ecc")
    reg = store.devices.register("box", "boot-2", [("gpu0", 0), ("gpu1", 0), ("gpu2", 0)])
    assert reg.reboot_proof
    assert sorted(reg.reaped) == sorted([j0.id, j1.id, j2.id])
    for j in (j0, j1, j2):
        assert (store.views.job(j.id).state, store.views.job(j.id).kill_reason) == (
            "lost",
            "host rebooted",
        )
    assert state_of(store, d0) == ("ready", "", "")
    assert state_of(store, d1) == ("ready", "", "")
    assert state_of(store, d2) == ("unhealthy", "fault", "bad ecc")
    assert store_helpers.live_leases(store) == []


@pytest.mark.parametrize(("boot", "expected"), [("boot-1", "unhealthy"), ("boot-2", "ready")])
def test_reap_settles_a_device_the_registration_no_longer_declares(
    store: Store, make: Factory, boot: str, expected: str
) -> None:
    # STORE-111: "The reap writes the device row directly, so it applies even if this
    # registration no longer declares that device."
    _d0, d1 = make.worker(devices=2, boot_id="boot-1")
    job = make.start(d1)
    store.devices.register("box", boot, [("gpu0", 0)])
    assert store.views.job(job.id).state == "lost"
    assert state_of(store, d1)[0] == expected


@pytest.mark.parametrize(
    ("reason", "recovered"),
    [
        ("worker_lost", True),
        ("lease_expired", True),
        ("registration", True),
        ("fault", False),
        ("", False),
    ],
)
def test_reboot_proof_recovers_recoverable_quarantines(
    store: Store, make: Factory, raw: Raw, reason: str, recovered: bool
) -> None:
    # STORE-110 step 4; STORE-021 "unhealthy (recoverable), no live lease -> ready";
    # STORE-030: '' is cause unknown and never recovered; STORE-032 clears the detail.
    (d0,) = make.worker(devices=1, boot_id="boot-1")
    (other,) = make.worker(host="other", devices=1)
    raw.force_device(d0, "unhealthy", reason, "what happened")
    raw.force_device(other, "unhealthy", "worker_lost", "")
    store.devices.register("box", "boot-2", [("gpu0", 0)])
    if recovered:
        assert state_of(store, d0) == ("ready", "", "")
    else:
        assert state_of(store, d0) == ("unhealthy", reason, "what happened")
    assert state_of(store, other) == ("unhealthy", "worker_lost", "")  # not this worker's


def test_unchanged_boot_id_recovers_nothing(store: Store, make: Factory, raw: Raw) -> None:
    # STORE-110 step 1: an unchanged boot ID proves nothing.
    (d0,) = make.worker(devices=1, boot_id="boot-1")
    raw.force_device(d0, "unhealthy", "worker_lost")
    store.devices.register("box", "boot-1", [("gpu0", 0)])
    assert state_of(store, d0) == ("unhealthy", "worker_lost", "")


def test_reboot_proof_does_not_recover_a_device_with_a_live_lease(
    store: Store, make: Factory, raw: Raw
) -> None:
    # STORE-110 step 4 "and has no live lease"; a job-less lease must be handled (§2.4).
    (d0,) = make.worker(devices=1, boot_id="boot-1")
    raw.force_device(d0, "unhealthy", "lease_expired")
    lease_id = raw.insert_jobless_lease(d0, store.now(), store.now() + 300)
    store.devices.register("box", "boot-2", [("gpu0", 0)])
    assert state_of(store, d0) == ("unhealthy", "lease_expired", "")
    assert [r["id"] for r in raw.live_leases(d0)] == [lease_id]


def test_registration_redeclares_an_unknown_device_ready(
    store: Store, make: Factory, raw: Raw
) -> None:
    # STORE-021 "ready, busy, unknown -> ready: registration re-declares the device".
    d0, d1 = make.worker(devices=2)
    raw.force_device(d0, "unknown")
    store.devices.register("box", "boot-1", [("gpu0", 0), ("gpu1", 0)])
    assert state_of(store, d0) == ("ready", "", "")
    assert state_of(store, d1) == ("ready", "", "")


def test_registration_keeps_an_unhealthy_device_and_rewrites_its_ceiling(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # STORE-110 step 5: unhealthy keeps state and reason; STORE-112: ceiling rewritten,
    # 0 clears it; heartbeat stamp updated.
    store.devices.register("box", "boot-1", [("gpu0", 600)])
    store.devices.set_state("box:gpu0", "unhealthy", "hook failed")
    clock.advance(50)
    store.devices.register("box", "boot-1", [("gpu0", 0)])
    d = store_helpers.device(store, "box:gpu0")
    assert d is not None
    assert (d.state, d.quarantine_reason, d.quarantine_detail) == (
        "unhealthy",
        "fault",
        "hook failed",
    )
    assert (d.max_runtime_seconds, d.last_heartbeat_at, d.host, d.name) == (
        0,
        store.now(),
        "box",
        "gpu0",
    )


# ---- heartbeats (STORE-096) -------------------------------------------------------------


def test_heartbeat_from_an_unknown_worker_is_a_noop(store: Store, make: Factory) -> None:
    # STORE-096: an unknown worker ID makes every step a no-op and is not an error.
    make.worker(devices=1)
    before = store_helpers.devices(store)
    store.reports.heartbeat(wid("nobody"), ["no-such-job"])
    assert store_helpers.devices(store) == before


def test_heartbeat_stamps_the_worker_and_all_its_devices(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    # STORE-096 steps 1 and 6.
    make.worker(devices=2)
    (other,) = make.worker(host="other", devices=1)
    start = store.now()
    clock.advance(20)
    store.reports.heartbeat(wid(), [])
    assert raw.worker(wid())["last_heartbeat_at"] == start + 20
    assert raw.worker(wid("other"))["last_heartbeat_at"] == start
    assert {d.id: d.last_heartbeat_at for d in store_helpers.devices(store)} == {
        "box:gpu0": start + 20,
        "box:gpu1": start + 20,
        other: start,
    }


def test_heartbeat_renews_named_leases_to_fifteen_minutes_even_if_earlier(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # STORE-052 renewal row; STORE-096 step 2a.
    d0, d1 = make.worker(devices=2)
    named = make.start(d0, max_runtime_seconds=3600)
    silent = make.start(d1, max_runtime_seconds=3600)
    granted = store.now() + 3600 + 600
    assert {x.job_id: x.expires_at for x in store_helpers.live_leases(store)} == {
        named.id: granted,
        silent.id: granted,
    }
    clock.advance(10)
    store.reports.heartbeat(wid(), [named.id])
    assert {x.job_id: x.expires_at for x in store_helpers.live_leases(store)} == {
        named.id: store.now() + 900,  # earlier than the grant-time deadline: overwritten
        silent.id: granted,
    }


def test_heartbeat_renews_nothing_for_other_workers_or_inactive_jobs(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # STORE-096 step 2: "naming anyone else's job renews nothing".
    (mine,) = make.worker(devices=1)
    (theirs,) = make.worker(host="other", devices=1)
    their_job = make.start(theirs)
    queued = make.submit(device=mine, priority=-1)
    blocker = make.start(mine)
    before = {x.job_id: x.expires_at for x in store_helpers.live_leases(store)}
    clock.advance(100)
    store.reports.heartbeat(wid(), [their_job.id, queued.id])
    assert {x.job_id: x.expires_at for x in store_helpers.live_leases(store)} == before
    assert blocker.id in before


@pytest.mark.parametrize("retain", [False, True])
def test_heartbeat_naming_a_job_restores_its_worker_lost_device(
    store: Store, make: Factory, raw: Raw, clock: FakeClock, retain: bool
) -> None:
    # STORE-096 step 2b (both modes); STORE-021 "unhealthy with worker_lost -> busy".
    d0, d1 = make.worker(devices=2)
    named = make.start(d0)
    unnamed = make.start(d1)
    raw.force_device(d0, "unhealthy", "worker_lost", "silent 5m")
    raw.force_device(d1, "unhealthy", "worker_lost", "silent 5m")
    clock.advance(9)
    store.reports.heartbeat(wid(), [named.id], retain=retain)
    assert state_of(store, d0) == ("busy", "", "")
    assert store_helpers.device(store, d0).last_heartbeat_at == store.now()  # type: ignore[union-attr]
    assert state_of(store, d1) == ("unhealthy", "worker_lost", "silent 5m")
    assert store.views.job(unnamed.id).state == "running"


@pytest.mark.parametrize("reason", ["fault", "lease_expired", "registration", ""])
def test_heartbeat_never_restores_another_quarantine(
    store: Store, make: Factory, raw: Raw, reason: str
) -> None:
    # STORE-096 step 2b: "a fault or any other reason is never restored this way".
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    raw.force_device(d0, "unhealthy", reason, "detail")
    store.reports.heartbeat(wid(), [job.id])
    store.reports.heartbeat(wid(), [job.id], retain=True)
    assert state_of(store, d0) == ("unhealthy", reason, "detail")


def test_unknown_leased_device_returns_busy_in_default_mode(
    store: Store, make: Factory, raw: Raw
) -> None:
    # STORE-096 step 4, default mode: any live lease suffices, named or not.
    (d0,) = make.worker(devices=1)
    make.start(d0)
    raw.force_device(d0, "unknown")
    store.reports.heartbeat(wid(), [])
    assert state_of(store, d0)[0] == "busy"


def test_unknown_leased_device_needs_its_job_named_in_retention_mode(
    store: Store, make: Factory, raw: Raw
) -> None:
    # STORE-096 step 4, retention mode: only a device of a named job with a live lease.
    d0, d1 = make.worker(devices=2)
    job0 = make.start(d0)
    job1 = make.start(d1)
    raw.force_device(d0, "unknown")
    store.reports.heartbeat(wid(), [], retain=True)
    assert state_of(store, d0)[0] == "unknown"
    store.reports.heartbeat(wid(), [job1.id], retain=True)
    assert state_of(store, d0)[0] == "unknown"
    store.reports.heartbeat(wid(), [job0.id], retain=True)
    assert state_of(store, d0)[0] == "busy"


@pytest.mark.parametrize("retain", [False, True])
def test_unknown_unleased_device_returns_ready(
    store: Store, make: Factory, raw: Raw, retain: bool
) -> None:
    # STORE-096 step 5; STORE-021 "unknown -> ready".
    (d0,) = make.worker(devices=1)
    raw.force_device(d0, "unknown")
    store.reports.heartbeat(wid(), [], retain=retain)
    assert state_of(store, d0) == ("ready", "", "")


def test_finalised_kill_keeps_the_device_unknown_while_the_job_is_still_named(
    store: Store, make: Factory, raw: Raw
) -> None:
    # STORE-092 leaves the device out; STORE-096 step 5 exclusion; step 3 then clears
    # the flag on the first heartbeat that does not name the job (STORE-095).
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    raw.force_device(d0, "unknown")
    assert (
        store.queue.request_kill(job.id, "killed by alice", finalize_disconnected=True)
        == "finalized"
    )
    store.reports.heartbeat(wid(), [job.id])
    assert state_of(store, d0)[0] == "unknown"
    assert store.views.job(job.id).kill_requested == 1
    store.reports.heartbeat(wid(), [])
    assert store.views.job(job.id).kill_requested == 0
    assert state_of(store, d0)[0] == "ready"  # step 3 runs before step 5
    assert store.views.job(job.id).state == "killed"  # STORE-185: only the flag changed


def test_kill_flag_is_cleared_only_for_this_workers_killed_jobs_not_named(
    store: Store, make: Factory
) -> None:
    # STORE-096 step 3; STORE-095.
    d0, d1, d2 = make.worker(devices=3)
    (theirs,) = make.worker(host="other", devices=1)
    killed_named = make.start(d0)
    killed_unnamed = make.start(d1)
    active = make.start(d2)
    their_killed = make.start(theirs)
    for j in (killed_named, killed_unnamed, active, their_killed):
        assert store.queue.request_kill(j.id, "killed by alice") == "requested"
    for j in (killed_named, killed_unnamed, their_killed):
        store_helpers.release(store, j.id, "killed", None, "cancelled")
    store.reports.heartbeat(wid(), [killed_named.id])
    flags = {j.id: store.views.job(j.id).kill_requested for j in (killed_named, killed_unnamed)}
    assert flags == {killed_named.id: 1, killed_unnamed.id: 0}
    assert store.views.job(active.id).kill_requested == 1  # not killed yet: the worker still acts
    assert store.views.job(their_killed.id).kill_requested == 1
    store.reports.heartbeat(wid(), [])
    assert store.views.job(killed_named.id).kill_requested == 0


# ---- host reports, operator clear, retire (STORE-130..133) -------------------------------


@pytest.mark.parametrize("before", ["ready", "busy", "unknown", "registration", "worker_lost"])
def test_fault_report_overwrites_any_state_and_reason(
    store: Store, make: Factory, raw: Raw, clock: FakeClock, before: str
) -> None:
    # STORE-131; STORE-021 "any -> unhealthy (fault, overwrites any reason)".
    (d0,) = make.worker(devices=1)
    job = make.start(d0) if before == "busy" else None
    if before == "unknown":
        raw.force_device(d0, "unknown")
    elif before in ("registration", "worker_lost"):
        raw.force_device(d0, "unhealthy", before, "old detail")
    clock.advance(11)
    store.devices.set_state(d0, "unhealthy", "hook on_acquire failed: exit 2")
    assert state_of(store, d0) == ("unhealthy", "fault", "hook on_acquire failed: exit 2")
    assert store_helpers.device(store, d0).last_heartbeat_at == store.now()  # type: ignore[union-attr]
    if job is not None:
        assert store.views.job(job.id).state == "running"  # jobs and leases untouched
        assert [x.job_id for x in store_helpers.live_leases(store)] == [job.id]


def test_host_report_of_another_state_clears_reason_and_detail(store: Store, make: Factory) -> None:
    # STORE-131: "For any other state: reason and detail cleared."
    (d0,) = make.worker(devices=1)
    store.devices.set_state(d0, "unhealthy", "bad")
    store.devices.set_state(d0, "ready")
    assert state_of(store, d0) == ("ready", "", "")


def test_host_report_for_an_unknown_device_is_not_found(store: Store) -> None:
    # STORE-131: never a silent success.
    with pytest.raises(errors.DeviceNotFound):
        store.devices.set_state("box:nope", "unhealthy", "x")


def test_operator_clear_returns_an_unleased_unhealthy_device(
    store: Store, make: Factory, raw: Raw
) -> None:
    # STORE-130; STORE-032.
    d0, d1 = make.worker(devices=2)
    store.devices.set_state(d0, "unhealthy", "fault text")
    raw.force_device(d1, "unhealthy", "", "legacy")
    assert store.devices.clear(d0) is True
    assert store.devices.clear(d1) is True
    assert state_of(store, d0) == ("ready", "", "")
    assert state_of(store, d1) == ("ready", "", "")


def test_operator_clear_refuses_everything_else(store: Store, make: Factory, raw: Raw) -> None:
    # STORE-130: not unhealthy (incl. unknown), a live lease, or an unknown ID -> false.
    d0, d1, d2, d3 = make.worker(devices=4)
    leased = make.start(d0)
    store.devices.set_state(d0, "unhealthy", "verify failed")
    make.start(d1)
    raw.force_device(d2, "unknown")
    for device_id in (d0, d1, d2, d3, "box:nope"):
        assert store.devices.clear(device_id) is False
    assert state_of(store, d0) == ("unhealthy", "fault", "verify failed")
    assert [state_of(store, d)[0] for d in (d1, d2, d3)] == ["busy", "unknown", "ready"]
    assert store.views.job(leased.id).state == "running"


def test_retire_refuses_unknown_and_leased_devices(store: Store, make: Factory) -> None:
    # STORE-133 (the store's not-found type for retire carries the API's device_not_found).
    (d0,) = make.worker(devices=1)
    with pytest.raises(errors.DeviceNotFound) as exc:
        store.devices.retire("box:nope")
    assert (exc.value.status, exc.value.code) == (404, "device_not_found")
    make.start(d0)
    with pytest.raises(errors.DeviceBusy):
        store.devices.retire(d0)
    assert store_helpers.device(store, d0) is not None


def test_retire_deletes_what_is_keyed_to_the_device_and_keeps_history(
    store: Store, make: Factory, raw: Raw
) -> None:
    # STORE-133; STORE-021 "any -> (row deleted)"; STORE-007 (jobs outlive hardware).
    d0, d1 = make.worker(devices=2)
    store.devices.apply_facts(
        "box",
        ["gpu0", "gpu1"],
        {"": {"vendor": "nvidia"}, "gpu0": {}, "gpu1": {}},
        {"gpu0": {"rack": "r3"}},
        "host-wide notes",
        {"gpu0": "gpu0 notes", "gpu1": "gpu1 notes"},
    )
    done = make.start(d0)
    store_helpers.release(store, done.id, "succeeded", 0)
    store.devices.set_state(d0, "unhealthy", "dead")
    waiting = make.submit(device=d0)
    store.queue.run_pass()
    assert raw.reservations() == {(waiting.id, d0)}
    raw.write("INSERT INTO device_recoveries (device_id, at, reason) VALUES (?, 1, 'x')", d0)
    store.devices.retire(d0)
    assert store_helpers.device(store, d0) is None
    assert raw.rows("SELECT * FROM device_labels WHERE device_id = ?", d0) == []
    assert raw.rows("SELECT * FROM leases WHERE device_id = ?", d0) == []
    assert raw.reservations() == set()
    docs = {r["device_id"]: r["body"] for r in raw.rows("SELECT * FROM host_docs")}
    assert docs == {"": "host-wide notes", d1: "gpu1 notes"}
    assert len(raw.rows("SELECT * FROM device_recoveries WHERE device_id = ?", d0)) == 1
    assert store.views.job(done.id).device_id == d0  # history kept
    assert len(raw.rows("SELECT * FROM device_labels WHERE device_id = ?", d1)) == 1
    # A queued job pinned to the retired device stays queued (and reserves its ID).
    store.queue.run_pass()
    assert store.views.job(waiting.id).state == "queued"
    assert raw.reservations() == {(waiting.id, d0)}
    # The worker still declares it: the next registration recreates it, ready.
    store.devices.register("box", "boot-1", [("gpu0", 0), ("gpu1", 0)])
    assert state_of(store, d0) == ("ready", "", "")
    assert store.queue.run_pass().assigned == [Assigned(waiting.id, wid())]


# ======================================================================================
# §5 job transitions (STORE-041) and §7 enqueue (STORE-056/057)
# ======================================================================================


def test_enqueue_records_a_queued_job(store: Store, make: Factory, raw: Raw) -> None:
    # STORE-055/056 step 5: never assigns; fields as specified.
    (d0,) = make.worker(devices=1)
    now = store.now()
    job = make.submit(
        device=d0,
        submitter="carol",
        command=("python", "train.py"),
        cwd="/work",
        env={"A": "1"},
        priority=3,
        max_runtime_seconds=90.9,
        idle_timeout=30.7,
        stdio="tty",
    )
    assert (job.state, job.device_id, job.worker_id, job.selector) == ("queued", d0, "", "")
    assert (job.submitted_at, job.queued_at, job.started_at, job.finished_at) == (
        now,
        now,
        None,
        None,
    )
    assert (job.command, job.cwd, job.env, job.submitter) == (
        ["python", "train.py"],
        "/work",
        {"A": "1"},
        "carol",
    )
    assert (job.priority, job.max_runtime_seconds, job.idle_timeout, job.stdio) == (
        3,
        90,
        30,
        "tty",
    )
    assert (job.kind, job.idempotency_key, job.kill_requested, job.exit_code) == (
        "job",
        None,
        0,
        None,
    )
    assert state_of(store, d0)[0] == "ready"  # enqueue never assigns (STORE-055)
    assert raw.count("leases") == 0


def test_stored_instants_are_whole_seconds(store: Store, make: Factory, clock: FakeClock) -> None:
    # STORE-004: sub-second parts are truncated.
    (d0,) = make.worker(devices=1)
    clock.set(1_900_000_000.9)
    job = make.submit(device=d0)
    assert job.submitted_at == 1_900_000_000


def test_selector_jobs_store_the_normal_form(store: Store, make: Factory) -> None:
    # SEL-004; STORE-056 step 2.
    make.worker(devices=1)
    label(store, "box", {"gpu0": {"vendor": "nvidia", "vram": "80G"}})
    job = make.submit(selector=" vendor = nvidia , vram >= 40G ")
    assert (job.selector, job.device_id) == ("vendor=nvidia,vram>=40G", "")


def test_seq_increases_with_every_insert(store: Store, make: Factory) -> None:
    # §2.3 seq: insertion order, never reused.
    (d0,) = make.worker(devices=1)
    seqs = [make.submit(device=d0).seq for _ in range(4)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        ({"selector": "vendor"}, SelectorError),
        ({"selector": "a=b,,c=d"}, SelectorError),
    ],
)
def test_enqueue_validation(
    store: Store, make: Factory, kw: dict[str, object], error: type
) -> None:
    # STORE-056 step 2; step 1 is the submit's (tests/controller/test_client_routes.py).
    make.worker(devices=1)
    with pytest.raises(error):
        make.submit(**kw)  # type: ignore[arg-type]
    assert store.views.list_jobs(limit=200) == []


def test_idempotent_submit_returns_the_existing_job_unchanged(store: Store, make: Factory) -> None:
    # STORE-056 step 3: whatever its state, submitter or contents; nothing written.
    d0, d1 = make.worker(devices=2)
    first = make.submit(device=d0, idempotency_key="k1")
    assert first.idempotency_key == "k1"
    again = make.submit(device=d1, submitter="mallory", command=("rm",), idempotency_key="k1")
    assert again == first
    store.queue.run_pass()
    store_helpers.release(store, first.id, "failed", 2, "boom")
    after = make.submit(device=d0, idempotency_key="k1")
    assert (after.id, after.state) == (first.id, "failed")
    assert len(store.views.list_jobs(limit=200)) == 1


def test_a_retried_pinned_submit_returns_the_job_before_the_device_checks(
    store: Store, make: Factory
) -> None:
    # STORE-057: the idempotency lookup comes before UnknownDevice/RuntimeAboveCeiling.
    store.devices.register("box", "boot-1", [("gpu0", 600)])
    job = make.submit(device="box:gpu0", idempotency_key="k")
    assert job.max_runtime_seconds == 600  # inherited
    assert make.submit(device="box:gpu0", max_runtime_seconds=10_000, idempotency_key="k") == job
    store.devices.retire("box:gpu0")
    assert make.submit(device="box:gpu0", idempotency_key="k") == job
    with pytest.raises(errors.UnknownDevice):
        make.submit(device="box:gpu0", idempotency_key="other")


def test_a_retried_selector_submit_is_revalidated_first(store: Store, make: Factory) -> None:
    # STORE-057: a retried selector submit can fail with NoMatchingDevice.
    make.worker(devices=1)
    label(store, "box", {"gpu0": {"vendor": "nvidia"}})
    job = make.submit(selector="vendor=nvidia", idempotency_key="k")
    assert make.submit(selector="vendor=nvidia", idempotency_key="k") == job
    label(store, "box", {"gpu0": {}})
    with pytest.raises(errors.NoMatchingDevice):
        make.submit(selector="vendor=nvidia", idempotency_key="k")


def test_pinned_submit_to_an_unregistered_device(store: Store, make: Factory) -> None:
    # STORE-056 step 4: UnknownDevice names the ID.
    make.worker(devices=1)
    with pytest.raises(errors.UnknownDevice, match="box:gpu7"):
        make.submit(device="box:gpu7")


def test_selector_matching_nothing_is_refused(store: Store, make: Factory) -> None:
    # STORE-056 step 2; SEL-010: matched over every device, whatever its state.
    d0, _d1 = make.worker(devices=2)
    label(store, "box", {"gpu0": {"vendor": "nvidia"}, "gpu1": {"vendor": "amd"}})
    with pytest.raises(errors.NoMatchingDevice, match="vendor=intel"):
        make.submit(selector=" vendor = intel ")
    store.devices.set_state(d0, "unhealthy", "x")
    assert make.submit(selector="vendor=nvidia").state == "queued"


def test_any_device_submit_with_an_empty_fleet_is_refused(store: Store, make: Factory) -> None:
    # EXT-CLI-1: neither device nor selector -> any device; none registered -> no match.
    with pytest.raises(errors.NoMatchingDevice):
        make.submit()


def test_pinned_runtime_above_the_ceiling_is_refused(store: Store, make: Factory) -> None:
    # STORE-056 step 4: requested > C -> RuntimeAboveCeiling naming device and C;
    # requested <= C is kept; requested 0 inherits C.
    store.devices.register("box", "boot-1", [("gpu0", 600)])
    with pytest.raises(errors.RuntimeAboveCeiling, match=r"box:gpu0.*600"):
        make.submit(device="box:gpu0", max_runtime_seconds=601)
    assert make.submit(device="box:gpu0", max_runtime_seconds=600).max_runtime_seconds == 600
    assert make.submit(device="box:gpu0", max_runtime_seconds=30).max_runtime_seconds == 30
    assert make.submit(device="box:gpu0").max_runtime_seconds == 600


def test_selector_runtime_above_every_matching_ceiling_is_refused(
    store: Store, make: Factory
) -> None:
    # STORE-056 step 2: message names the selector, R and the highest matching ceiling.
    store.devices.register("box", "boot-1", [("gpu0", 600), ("gpu1", 1200), ("gpu2", 0)])
    label(store, "box", {"gpu0": {"k": "a"}, "gpu1": {"k": "a"}, "gpu2": {"k": "b"}})
    with pytest.raises(errors.RuntimeAboveCeiling) as exc:
        make.submit(selector="k=a", max_runtime_seconds=1800)
    assert all(s in str(exc.value) for s in ("k=a", "1800", "1200"))
    job = make.submit(selector="k=a", max_runtime_seconds=1000)
    assert job.max_runtime_seconds == 1000  # a selector job does not inherit at enqueue
    assert (
        make.submit(selector="k!=zzz", max_runtime_seconds=99_999).state == "queued"
    )  # gpu2: no ceiling


def test_pinned_job_lease_uses_the_inherited_ceiling(store: Store, make: Factory) -> None:
    # STORE-056 step 4 inheritance at enqueue; STORE-052 "now + R + 10 min".
    store.devices.register("box", "boot-1", [("gpu0", 900)])
    job = make.submit(device="box:gpu0")
    assert job.max_runtime_seconds == 900
    store.queue.run_pass()
    (lease,) = store_helpers.live_leases(store)
    assert lease.expires_at == store.now() + 900 + 600


def test_selector_job_inherits_the_landing_devices_ceiling_at_assignment(
    store: Store, make: Factory
) -> None:
    # STORE-065 step 3; STORE-052.
    store.devices.register("box", "boot-1", [("gpu0", 900)])
    label(store, "box", {"gpu0": {"k": "a"}})
    job = make.submit(selector="k=a")
    assert job.max_runtime_seconds == 0
    store.queue.run_pass()
    assert store.views.job(job.id).max_runtime_seconds == 900
    (lease,) = store_helpers.live_leases(store)
    assert lease.expires_at == store.now() + 1500


def test_lease_without_runtime_lasts_five_minutes(store: Store, make: Factory) -> None:
    # STORE-052 first row.
    (d0,) = make.worker(devices=1)
    make.submit(device=d0)
    store.queue.run_pass()
    (lease,) = store_helpers.live_leases(store)
    assert lease.expires_at - lease.acquired_at == 300


# ---- running and release (STORE-080..083) ------------------------------------------------


def test_mark_running_moves_only_assigned_jobs(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # STORE-080: assigned -> running with started_at; a no-op for anything else.
    d0, d1 = make.worker(devices=2)
    job = make.submit(device=d0)
    queued = make.submit(device=d0)
    store.queue.run_pass()
    clock.advance(3)
    store_helpers.mark_running(store, job.id)
    started = store.now()
    assert (store.views.job(job.id).state, store.views.job(job.id).started_at) == (
        "running",
        started,
    )
    clock.advance(3)
    store_helpers.mark_running(store, job.id)
    store_helpers.mark_running(store, queued.id)
    store_helpers.mark_running(store, "no-such-job")
    assert store.views.job(job.id).started_at == started
    assert store.views.job(queued.id).state == "queued"
    done = make.start(d1)
    store_helpers.release(store, done.id, "succeeded", 0)
    store_helpers.mark_running(store, done.id)
    assert store.views.job(done.id).state == "succeeded"


def test_take_work_hands_each_assignment_out_once(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # STORE-080 / STORE-073: oldest first, moved to running before it is returned.
    d0, d1 = make.worker(devices=2)
    (theirs,) = make.worker(host="other", devices=1)
    a = make.submit(device=d0)
    clock.advance(1)
    b = make.submit(device=d1)
    c = make.submit(device=theirs)
    store.queue.run_pass()
    handed, kills = store.reports.take_work(wid())
    assert [j.id for j in handed] == [a.id, b.id]
    assert all(j.state == "running" and j.started_at == store.now() for j in handed)
    assert kills == []
    assert store.reports.take_work(wid()) == ([], [])
    assert store.views.job(c.id).state == "assigned"


def test_a_hand_out_the_worker_never_had_is_handed_out_again(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # A poll whose answer was lost left its job running; the worker's next poll names
    # what it has (``have``) and gets that job again, with its lease epoch.
    d0, d1 = make.worker(devices=2)
    (theirs,) = make.worker(host="other", devices=1)
    a = make.submit(device=d0)
    b = make.submit(device=d1)
    c = make.submit(device=theirs)
    store.queue.run_pass()
    lost, _ = store.reports.take_work(wid())  # the answer never arrives
    store.reports.take_work(wid("other"))
    assert store.reports.take_work(wid()) == ([], [])  # a worker naming nothing: spec
    clock.advance(5)
    again, _ = store.reports.take_work(wid(), have=[b.id])
    assert [j.id for j in again] == [a.id]
    assert again[0].lease_epoch == next(j for j in lost if j.id == a.id).lease_epoch > 0
    assert again[0].started_at == store.now() - 5  # handed again, not started again
    assert store.reports.take_work(wid(), have=[a.id, b.id]) == ([], [])
    store_helpers.release(store, a.id, "succeeded", 0)
    # a has ended, and c, running on the other worker, is never ours.
    assert store.views.job(c.id).state == "running"
    assert store.reports.take_work(wid(), have=[b.id]) == ([], [])


def test_release_of_a_terminal_job_changes_nothing(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # STORE-082 step 3; STORE-185.
    d0, _ = make.worker(devices=2)
    job = make.start(d0)
    store_helpers.release(store, job.id, "succeeded", 0, "")
    before = store.views.job(job.id)
    clock.advance(60)
    again = store_helpers.release(store, job.id, "killed", 137, "cancelled")
    assert again.was_terminal and again.job == before
    assert store.views.job(job.id) == before
    assert state_of(store, d0)[0] == "ready"


def test_release_of_a_queued_job_is_refused(store: Store, make: Factory) -> None:
    # STORE-083: refuse rather than touch the device row of a job that never held it.
    (d0,) = make.worker(devices=1)
    running = make.start(d0)
    queued = make.submit(device=d0)
    with pytest.raises(errors.InvalidTransition):
        store_helpers.release(store, queued.id, "succeeded", 0)
    assert store.views.job(queued.id) == queued
    assert state_of(store, d0)[0] == "busy"
    assert [x.job_id for x in store_helpers.live_leases(store)] == [running.id]


@pytest.mark.parametrize("bad", ["running", "assigned", "queued", "cancelled", ""])
def test_release_needs_a_terminal_state(store: Store, make: Factory, bad: str) -> None:
    # STORE-082 step 1: an error, nothing written.
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    with pytest.raises(errors.BadRequest):
        store_helpers.release(store, job.id, bad, 0)
    assert store.views.job(job.id) == job


def test_release_of_an_unknown_job_is_not_found(store: Store) -> None:
    # STORE-082 step 2.
    with pytest.raises(errors.JobNotFound):
        store_helpers.release(store, "no-such-job", "succeeded", 0)


# ---- cancellation and kills (STORE-090..095) ---------------------------------------------


def test_cancel_queued(store: Store, make: Factory, raw: Raw, clock: FakeClock) -> None:
    # STORE-090; STORE-041 "queued -> killed".
    (d0,) = make.worker(devices=1)
    running = make.start(d0)
    job = make.submit(device=d0)
    store.queue.run_pass()
    assert raw.reservations() == {(job.id, d0)}
    clock.advance(2)
    assert store.queue.cancel(job.id, "no-wait: device busy") is True
    j = store.views.job(job.id)
    assert (j.state, j.kill_reason, j.finished_at) == (
        "killed",
        "no-wait: device busy",
        store.now(),
    )
    assert raw.reservations() == set()
    assert store.queue.cancel(job.id, "again") is False
    assert store.views.job(job.id) == j
    assert store.queue.cancel(running.id, "x") is False
    assert store.views.job(running.id).state == "running"
    assert store.queue.cancel("no-such-job", "x") is False


@pytest.mark.parametrize("taken", [False, True])
def test_request_kill_flags_an_active_job(store: Store, make: Factory, taken: bool) -> None:
    # STORE-093: flag set, delivery stamp reset, reason NOT stored, nothing else moves.
    (d0,) = make.worker(devices=1)
    job = make.start(d0) if taken else make.submit(device=d0)
    if not taken:
        store.queue.run_pass()
    before = store.views.job(job.id)
    assert store.queue.request_kill(job.id, "killed by alice") == "requested"
    j = store.views.job(job.id)
    assert (j.kill_requested, j.kill_delivered_at, j.kill_reason) == (1, 0, "")
    assert j.state == before.state
    assert state_of(store, d0)[0] == "busy"
    assert len(store_helpers.live_leases(store)) == 1


@pytest.mark.parametrize(("dev_state", "reason"), [("unknown", ""), ("unhealthy", "worker_lost")])
def test_kill_is_finalised_when_the_worker_is_disconnected(
    store: Store, make: Factory, raw: Raw, clock: FakeClock, dev_state: str, reason: str
) -> None:
    # STORE-092; STORE-041 "assigned, running -> killed (finalised)".
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    raw.force_device(d0, dev_state, reason)
    clock.advance(4)
    outcome = store.queue.request_kill(
        job.id, "killed by admin override", finalize_disconnected=True
    )
    assert outcome == "finalized"
    j = store.views.job(job.id)
    assert (j.state, j.kill_reason, j.finished_at) == (
        "killed",
        "killed by admin override",
        store.now(),
    )
    assert (j.kill_requested, j.kill_delivered_at) == (1, 0)
    assert [r["released_at"] for r in raw.leases_of(job.id)] == [store.now()]
    assert state_of(store, d0) == (dev_state, reason, "")  # the device stays out


@pytest.mark.parametrize(
    ("finalize", "dev_state", "reason"),
    [
        (False, "unknown", ""),
        (False, "unhealthy", "worker_lost"),
        (True, "busy", ""),
        (True, "unhealthy", "fault"),
        (True, "unhealthy", "lease_expired"),
    ],
)
def test_kill_is_only_requested_otherwise(
    store: Store, make: Factory, raw: Raw, finalize: bool, dev_state: str, reason: str
) -> None:
    # STORE-092/093: finalise needs the flag AND a disconnected device.
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    if dev_state != "busy":
        raw.force_device(d0, dev_state, reason)
    assert store.queue.request_kill(job.id, "killed by bob", finalize_disconnected=finalize) == (
        "requested"
    )
    j = store.views.job(job.id)
    assert (j.state, j.kill_requested, j.kill_reason) == ("running", 1, "")
    assert len(store_helpers.live_leases(store)) == 1


def test_kill_of_a_queued_or_finished_job_is_not_cancellable(store: Store, make: Factory) -> None:
    # STORE-091.
    (d0,) = make.worker(devices=1)
    done = make.start(d0)
    store_helpers.release(store, done.id, "succeeded", 0)
    queued = make.submit(device=d0, priority=-1)
    blocker = make.start(d0)
    for job in (queued, done):
        before = store.views.job(job.id)
        assert (
            store.queue.request_kill(job.id, "x", finalize_disconnected=True) == "not_cancellable"
        )
        assert store.views.job(job.id) == before
    assert store.views.job(blocker.id).state == "running"
    with pytest.raises(errors.JobNotFound):
        store.queue.request_kill("no-such-job", "x")


def test_kill_flag_is_redelivered_only_after_thirty_quiet_seconds(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # STORE-094: a take, not a read; kill_delivered_at <= now - 30 qualifies.
    (d0,) = make.worker(devices=1)
    make.worker(host="other", devices=1)
    job = make.start(d0)
    assert store.queue.request_kill(job.id, "killed by alice") == "requested"
    assert store.reports.take_work(wid("other")) == ([], [])
    assert store.reports.take_work(wid()) == ([], [job.id])
    assert store.views.job(job.id).kill_delivered_at == store.now()
    assert store.reports.take_work(wid()) == ([], [])
    clock.advance(29)
    assert store.reports.take_work(wid()) == ([], [])
    clock.advance(1)
    assert store.reports.take_work(wid()) == ([], [job.id])
    # Re-issuing the kill resets the stamp: offered on the very next poll (STORE-093).
    clock.advance(5)
    store.queue.request_kill(job.id, "killed by alice")
    assert store.reports.take_work(wid()) == ([], [job.id])


def test_a_killed_jobs_flag_is_offered_until_a_heartbeat_clears_it(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # STORE-094 (state killed qualifies); STORE-095.
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    store.queue.request_kill(job.id, "killed by alice")
    assert store.reports.take_work(wid())[1] == [job.id]
    store_helpers.release(store, job.id, "killed", None, "cancelled")
    clock.advance(30)
    assert store.reports.take_work(wid())[1] == [job.id]
    store.reports.heartbeat(wid(), [])
    clock.advance(30)
    assert store.reports.take_work(wid())[1] == []


# ======================================================================================
# §8 scheduling (STORE-060..065)
# ======================================================================================


def test_higher_priority_goes_first_and_equal_priority_is_fifo(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # STORE-060: priority strict, then queued_at, then seq.
    (d0,) = make.worker(devices=1)
    current = make.start(d0)
    low = make.submit(device=d0, priority=-1)
    a = make.submit(device=d0)
    clock.advance(1)
    b = make.submit(device=d0)
    high = make.submit(device=d0, priority=5)
    order = []
    for _ in range(4):
        store_helpers.release(store, current.id, "succeeded", 0)
        (placed,) = store.queue.run_pass().assigned
        order.append(placed.job_id)
        current = store.views.job(placed.job_id)
    assert order == [high.id, a.id, b.id, low.id]


def test_fifo_within_one_second_follows_seq(store: Store, make: Factory) -> None:
    # STORE-186; STORE-060 "Why seq": equal queued_at, random IDs.
    (d0,) = make.worker(devices=1)
    current = make.start(d0)
    queued = [make.submit(device=d0) for _ in range(8)]
    assert len({j.queued_at for j in queued}) == 1
    assert [j.id for j in store.views.queued()] == [j.id for j in queued]
    order = []
    for _ in queued:
        store_helpers.release(store, current.id, "succeeded", 0)
        (placed,) = store.queue.run_pass().assigned
        order.append(placed.job_id)
        current = store.views.job(placed.job_id)
    assert order == [j.id for j in queued]


def test_selector_job_takes_the_first_ready_match_in_id_order(store: Store, make: Factory) -> None:
    # STORE-061: candidates are the matches sorted by ID.
    d0, d1, d2 = make.worker(devices=3)
    label(store, "box", {"gpu0": {"k": "a"}, "gpu1": {"k": "a"}, "gpu2": {"k": "a"}})
    make.start(d0)
    job = make.submit(selector="k=a")
    store.queue.run_pass()
    assert store.views.job(job.id).device_id == d1
    assert state_of(store, d2)[0] == "ready"


def test_reservations_claim_every_candidate_and_prune_per_candidate(
    store: Store, make: Factory, raw: Raw
) -> None:
    # STORE-061/062: a blocked job claims all its unclaimed candidates; jobs behind it are
    # pruned of only those and may still take an unclaimed one.
    d0, d1, d2, d3 = make.worker(devices=4)
    label(
        store,
        "box",
        {
            "gpu0": {"pool": "x", "kind": "a"},
            "gpu1": {"pool": "x", "kind": "a"},
            "gpu2": {"pool": "x", "kind": "b"},
            "gpu3": {"pool": "y"},
        },
    )
    blocker1 = make.start(d1)
    make.start(d0)
    make.start(d3)
    head = make.submit(selector="kind=a", priority=5)  # broad, at the head
    pinned = make.submit(device=d1)
    narrow = make.submit(selector="pool=x")
    other = make.submit(selector="pool=y")
    late = make.submit(selector="pool=x")
    assert store.queue.run_pass().assigned == [Assigned(narrow.id, wid())]
    assert store.views.job(narrow.id).device_id == d2
    assert raw.reservations() == {
        (head.id, d0),
        (head.id, d1),
        (other.id, d3),
        (late.id, d2),
    }
    # The head job holds up every device it matches: gpu1 goes to it, not to the pinned job.
    store_helpers.release(store, blocker1.id, "succeeded", 0)
    assert store.queue.run_pass().assigned == [Assigned(head.id, wid())]
    assert store.views.job(head.id).device_id == d1
    assert store.views.job(pinned.id).state == "queued"
    assert (pinned.id, d1) in raw.reservations()


@pytest.mark.parametrize("how", ["busy", "unhealthy", "unknown", "retired"])
def test_a_pinned_job_reserves_its_unavailable_device(
    store: Store, make: Factory, raw: Raw, how: str
) -> None:
    # STORE-062: "A pinned job whose device is busy (or unhealthy, unknown, or gone)
    # therefore reserves that device".
    d0, _d1 = make.worker(devices=2)
    label(store, "box", {"gpu0": {"k": "a"}, "gpu1": {"k": "b"}})
    behind_selector = "k=a" if how != "retired" else "k=b"
    if how == "busy":
        make.start(d0)
    elif how == "unhealthy":
        store.devices.set_state(d0, "unhealthy", "x")
    elif how == "unknown":
        raw.force_device(d0, "unknown")
    job = make.submit(device=d0)
    behind = make.submit(selector=behind_selector)
    if how == "retired":
        store.devices.retire(d0)
    placed = store.queue.run_pass().assigned
    assert store.views.job(job.id).state == "queued"
    assert (job.id, d0) in raw.reservations()
    if how == "retired":
        assert placed == [Assigned(behind.id, wid())]
    else:
        assert placed == []
        assert raw.reservations() == {(job.id, d0)}  # nothing left for the job behind


def test_reservation_rows_describe_the_latest_pass(store: Store, make: Factory, raw: Raw) -> None:
    # STORE-061: rows rebuilt every pass; a job still waiting keeps its reservation even
    # when an assignment in the same pass deleted the device's previous row.
    (d0,) = make.worker(devices=1)
    first = make.start(d0)
    waiting = make.submit(device=d0)
    store.queue.run_pass()
    assert raw.reservations() == {(waiting.id, d0)}
    store_helpers.release(store, first.id, "succeeded", 0)
    urgent = make.submit(device=d0, priority=5)
    assert store.queue.run_pass().assigned == [Assigned(urgent.id, wid())]
    assert raw.reservations() == {(waiting.id, d0)}
    store.queue.cancel(waiting.id, "killed by alice")
    store.queue.run_pass()
    assert raw.reservations() == set()


def test_a_job_cancelled_during_the_pass_does_not_block_the_next(
    store: Store, make: Factory, raw: Raw, monkeypatch: pytest.MonkeyPatch
) -> None:
    # STORE-063: "job no longer queued" reserves nothing; the next job takes the device
    # in the same pass.
    (d0,) = make.worker(devices=1)
    first = make.submit(device=d0)
    second = make.submit(device=d0)
    real_try = leases.try_assign

    def cancel_first_then_assign(
        transaction: Callable[[], AbstractContextManager[sql.Db]],
        now: int,
        job: JobRecord,
        device: DeviceRecord,
        limits: SubmitterLimits,
    ) -> str:
        if job.id == first.id:  # the cancel lands after the pass read the queue
            with transaction() as tx:
                reason = "killed by alice"
                assert moves.move(
                    tx,
                    JOB,
                    Op.CANCEL_QUEUED,
                    "id = ?",
                    (job.id,),
                    state="killed",
                    kill_reason=reason,
                    finished_at=now,
                )
        return real_try(transaction, now, job, device, limits)

    monkeypatch.setattr(leases, "try_assign", cancel_first_then_assign)
    assert store.queue.run_pass().assigned == [Assigned(second.id, wid())]
    assert store.views.job(first.id).state == "killed"
    assert raw.reservations() == set()


def test_a_selector_that_no_longer_parses_does_not_wedge_the_queue(
    store: Store, make: Factory, raw: Raw
) -> None:
    # STORE-061: "one bad row must not wedge the fleet".
    (d0,) = make.worker(devices=1)
    label(store, "box", {"gpu0": {"k": "a"}})
    broken = make.submit(selector="k=a", priority=5)
    raw.write("UPDATE jobs SET selector = 'k' WHERE id = ?", broken.id)
    good = make.submit(device=d0)
    assert store.queue.run_pass().assigned == [Assigned(good.id, wid())]
    assert store.views.job(broken.id).state == "queued"


def test_selector_jobs_are_ceiling_filtered_on_every_pass(
    store: Store, make: Factory, raw: Raw
) -> None:
    # STORE-064 / STORE-061: candidates with ceiling 0 or >= R only.
    store.devices.register("box", "boot-1", [("gpu0", 600), ("gpu1", 0)])
    label(store, "box", {"gpu0": {"k": "a"}, "gpu1": {"k": "a"}})
    blocker = make.start("box:gpu1")
    job = make.submit(selector="k=a", max_runtime_seconds=3600)
    assert store.queue.run_pass().assigned == []
    assert state_of(store, "box:gpu0")[0] == "ready"
    assert raw.reservations() == {(job.id, "box:gpu1")}
    store_helpers.release(store, blocker.id, "succeeded", 0)
    assert store.queue.run_pass().assigned == [Assigned(job.id, wid())]
    assert store.views.job(job.id).device_id == "box:gpu1"


def test_a_ceiling_lowered_after_enqueue_keeps_a_selector_job_off_the_device(
    store: Store, make: Factory, raw: Raw
) -> None:
    # STORE-064: the scheduler never places a job where enqueue would have refused it;
    # no candidates -> no reservation.
    store.devices.register("box", "boot-1", [("gpu0", 0)])
    label(store, "box", {"gpu0": {"k": "a"}})
    job = make.submit(selector="k=a", max_runtime_seconds=3600)
    store.devices.set_state("box:gpu0", "unhealthy", "maintenance")
    store.devices.register("box", "boot-1", [("gpu0", 600)])
    assert store.devices.clear("box:gpu0")
    assert store.queue.run_pass().assigned == []
    assert store.views.job(job.id).state == "queued"
    assert raw.reservations() == set()


def test_pinned_jobs_are_not_ceiling_filtered_at_schedule_time(store: Store, make: Factory) -> None:
    # STORE-064: the pinned job's ceiling was applied at enqueue.
    store.devices.register("box", "boot-1", [("gpu0", 3600)])
    job = make.submit(device="box:gpu0", max_runtime_seconds=3000)
    store.devices.set_state("box:gpu0", "unhealthy", "maintenance")
    store.devices.register("box", "boot-1", [("gpu0", 600)])
    assert store.devices.clear("box:gpu0")
    assert store.queue.run_pass().assigned == [Assigned(job.id, wid())]
    assert store.views.job(job.id).max_runtime_seconds == 3000
    (lease,) = store_helpers.live_leases(store)
    assert lease.expires_at == store.now() + 3000 + 600


def test_any_device_jobs_take_any_ready_device(store: Store, make: Factory) -> None:
    # EXT-CLI-1a: scheduled like a selector job matching every device.
    d0, d1 = make.worker(devices=2)
    make.start(d0)
    job = make.submit()
    assert (job.selector, job.device_id) == ("", "")
    assert store.queue.run_pass().assigned == [Assigned(job.id, wid())]
    assert store.views.job(job.id).device_id == d1


# ======================================================================================
# §9 queue reads (STORE-070/071), §20 job history (STORE-160/161)
# ======================================================================================


def test_queue_positions(store: Store, make: Factory, clock: FakeClock) -> None:
    # STORE-070: pinned counts pinned jobs on its device ahead; selector counts all ahead.
    d0, d1 = make.worker(devices=2)
    label(store, "box", {"gpu0": {"k": "a"}, "gpu1": {"k": "a"}})
    running = make.start(d0)
    make.start(d1)
    p1 = make.submit(device=d0)
    s1 = make.submit(selector="k=a")
    p2 = make.submit(device=d1)
    clock.advance(1)
    p3 = make.submit(device=d0)
    s2 = make.submit(selector="k=a")
    p4 = make.submit(device=d0, priority=5)
    positions = {
        j.id: store_helpers.job_with_position(store, j.id)[1] for j in (p1, s1, p2, p3, s2, p4)
    }
    assert positions == {
        p4.id: 1,
        p1.id: 2,  # behind p4 only (s1 not counted for a pinned job)
        p3.id: 3,
        p2.id: 1,  # nothing pinned to gpu1 ahead of it
        s1.id: 3,  # behind p4 and p1
        s2.id: 6,  # behind p4, p1, s1, p2, p3
    }
    assert store_helpers.job_with_position(store, running.id)[1] == 0
    store.queue.cancel(p1.id, "x")
    assert store_helpers.job_with_position(store, p1.id)[1] == 0
    assert store_helpers.job_with_position(store, p3.id)[1] == 2
    with pytest.raises(errors.JobNotFound):
        store_helpers.job_with_position(store, "no-such-job")


def test_queued_jobs_are_listed_in_scheduling_order(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # STORE-071.
    (d0,) = make.worker(devices=1)
    make.start(d0)
    a = make.submit(device=d0)
    clock.advance(1)
    b = make.submit(device=d0, priority=1)
    c = make.submit()
    assert [j.id for j in store.views.queued()] == [b.id, a.id, c.id]


def test_list_jobs_order_filters_and_limits(store: Store, make: Factory, clock: FakeClock) -> None:
    # STORE-161: submitted_at desc, then id desc; AND of exact filters; 1..200.
    d0, d1 = make.worker(devices=2)
    a = make.submit(device=d0, submitter="alice")
    b = make.submit(device=d1, submitter="bob")
    c = make.submit(device=d0, submitter="bob")
    clock.advance(10)
    d = make.submit(device=d1, submitter="alice")
    tied = sorted([a, b, c], key=lambda j: j.id, reverse=True)
    assert [j.id for j in store.views.list_jobs(limit=200)] == [d.id] + [j.id for j in tied]
    assert [j.id for j in store.views.list_jobs(limit=2)] == [d.id, tied[0].id]
    assert [j.id for j in store.views.list_jobs(limit=1)] == [d.id]
    assert {j.id for j in store.views.list_jobs(device=d0)} == {a.id, c.id}
    assert [j.id for j in store.views.list_jobs(device=d0, submitter="bob")] == [c.id]
    store.queue.run_pass()
    assert {j.id for j in store.views.list_jobs(state="queued")} == {c.id, d.id}
    assert store.views.list_jobs(submitter="nobody") == []
    assert store.views.list_jobs(device=d1, state="succeeded") == []
    for bad in (0, -1, 201):
        with pytest.raises(errors.BadRequest):
            store.views.list_jobs(limit=bad)


def test_list_jobs_by_id_prefix_has_no_wildcards(
    store: Store, make: Factory, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # EXT-CLI-7: jobs whose ID starts with the prefix, newest first, under the limit;
    # LIKE's % and _ are plain characters here, and case matters.
    import types

    ids = iter(["abc%ef-1", "abcdef-2", "abc_ef-3", "abcdef-4", "xabcdef-5"])
    (d0,) = make.worker(devices=1)
    with monkeypatch.context() as m:
        m.setattr(jobs, "uuid", types.SimpleNamespace(uuid4=lambda: next(ids)))
        for _ in range(5):
            make.submit(device=d0)
            clock.advance(1)

    def found(prefix: str, **kw: object) -> list[str]:
        return [j.id for j in store.views.list_jobs(id_prefix=prefix, **kw)]  # type: ignore[arg-type]

    assert found("abcdef") == ["abcdef-4", "abcdef-2"]
    assert found("abcdef", limit=1) == ["abcdef-4"]
    assert found("abc%ef") == ["abc%ef-1"]
    assert found("abc_ef") == ["abc_ef-3"]
    assert found("abc%") == ["abc%ef-1"]
    assert found("%") == found("_") == found("ABCDEF") == found("bcdef") == []
    assert found("abcdef-2") == ["abcdef-2"]
    assert found("abcdef-2x") == []
    assert found("abcdef", submitter="nobody") == []
    assert len(found("")) == 5  # no prefix: no filter


def test_job_not_found(store: Store) -> None:
    # STORE-160.
    with pytest.raises(errors.JobNotFound):
        store.views.job("no-such-job")


# ======================================================================================
# leases: epochs (EXT-EPOCH-1) and the database's own guard (STORE-010)
# ======================================================================================


def test_epochs_strictly_increase_and_survive_retire(store: Store, make: Factory, raw: Raw) -> None:
    # EXT-EPOCH-1: never reused, even after retire deleted the lease rows.
    d0, d1 = make.worker(devices=2)
    epochs = []
    for device in (d0, d1, d0):
        job = make.start(device)
        (lease,) = raw.leases_of(job.id)
        assert store.views.job(job.id).lease_epoch == lease["epoch"]
        epochs.append(lease["epoch"])
        store_helpers.release(store, job.id, "succeeded", 0)
    store.devices.retire(d0)
    store.devices.retire(d1)
    assert raw.count("leases") == 0
    make.worker(devices=2)
    job = make.start(d0)
    epochs.append(store.views.job(job.id).lease_epoch)
    assert epochs[0] > 0
    assert all(x < y for x, y in itertools.pairwise(epochs))


def test_the_database_refuses_a_second_live_lease(
    store: Store, make: Factory, tmp_path: Path
) -> None:
    # STORE-010: enforced by the partial unique index, whatever the checks above it do.
    d0, d1 = make.worker(devices=2)
    job = make.start(d0)
    other = make.submit(device=d1)

    def insert(lease_id: str, released_at: int | None) -> None:
        with store.tx() as c:
            c.execute(
                "INSERT INTO leases (id, device_id, holder, job_id, acquired_at, expires_at,"
                " released_at, epoch) VALUES (?, ?, 'mallory', '', 1, 2, ?, 0)",
                (lease_id, d0, released_at),
            )

    with pytest.raises(errors.StoreError) as refused:
        insert("second", None)
    cause = refused.value.__cause__
    assert cause is not None and sql.row_error(cause)  # the index's refusal, not an outage
    with pytest.raises(errors.LiveLeaseConflict), store.tx() as c:
        leases.grant(c, store.now(), other, d0, 0)
    insert("old", 1)  # released rows are history, not live leases
    assert [x.job_id for x in store_helpers.live_leases(store)] == [job.id]


# ======================================================================================
# §1 storage: migrations on open (STORE-006)
# ======================================================================================


def test_reopening_a_database_keeps_its_state(tmp_path: Path, clock: FakeClock) -> None:
    # STORE-006 (open = migrate to head, idempotent); EXT-EPOCH-1 "survives restarts".
    path = tmp_path / "again.db"
    first = Store(path, clock)
    try:
        first.devices.register("box", "boot-1", [("gpu0", 0)])
        job = first.queue.enqueue(
            jobs.NewJob(command=["x"], submitter="alice", device_id="box:gpu0")
        )
        first.queue.run_pass()
        epoch = first.views.job(job.id).lease_epoch
        store_helpers.release(first, job.id, "succeeded", 0)
    finally:
        first.close()
    second = Store(path, clock)
    try:
        assert second.views.job(job.id).state == "succeeded"
        again = second.queue.enqueue(
            jobs.NewJob(command=["x"], submitter="a", device_id="box:gpu0")
        )
        assert again.seq > job.seq
        second.queue.run_pass()
        assert second.views.job(again.id).lease_epoch > epoch
    finally:
        second.close()


def test_a_database_from_a_newer_version_is_refused(tmp_path: Path, clock: FakeClock) -> None:
    # STORE-006: "MUST fail with an error saying the database was written by a newer
    # version".
    path = tmp_path / "future.db"
    Store(path, clock).close()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999_from_the_future'")
    conn.close()
    with pytest.raises(errors.StoreError, match="newer version"):
        Store(path, clock)


def test_assigning_a_job_that_left_the_queue_leaves_the_device_ready(
    store: Store, make: Factory
) -> None:
    # STORE-065 steps 1-2: "job no longer queued" writes nothing, even though the
    # device check (which runs first) had already flipped it inside the transaction.
    (d0,) = make.worker(devices=1)
    job = make.submit(device=d0)
    assert store.queue.cancel(job.id, "killed by alice")
    device = store_helpers.device(store, d0)
    assert device is not None
    outcome = leases.try_assign(store.tx, store.now(), job, device)
    assert outcome == "gone"
    assert store_helpers.device(store, d0).state == "ready"  # type: ignore[union-attr]
    assert store_helpers.live_leases(store) == []


def test_the_pass_reads_past_its_first_page_of_the_queue(store: Store, make: Factory) -> None:
    # STORE-061: the walk is in pages; a placeable job far back is still placed.
    d0, d1 = make.worker(devices=2)
    make.start(device=d0)
    blocked = [make.submit(device=d0) for _ in range(passes.QUEUE_PAGE + 5)]
    late = make.submit(device=d1)
    assert store.queue.run_pass().assigned == [Assigned(late.id, wid())]
    assert all(store.views.job(j.id).state == "queued" for j in blocked)


def test_jobs_pinned_to_a_vanished_device_reserve_it_after_the_walk_stops(
    store: Store, make: Factory, raw: Raw
) -> None:
    # STORE-062: a pinned job whose device is gone reserves that device, even when every
    # existing device was claimed earlier in the pass and the walk stopped there.
    (d0,) = make.worker(devices=1)
    make.start(device=d0)
    ahead = make.submit(device=d0)
    ghost = make.submit(device=d0)
    raw.write("UPDATE jobs SET device_id = 'box:gone' WHERE id = ?", ghost.id)
    behind = make.submit(device=d0)
    raw.write("UPDATE jobs SET device_id = 'box:gone' WHERE id = ?", behind.id)
    assert store.queue.run_pass().assigned == []
    assert raw.reservations() == {(ahead.id, d0), (ghost.id, "box:gone")}
