"""Autonomous recovery and the flap guard (store.md §15), with the injected clock."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from resource_controller.clock import FakeClock
from resource_controller.core.expiry import Proof, SweepRules
from resource_controller.store.facade import Store
from resource_controller.store.records import Recovered, RecoveryEntry
from support import store_helpers

from .dbview import Raw, invariant_violations, state_of, wid

if TYPE_CHECKING:
    from conftest import Factory

ISOLATED = Proof(isolated=True)
CLEAN = Proof(survivors_checked=True)


def recoveries(raw: Raw, device_id: str) -> list[tuple[int, str]]:
    return [
        (r["at"], r["reason"])
        for r in raw.rows(
            "SELECT at, reason FROM device_recoveries WHERE device_id = ? ORDER BY at", device_id
        )
    ]


@pytest.fixture(autouse=True)
def _invariants_hold_after_each_test(raw: Raw) -> Iterator[None]:
    yield
    assert invariant_violations(raw) == []


# ---- proofs and candidates (STORE-120/121) -----------------------------------------------


@pytest.mark.parametrize(
    "proof",
    [
        None,
        Proof(),
        Proof(survivors_checked=True, survivors_found=True),
        Proof(survivors_found=True),
    ],
)
def test_no_valid_proof_recovers_nothing_and_writes_nothing(
    store: Store, make: Factory, raw: Raw, proof: Proof | None
) -> None:
    (d0,) = make.worker(devices=1)
    raw.force_device(d0, "unhealthy", "worker_lost")
    out = store.devices.auto_recover(wid(), proof)
    assert out.recovered == [] and out.held_back == []
    assert state_of(store, d0)[:2] == ("unhealthy", "worker_lost")
    assert raw.count("device_recoveries") == 0


@pytest.mark.parametrize("proof", [ISOLATED, CLEAN])
def test_recoverable_quarantines_return_in_device_order(
    store: Store, make: Factory, raw: Raw, proof: Proof
) -> None:
    # STORE-121 steps 2-3; STORE-032 clears reason and detail; a row per recovery.
    d0, d1, d2, d3 = make.worker(devices=4)
    raw.force_device(d2, "unhealthy", "worker_lost", "silent")
    raw.force_device(d0, "unhealthy", "registration", "reaped")
    raw.force_device(d1, "unhealthy", "lease_expired", "lapsed")
    now = store.now()
    out = store.devices.auto_recover(wid(), proof)
    assert out.recovered == [
        Recovered(d0, "registration"),
        Recovered(d1, "lease_expired"),
        Recovered(d2, "worker_lost"),
    ]
    for d in (d0, d1, d2):
        assert state_of(store, d) == ("ready", "", "")
    assert recoveries(raw, d1) == [(now, "lease_expired")]
    assert state_of(store, d3) == ("ready", "", "")  # was never out: not a recovery
    assert recoveries(raw, d3) == []


@pytest.mark.parametrize("reason", ["fault", ""])
def test_never_fault_never_unknown_cause(
    store: Store, make: Factory, raw: Raw, reason: str
) -> None:
    # STORE-121: "Never fault, never ''"; STORE-030 ('' is cause unknown); STORE-184.
    (d0,) = make.worker(devices=1)
    raw.force_device(d0, "unhealthy", reason, "keep me")
    assert store.devices.auto_recover(wid(), ISOLATED).recovered == []
    assert state_of(store, d0) == ("unhealthy", reason, "keep me")


def test_never_another_workers_device(store: Store, make: Factory, raw: Raw) -> None:
    (mine,) = make.worker(devices=1)
    (theirs,) = make.worker(host="other", devices=1)
    raw.force_device(mine, "unhealthy", "worker_lost")
    raw.force_device(theirs, "unhealthy", "worker_lost")
    assert store.devices.auto_recover(wid(), ISOLATED).recovered == [Recovered(mine, "worker_lost")]
    assert state_of(store, theirs)[:2] == ("unhealthy", "worker_lost")


@pytest.mark.parametrize("state", ["ready", "busy", "unknown"])
def test_only_unhealthy_devices_are_candidates(
    store: Store, make: Factory, raw: Raw, state: str
) -> None:
    (d0,) = make.worker(devices=1)
    if state == "busy":
        make.start(d0)
    else:
        raw.force_device(d0, state)
    assert store.devices.auto_recover(wid(), ISOLATED).recovered == []
    assert state_of(store, d0)[0] == state


def test_never_a_device_with_a_live_lease(store: Store, make: Factory, raw: Raw) -> None:
    # STORE-121 "no live lease": the lease table outranks any proof.
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    raw.force_device(d0, "unhealthy", "registration")
    assert store.devices.auto_recover(wid(), ISOLATED).recovered == []
    assert state_of(store, d0)[:2] == ("unhealthy", "registration")
    store_helpers.release(store, job.id, "succeeded", 0)
    assert store.devices.auto_recover(wid(), ISOLATED).recovered == [Recovered(d0, "registration")]


def test_the_registration_sequence_lifts_the_quarantine_it_just_wrote(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # STORE-113: upsert -> auto-recover, each its own transaction, in that order.
    (d0,) = make.worker(devices=1)
    job = make.start(d0)
    clock.advance(5)
    reg = store.devices.register("box", "boot-1", [("gpu0", 0)])  # same boot: no reboot proof
    assert reg.reaped == [job.id]
    assert state_of(store, d0)[:2] == ("unhealthy", "registration")
    assert store.devices.auto_recover(reg.worker_id, CLEAN).recovered == [
        Recovered(d0, "registration")
    ]
    assert state_of(store, d0) == ("ready", "", "")
    assert store.views.job(job.id).state == "lost"  # recovery frees the device, not the job


def test_a_written_off_worker_recovers_on_proof(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    d0, d1 = make.worker()
    job = make.start(d0)
    clock.advance(400)
    store.devices.sweep(SweepRules())
    assert store.views.job(job.id).state == "lost"
    store.devices.register("box", "boot-1", [("gpu0", 0), ("gpu1", 0)])
    out = store.devices.auto_recover(wid(), ISOLATED)
    assert out.recovered == [Recovered(d0, "worker_lost"), Recovered(d1, "worker_lost")]


# ---- the flap guard (STORE-122) ---------------------------------------------------------


def quarantine_and_recover(store: Store, raw: Raw, device_id: str) -> bool:
    raw.force_device(device_id, "unhealthy", "worker_lost")
    out = store.devices.auto_recover(wid(), ISOLATED)
    assert [r.device_id for r in out.recovered] + out.held_back == [device_id]
    return bool(out.recovered)


def test_three_recoveries_per_sliding_hour_with_the_exact_edge(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    (d0,) = make.worker(devices=1)
    first = store.now()
    assert quarantine_and_recover(store, raw, d0)
    clock.advance(600)
    assert quarantine_and_recover(store, raw, d0)
    clock.advance(600)
    assert quarantine_and_recover(store, raw, d0)
    clock.advance(600)
    # The fourth within the hour waits for a person.
    assert not quarantine_and_recover(store, raw, d0)
    assert state_of(store, d0)[:2] == ("unhealthy", "worker_lost")
    # At exactly one hour after the first, the first still counts.
    clock.set(first + 3600)
    assert store.devices.auto_recover(wid(), ISOLATED).held_back == [d0]
    # One second later it has left the window (the window slides; no latch).
    clock.advance(1)
    out = store.devices.auto_recover(wid(), ISOLATED)
    assert out.recovered == [Recovered(d0, "worker_lost")] and out.held_back == []
    # Pruned: rows older than the hour are gone; the three inside it remain.
    assert [at for at, _ in recoveries(raw, d0)] == [first + 600, first + 1200, first + 3601]


def test_pruning_is_lazy_and_only_for_devices_considered(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    d0, d1 = make.worker()
    for d in (d0, d1):
        raw.write("INSERT INTO device_recoveries (device_id, at, reason) VALUES (?, 1, 'x')", d)
    raw.force_device(d0, "unhealthy", "worker_lost")
    store.devices.auto_recover(wid(), ISOLATED)
    assert [at for at, _ in recoveries(raw, d0)] == [store.now()]
    assert recoveries(raw, d1) == [(1, "x")]  # not a candidate: untouched


def test_an_operator_clear_does_not_reset_the_count(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    (d0,) = make.worker(devices=1)
    for _ in range(3):
        assert quarantine_and_recover(store, raw, d0)
        clock.advance(60)
    raw.force_device(d0, "unhealthy", "worker_lost")
    assert store.devices.clear(d0)
    assert not quarantine_and_recover(store, raw, d0)


def test_reboot_recovery_neither_counts_nor_is_limited(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    # STORE-110 step 4 / STORE-122: proven-reboot recovery is outside the flap guard.
    (d0,) = make.worker(devices=1, boot_id="boot-1")
    for _ in range(3):
        assert quarantine_and_recover(store, raw, d0)
        clock.advance(60)
    raw.force_device(d0, "unhealthy", "worker_lost")
    assert not quarantine_and_recover(store, raw, d0)  # the guard holds it
    store.devices.register("box", "boot-2", [("gpu0", 0)])  # the host rebooted
    assert state_of(store, d0) == ("ready", "", "")
    assert len(recoveries(raw, d0)) == 3  # not counted


def test_flap_counts_survive_retire_and_recreate(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    # STORE-007 / STORE-133: the history outlives the device row.
    (d0,) = make.worker(devices=1)
    for _ in range(3):
        assert quarantine_and_recover(store, raw, d0)
    store.devices.retire(d0)
    make.worker(devices=1)
    assert not quarantine_and_recover(store, raw, d0)


# ---- history read (STORE-123) -----------------------------------------------------------


def test_recovery_history(store: Store, make: Factory, raw: Raw, clock: FakeClock) -> None:
    (d0,) = make.worker(devices=1)
    empty = store_helpers.recovery_history(store, d0)
    assert (empty.recoveries, empty.remaining, empty.limit, empty.window) == ([], 3, 3, 3600)
    start = store.now()
    raw.write(
        "INSERT INTO device_recoveries (device_id, at, reason) VALUES (?, ?, 'old')",
        d0,
        start - 3601,
    )
    raw.force_device(d0, "unhealthy", "registration")
    store.devices.auto_recover(wid(), ISOLATED)
    clock.advance(100)
    raw.force_device(d0, "unhealthy", "lease_expired")
    store.devices.auto_recover(wid(), CLEAN)
    h = store_helpers.recovery_history(store, d0)
    assert h.recoveries == [
        RecoveryEntry(start + 100, "lease_expired"),
        RecoveryEntry(start, "registration"),
    ]
    assert h.remaining == 1
    # It filters by the window itself, not by what pruning left behind.
    raw.write("INSERT INTO device_recoveries (device_id, at, reason) VALUES (?, ?, 'old')", d0, 5)
    clock.set(start + 3600)
    assert [e.at for e in store_helpers.recovery_history(store, d0).recoveries] == [
        start + 100,
        start,
    ]
    clock.advance(1)
    assert store_helpers.recovery_history(store, d0).recoveries == [
        RecoveryEntry(start + 100, "lease_expired")
    ]
    assert store_helpers.recovery_history(store, d0).remaining == 2


def test_recovery_history_of_an_unknown_device(store: Store) -> None:
    h = store_helpers.recovery_history(store, "nohost:gpu9")
    assert (h.recoveries, h.remaining) == ([], 3)


def test_remaining_never_goes_below_zero(store: Store, make: Factory, raw: Raw) -> None:
    (d0,) = make.worker(devices=1)
    for _ in range(5):
        raw.write(
            "INSERT INTO device_recoveries (device_id, at, reason) VALUES (?, ?, 'x')",
            d0,
            store.now(),
        )
    assert store_helpers.recovery_history(store, d0).remaining == 0
