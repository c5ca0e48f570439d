"""The pass's fleet snapshot (``store/fleet.py``) is always what a fresh read of the whole
fleet gives, whatever wrote the devices: registration, facts and labels, drain, state
changes, clears, retirement, grants and releases, heartbeats, sweeps, and a hand edit of
the file from another connection (the triggers of migration 0006 see every writer).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resource_controller import errors
from resource_controller.clock import FakeClock
from resource_controller.core.expiry import SweepRules
from resource_controller.store.facade import Store
from resource_controller.store.fleet import FleetSnapshot

from .dbview import Raw, wid

if TYPE_CHECKING:
    from conftest import Factory

HOSTS = ["a", "b"]
DEVICES = [f"{h}:gpu{i}" for h in HOSTS for i in range(3)]


def _fresh(store: Store) -> tuple[dict[str, Any], list[Any]]:
    with store._read() as db:
        records, snaps = FleetSnapshot().read(db)
    return records, snaps


def _kept(store: Store) -> tuple[dict[str, Any], list[Any]]:
    with store._read() as db:
        return store._fleet.read(db)


def _assert_current(store: Store) -> None:
    records, snaps = _kept(store)
    fresh_records, fresh_snaps = _fresh(store)
    assert snaps == fresh_snaps
    scheduled = [(r.id, r.worker_id, r.max_runtime) for r in records.values()]
    fresh = [(r.id, r.worker_id, r.max_runtime) for r in fresh_records.values()]
    assert sorted(scheduled) == sorted(fresh)


def _apply(store: Store, make: Factory, raw: Raw, clock: FakeClock, op: tuple[Any, ...]) -> None:
    kind, host, index, flag = op
    device = f"{host}:gpu{index}"
    try:
        if kind == "register":
            names = [f"gpu{i}" for i in range(index + 1)]
            store.register(host, f"boot-{flag % 2}", [(n, 60 * flag) for n in names])
        elif kind == "facts":
            store.apply_facts(
                host,
                [f"gpu{index}"],
                {f"gpu{index}": {"vram": f"{40 * flag}G"}},
                {f"gpu{index}": {"rack": str(flag)}} if flag % 2 else None,
                None,
                None,
            )
        elif kind == "drain":
            store.drain_device(device, "ops", "r")
        elif kind == "undrain":
            store.undrain_device(device)
        elif kind == "unhealthy":
            store.set_device_state(device, "unhealthy", "probe")
        elif kind == "clear":
            store.clear_device(device)
        elif kind == "retire":
            store.retire_device(device)
        elif kind == "submit":
            make.submit(device=device if flag % 2 else "")
            store.schedule()
        elif kind == "finish":
            for job in store.active_jobs()[:1]:
                store.release(job.id, "succeeded", 0)
            store.schedule()
        elif kind == "heartbeat":
            store.heartbeat(wid(host), [j.id for j in store.active_jobs()])
        elif kind == "sweep":
            clock.advance(40 * flag)
            store.sweep(SweepRules(hold_off_until=None))
        elif kind == "hand_edit":
            raw.write("UPDATE devices SET state = 'unknown' WHERE id = ?", device)
        elif kind == "label_edit":
            raw.write("DELETE FROM device_labels WHERE device_id = ?", device)
    except errors.RcError:
        pass  # refused as the API would refuse it: nothing written


OPS = st.tuples(
    st.sampled_from(
        [
            "register",
            "facts",
            "drain",
            "undrain",
            "unhealthy",
            "clear",
            "retire",
            "submit",
            "finish",
            "heartbeat",
            "sweep",
            "hand_edit",
            "label_edit",
        ]
    ),
    st.sampled_from(HOSTS),
    st.integers(0, 2),
    st.integers(0, 3),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(OPS, min_size=1, max_size=25))
def test_the_kept_snapshot_is_a_fresh_read_after_every_write(
    store: Store, make: Factory, raw: Raw, clock: FakeClock, ops: list[tuple[Any, ...]]
) -> None:
    for op in ops:
        _apply(store, make, raw, clock, op)
        _assert_current(store)
    # Leave the file empty of devices for the next example (the fixture is shared).
    for device in DEVICES:
        for job in store.active_jobs():
            store.release(job.id, "succeeded", 0)
        for job in store.queued_jobs():
            store.cancel_queued(job.id, "done")
        with contextlib.suppress(errors.RcError):
            store.retire_device(device)
    _assert_current(store)


def test_a_routine_heartbeat_notes_no_device(store: Store, make: Factory, raw: Raw) -> None:
    make.worker(devices=4)
    _kept(store)
    before = raw.rows("SELECT device_id, version FROM device_changes ORDER BY device_id")
    assert store.heartbeat(wid(), []) is False
    after = raw.rows("SELECT device_id, version FROM device_changes ORDER BY device_id")
    assert [tuple(r) for r in after] == [tuple(r) for r in before]


def test_a_grant_rereads_only_its_device(store: Store, make: Factory, raw: Raw) -> None:
    [dev, *_] = make.worker(devices=4)
    _kept(store)
    (mark,) = raw.rows("SELECT max(version) AS v FROM device_changes")
    make.start(device=dev)
    changed = raw.rows("SELECT device_id FROM device_changes WHERE version > ?", mark["v"])
    assert [r["device_id"] for r in changed] == [dev]
    _assert_current(store)
