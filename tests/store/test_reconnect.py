"""A store on PostgreSQL whose connection the server dropped (a restart, a network cut)
answers "unavailable" once, then opens a new connection and goes on; controllers that
start together on an old database migrate it once."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import psycopg
import pytest
from alembic.script import ScriptDirectory

from resource_controller import errors
from resource_controller.clock import FakeClock
from resource_controller.store import engine
from resource_controller.store.facade import Store
from support import pg

if TYPE_CHECKING:
    from conftest import Factory


def _drop_connection(store: Store) -> None:
    """End the store's server session from another connection, as a restart would,
    waiting (up to 5 s) until it has ended."""
    pid = store._db.driver.info.backend_pid
    with psycopg.connect(store.database_url or "", autocommit=True) as admin:
        row = admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()
    assert row is not None and row[0]


def test_a_dropped_connection_is_unavailable_once_then_opened_again(
    store: Store, make: Factory, backend: str
) -> None:
    if backend != "postgresql":
        pytest.skip("a PostgreSQL server session")
    make.worker(devices=1)
    job = make.submit()
    _drop_connection(store)
    with pytest.raises(errors.StoreUnavailable) as refused:
        store.job(job.id)
    assert refused.value.status == 503
    assert store.job(job.id).id == job.id  # a new connection
    _drop_connection(store)
    with pytest.raises(errors.StoreUnavailable):
        make.submit()  # a write fails whole: nothing half-done
    assert [j.id for j in store.list_jobs()] == [job.id]
    assert [a.job_id for a in store.schedule()] == [job.id]


def test_controllers_started_at_once_on_an_old_database_migrate_it_once(
    pg_cluster: pg.Cluster,
) -> None:
    # One takes the migration lock and migrates; the others wait, then find it done.
    name = "rc_empty_" + uuid.uuid4().hex[:8]
    pg_cluster.psql(f"CREATE DATABASE {name}")
    url = pg_cluster.url(name)
    with ThreadPoolExecutor(3) as pool:
        stores = list(pool.map(lambda _: Store(url, FakeClock()), range(3)))
    try:
        with psycopg.connect(url) as conn:
            (version,) = conn.execute("SELECT version_num FROM alembic_version").fetchall()
        assert version[0] == ScriptDirectory(str(engine.MIGRATIONS)).get_current_head()
        for store in stores:
            assert store.list_jobs() == []
    finally:
        for store in stores:
            store.close()
