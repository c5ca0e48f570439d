"""Migration 0012: the runtime columns gain their unit, up and down, on either backend."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from resource_controller.clock import FakeClock
from resource_controller.store import engine
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob
from support import store_helpers

DEVICE = "box:gpu0"


def _runtime_columns(conn: sa.Connection) -> set[str]:
    """The runtime column names of ``jobs`` and ``devices``, which must agree."""
    inspector = sa.inspect(conn)
    return {
        c["name"]
        for table in ("jobs", "devices")
        for c in inspector.get_columns(table)
        if c["name"].startswith("max_runtime")
    }


def _noted_at(conn: sa.Connection) -> int:
    """The version the device-change triggers last noted the device at."""
    sql = sa.text("SELECT version FROM device_changes WHERE device_id = :d")
    return int(conn.execute(sql, {"d": DEVICE}).scalar_one())


def _ceiling_change_is_noted(conn: sa.Connection, column: str, value: int) -> bool:
    before = _noted_at(conn)
    conn.execute(
        sa.text(f"UPDATE devices SET {column} = :v WHERE id = :d"), {"v": value, "d": DEVICE}
    )
    return _noted_at(conn) > before


def test_migration_0012_renames_the_runtime_columns_down_and_up(database: Path | str) -> None:
    from alembic import command

    store = Store(database, FakeClock())
    store.devices.register("box", "b", [("gpu0", 600)])
    job = store.queue.enqueue(NewJob(["x"], "alice", device_id=DEVICE, max_runtime_seconds=60))
    store.close()
    eng = engine.create_engine(database)
    try:
        with eng.begin() as conn:
            command.downgrade(engine._alembic_config(conn), "0011")
        with eng.begin() as conn:
            assert _runtime_columns(conn) == {"max_runtime"}
            assert conn.execute(sa.text("SELECT max_runtime FROM jobs")).scalar_one() == 60
            assert _ceiling_change_is_noted(conn, "max_runtime", 300)
        with eng.begin() as conn:
            command.upgrade(engine._alembic_config(conn), "head")
        with eng.begin() as conn:
            assert _runtime_columns(conn) == {"max_runtime_seconds"}
            assert _ceiling_change_is_noted(conn, "max_runtime_seconds", 30)
    finally:
        eng.dispose()
    store = Store(database, FakeClock())
    try:
        assert store.views.job(job.id).max_runtime_seconds == 60
        assert store_helpers.device(store, DEVICE).max_runtime_seconds == 30  # type: ignore[union-attr]
        # The share triggers on ``jobs`` (migration 0010) survived both renames.
        store_helpers.allocate_directly(store, "box:gpu0", "bob")
        assert store.views.held_by_share() == {"bob": 1}
    finally:
        store.close()
