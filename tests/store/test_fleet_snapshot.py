"""The pass's fleet snapshot (``store/fleet.py``) is always what a fresh read of the whole
fleet gives, whatever wrote the devices: registration, facts and labels, drain, state
changes, clears, retirement, grants and releases, heartbeats, sweeps, and a hand edit of
the file from another connection (the triggers of migration 0006 see every writer).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resource_controller import errors
from resource_controller.clock import FakeClock
from resource_controller.core.expiry import SweepRules
from resource_controller.core.planner import FleetIndex
from resource_controller.core.scheduling import JobSnap, candidates
from resource_controller.store import fleet
from resource_controller.store.facade import Store
from resource_controller.store.fleet import FleetSnapshot
from support import store_helpers

from .dbview import Raw, wid

if TYPE_CHECKING:
    from conftest import Factory

HOSTS = ["a", "b"]
DEVICES = [f"{h}:gpu{i}" for h in HOSTS for i in range(3)]


def _fresh(store: Store) -> tuple[dict[str, Any], list[Any]]:
    with store.read() as db:
        records, snaps = FleetSnapshot().read(db)
    return records, snaps


def _kept(store: Store) -> tuple[dict[str, Any], list[Any]]:
    with store.read() as db:
        return store.fleet.read(db)


def _assert_current(store: Store) -> None:
    records, snaps = _kept(store)
    fresh_records, fresh_snaps = _fresh(store)
    assert snaps == fresh_snaps
    scheduled = [(r.id, r.worker_id, r.max_runtime_seconds) for r in records.values()]
    fresh = [(r.id, r.worker_id, r.max_runtime_seconds) for r in fresh_records.values()]
    assert sorted(scheduled) == sorted(fresh)
    # The views' read: every column of every record, heartbeat stamps included, and
    # every label record, as a plain read of the tables gives them.
    with store.read() as db:
        rows, labels = store.fleet.current(db)
        fresh_labels = fleet.label_rows(db)
        _, index = store.fleet.index(db)
    # The planner's index, updated per changed device, is the one a fresh build gives,
    # and every candidate list it kept is what the rule gives on today's fleet.
    built = FleetIndex(fresh_snaps)
    assert list(index.devices) == list(built.devices)
    assert index.by_id == built.by_id
    assert (index.schedulable, index.draining, index.reservable) == (
        built.schedulable,
        built.draining,
        built.reservable,
    )
    for (selector, runtime), found in index.matches.items():
        job = JobSnap(id="j", seq=1, selector=selector, max_runtime_seconds=runtime)
        assert found == candidates(job, fresh_snaps)
    assert rows == store_helpers.devices(store)
    ids = {d.id for d in rows}  # labels may outlive or precede their device's row
    assert {d: labels[d] for d in ids if d in labels} == {
        d: fresh_labels[d] for d in ids if d in fresh_labels
    }


def _apply(store: Store, make: Factory, raw: Raw, clock: FakeClock, op: tuple[Any, ...]) -> None:
    kind, host, index, flag = op
    device = f"{host}:gpu{index}"
    try:
        if kind == "register":
            names = [f"gpu{i}" for i in range(index + 1)]
            store.devices.register(host, f"boot-{flag % 2}", [(n, 60 * flag) for n in names])
        elif kind == "facts":
            store.devices.apply_facts(
                host,
                [f"gpu{index}"],
                {f"gpu{index}": {"vram": f"{40 * flag}G"}},
                {f"gpu{index}": {"rack": str(flag)}} if flag % 2 else None,
                None,
                None,
            )
        elif kind == "drain":
            store.devices.drain(device, "ops", "r")
        elif kind == "undrain":
            store.devices.undrain(device)
        elif kind == "unhealthy":
            store.devices.set_state(device, "unhealthy", "probe")
        elif kind == "clear":
            store.devices.clear(device)
        elif kind == "retire":
            store.devices.retire(device)
        elif kind == "submit":
            if flag == 2:
                make.submit(selector="vram>=40G", max_runtime_seconds=30)
            else:
                make.submit(device=device if flag % 2 else "")
            store.queue.run_pass()
        elif kind == "finish":
            for job in store.views.active()[:1]:
                store_helpers.release(store, job.id, "succeeded", 0)
            store.queue.run_pass()
        elif kind == "heartbeat":
            store.reports.heartbeat(wid(host), [j.id for j in store.views.active()])
        elif kind == "sweep":
            clock.advance(40 * flag)
            store.devices.sweep(SweepRules(hold_off_until=None))
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
        for job in store.views.active():
            store_helpers.release(store, job.id, "succeeded", 0)
        for job in store.views.queued():
            store.queue.cancel(job.id, "done")
        with contextlib.suppress(errors.RcError):
            store.devices.retire(device)
    _assert_current(store)


def test_a_routine_heartbeat_notes_no_device(store: Store, make: Factory, raw: Raw) -> None:
    make.worker(devices=4)
    _kept(store)
    before = raw.rows("SELECT device_id, version FROM device_changes ORDER BY device_id")
    assert store.reports.heartbeat(wid(), []) is False
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


def test_every_device_column_but_the_heartbeat_stamp_is_noted(raw: Raw) -> None:
    from resource_controller.store import schema

    if raw.postgres:
        (trigger,) = raw.rows(
            "SELECT pg_get_triggerdef(oid) AS sql FROM pg_trigger"
            " WHERE tgname = 'devices_noted_update'"
        )
        same = r"\(?old\.(\w+) IS DISTINCT FROM new\.\1\)?"
    else:
        (trigger,) = raw.rows("SELECT sql FROM sqlite_master WHERE name = 'devices_noted_update'")
        same = r"OLD\.(\w+) IS NOT NEW\.\1"
    when = trigger["sql"].split(" WHEN ", 1)[1]
    noted = sorted(set(re.findall(same, when, re.I)))
    columns = [c.name for c in schema.devices.columns if c.name != "last_heartbeat_at"]
    assert noted == sorted(columns)


def test_a_write_of_the_same_value_notes_nothing(store: Store, make: Factory, raw: Raw) -> None:
    [dev, *_] = make.worker(devices=2)
    (mark,) = raw.rows("SELECT max(version) AS v FROM device_changes")
    raw.write("UPDATE devices SET state = state, last_heartbeat_at = 5 WHERE id = ?", dev)
    assert raw.rows("SELECT 1 FROM device_changes WHERE version > ?", mark["v"]) == []
    raw.write("UPDATE devices SET quarantine_detail = 'x' WHERE id = ?", dev)
    changed = raw.rows("SELECT device_id FROM device_changes WHERE version > ?", mark["v"])
    assert [r["device_id"] for r in changed] == [dev]


def test_the_views_see_a_fresh_heartbeat_stamp(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    make.worker(devices=2)
    before = {s.device.id: s.device.last_heartbeat_at for s in store.views.devices()}
    clock.advance(7)
    store.reports.heartbeat(wid(), [])
    after = {s.device.id: s.device.last_heartbeat_at for s in store.views.devices()}
    assert after == {d: at + 7 for d, at in before.items()}


def test_a_rolled_back_write_it_read_is_forgotten(store: Store, make: Factory) -> None:
    [dev, *_] = make.worker(devices=2)
    _kept(store)

    class Undo(Exception):
        pass

    with contextlib.suppress(Undo), store.tx() as c:
        c.execute("UPDATE devices SET state = 'unhealthy' WHERE id = ?", (dev,), "device:forced")
        records, _ = store.fleet.read(c)
        assert records[dev].state == "unhealthy"  # read inside the transaction
        raise Undo
    _assert_current(store)
    assert _kept(store)[0][dev].state == "ready"


def test_a_rollback_it_did_not_read_keeps_the_snapshot(store: Store, make: Factory) -> None:
    [dev, *_] = make.worker(devices=2)
    _kept(store)
    kept_version = store.fleet._version

    class Undo(Exception):
        pass

    with contextlib.suppress(Undo), store.tx() as c:
        c.execute("UPDATE devices SET state = 'unhealthy' WHERE id = ?", (dev,), "device:forced")
        raise Undo
    assert store.fleet._version == kept_version  # nothing to reread: no full read next
    _assert_current(store)


def test_migration_0008_goes_down_to_0006s_trigger_and_back(tmp_path: Path) -> None:
    from alembic import command

    from resource_controller.store import engine

    def trigger_sql(conn: Any) -> str:
        return str(
            conn.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE name = 'devices_noted_update'"
            ).scalar()
        )

    eng = engine.create_engine(tmp_path / "m.db")
    try:
        with eng.connect() as conn:
            cfg = engine._alembic_config(conn)
            command.upgrade(cfg, "0007")
            old = trigger_sql(conn)
            command.upgrade(cfg, "0008")
            assert " WHEN " in trigger_sql(conn) and "quarantine_detail" in trigger_sql(conn)
            command.downgrade(cfg, "0007")
            assert trigger_sql(conn) == old
            command.upgrade(cfg, "head")
            assert " WHEN " in trigger_sql(conn)
            conn.commit()
    finally:
        eng.dispose()


def test_kept_candidates_follow_labels_ceilings_and_devices(
    store: Store, make: Factory, raw: Raw
) -> None:
    a0, a1 = make.worker("a", devices=2)
    store.devices.apply_facts("a", ["gpu0", "gpu1"], {"gpu0": {"vram": "80G"}}, None, None, None)
    blocker = make.start(device=a0)
    make.submit()  # any device: placed on a1
    make.submit(selector="vram>=40G", max_runtime_seconds=30)  # waits for a0
    store.queue.run_pass()
    _assert_current(store)
    with store.read() as db:
        kept = dict(store.fleet.index(db)[1].matches)
    assert kept == {("", 0): [a0, a1], ("vram>=40G", 30): [a0]}
    store_helpers.release(store, blocker.id, "succeeded", 0)  # a state change only: the lists stay
    with store.read() as db:
        index = store.fleet.index(db)[1]
        assert index.matches[("", 0)] is kept[("", 0)]
    for change in (
        lambda: store.devices.apply_facts(
            "a", ["gpu1"], {"gpu1": {"vram": "80G"}}, None, None, None
        ),
        lambda: store.devices.register("a", "boot-1", [("gpu0", 20), ("gpu1", 0)]),
        lambda: make.worker("b", devices=1),
        lambda: store.devices.retire("b:gpu0"),
    ):
        make.submit(selector="vram>=40G", max_runtime_seconds=30)
        make.submit()
        store.queue.run_pass()  # fills the lists again
        for job in store.views.active():
            store_helpers.release(store, job.id, "succeeded", 0)
        change()
        _assert_current(store)
