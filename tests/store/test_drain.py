"""Draining devices in the store (EXT-DRAIN-2): a flag beside the state, never assigned
or reserved, still there for pinned submits and selectors."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import sqlalchemy as sa
from alembic import command

from resource_controller import errors
from resource_controller.clock import FakeClock
from resource_controller.store import engine
from resource_controller.store.facade import Store
from support import store_helpers

from .dbview import Raw

if TYPE_CHECKING:
    from conftest import Factory


def test_drain_records_who_when_and_why_and_draining_again_replaces_them(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # EXT-DRAIN-3a: "Draining again replaces who, when and reason."
    d0, _ = make.worker()
    store.devices.drain(d0, "ops", "driver upgrade")
    first = store_helpers.device(store, d0)
    assert first is not None
    assert (first.draining, first.drained_by, first.drain_reason) == (1, "ops", "driver upgrade")
    assert first.drained_at == store.now()
    assert first.state == "ready"  # a flag beside the state, not a state
    clock.advance(60)
    store.devices.drain(d0, "bob", "")
    again = store_helpers.device(store, d0)
    assert again is not None
    assert (again.drained_by, again.drain_reason, again.drained_at) == ("bob", "", store.now())


def test_undrain_clears_the_flag_and_leaves_a_device_not_draining_alone(
    store: Store, make: Factory
) -> None:
    d0, d1 = make.worker()
    store.devices.drain(d0, "ops", "upgrade")
    store.devices.undrain(d0)
    store.devices.undrain(d1)  # not draining: changes nothing
    for d in (d0, d1):
        rec = store_helpers.device(store, d)
        assert rec is not None
        assert (rec.draining, rec.drained_by, rec.drained_at, rec.drain_reason) == (0, "", 0, "")


def test_unknown_devices_are_not_found(store: Store, make: Factory) -> None:
    make.worker()
    with pytest.raises(errors.DeviceNotFound):
        store.devices.drain("box:gpu9", "ops", "")
    with pytest.raises(errors.DeviceNotFound):
        store.devices.undrain("box:gpu9")


def test_a_draining_device_is_never_assigned_but_a_pinned_job_queues_for_it(
    store: Store, make: Factory
) -> None:
    # EXT-DRAIN-2: "a draining device still counts as existing for ... pinned submits
    # (a job may queue for it), but is never assigned".
    d0, _ = make.worker()
    store.devices.drain(d0, "ops", "")
    pinned = make.submit(device=d0)
    assert store.queue.run_pass().assigned == []
    assert store.views.job(pinned.id).state == "queued"
    store.devices.undrain(d0)
    assert [a.job_id for a in store.queue.run_pass().assigned] == [pinned.id]


def test_selector_and_any_device_jobs_go_around_a_draining_device(
    store: Store, make: Factory
) -> None:
    d0, d1 = make.worker()
    store.devices.drain(d0, "ops", "")
    anyone = make.submit()
    store.queue.run_pass()
    assert store.views.job(anyone.id).device_id == d1
    # With d1 busy and d0 draining, the next waits and reserves only d1 (never d0).
    waiting = make.submit()
    assert store.queue.run_pass().assigned == []
    assert store.views.job(waiting.id).state == "queued"
    assert [
        b.device_id for b in store.queue.waiting_for(store.views.job(waiting.id)) if b.draining
    ] == [d0]


def test_a_draining_device_is_never_reserved(store: Store, make: Factory, raw: Raw) -> None:
    # EXT-DRAIN-2 "never ... reserved": a pinned job ahead claims nothing on it, and an
    # existing reservation row on it goes with the drain.
    (d0,) = make.worker(devices=1)
    make.start(device=d0)
    queued = make.submit(device=d0)
    store.queue.run_pass()
    assert {(r["job_id"], r["device_id"]) for r in raw.rows("SELECT * FROM reservations")} == {
        (queued.id, d0)
    }
    store.devices.drain(d0, "ops", "")
    assert raw.rows("SELECT * FROM reservations") == []
    store.queue.run_pass()
    assert raw.rows("SELECT * FROM reservations") == []


def test_waiting_for_names_the_draining_device(store: Store, make: Factory) -> None:
    # EXT-WHY-1: "or that the device is ... draining".
    (d0,) = make.worker(devices=1)
    store.devices.drain(d0, "ops", "")
    job = make.submit(device=d0)
    store.queue.run_pass()
    (blocker,) = store.queue.waiting_for(store.views.job(job.id))
    assert blocker.device_id == d0
    assert blocker.draining


def test_explain_leaves_draining_devices_out_of_free(store: Store, make: Factory) -> None:
    # EXT-DRAIN-3a: "The explain route's free leaves draining devices out."
    d0, d1 = make.worker()
    store.devices.apply_facts(
        "box", ["gpu0", "gpu1"], {"gpu0": {"k": "a"}, "gpu1": {"k": "a"}}, None, None, None
    )
    store.devices.drain(d0, "ops", "")
    ex = store.views.explain("k=a")
    assert ex.matching == [d0, d1]  # still there for selectors (EXT-DRAIN-2)
    assert ex.free == [d1]


def test_a_database_from_before_draining_gains_the_columns(
    tmp_path: Path, clock: FakeClock
) -> None:
    # STORE-006: opening migrates to head; every existing device reads as not draining.
    path = tmp_path / "old.db"
    eng = engine.create_engine(path)
    try:
        with eng.connect() as conn:
            command.upgrade(engine._alembic_config(conn), "0001")
            conn.commit()
    finally:
        eng.dispose()
    conn3 = sqlite3.connect(path)
    with conn3:
        conn3.execute(
            "INSERT INTO devices (id, host, name, worker_id, state, last_heartbeat_at)"
            " VALUES ('box:gpu0', 'box', 'gpu0', 'w', 'ready', 0)"
        )
    conn3.close()
    store = Store(path, clock)
    try:
        rec = store_helpers.device(store, "box:gpu0")
        assert rec is not None
        assert (rec.draining, rec.drained_by, rec.drained_at, rec.drain_reason) == (0, "", 0, "")
        store.devices.drain("box:gpu0", "ops", "r")
        assert store_helpers.device(store, "box:gpu0").draining == 1  # type: ignore[union-attr]
    finally:
        store.close()


def test_the_migrations_create_exactly_the_declared_schema(
    tmp_path: Path, clock: FakeClock
) -> None:
    # The Alembic revisions and ``store/schema.py`` name the same tables, columns and indexes.
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from resource_controller.store import schema

    Store(tmp_path / "rc.db", clock).close()
    eng = sa.create_engine(f"sqlite:///{tmp_path / 'rc.db'}")
    try:
        with eng.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), schema.metadata)
    finally:
        eng.dispose()
    assert diff == []
