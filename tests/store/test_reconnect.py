"""A store on PostgreSQL whose connection the server dropped (a restart, an
administrator, an idle limit) opens a new one before the next operation, so that
operation never sees the dead one; one that loses it midway runs once more, unless it
lost it at its commit. Controllers that start together on an old database migrate it
once."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from alembic.script import ScriptDirectory

from resource_controller import errors
from resource_controller.clock import FakeClock
from resource_controller.store import engine, sql
from resource_controller.store.facade import Store
from resource_controller.store.logrows import DatabaseLogStore
from support import pg

if TYPE_CHECKING:
    from conftest import Factory


@pytest.fixture
def postgres(backend: str) -> None:
    if backend != "postgresql":
        pytest.skip("a PostgreSQL server session")


def _drop_connection(store: Store) -> None:
    """End the store's server session from another connection, as a restart would,
    waiting (up to 5 s) until it has ended."""
    pid = store.db.driver.info.backend_pid
    with psycopg.connect(store.database_url or "", autocommit=True) as admin:
        row = admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()
    assert row is not None and row[0]


@pytest.fixture
def inserts(store: Store) -> Iterator[list[str]]:
    """Each ``INSERT INTO jobs`` the store runs, noted as it is sent."""
    seen: list[str] = []

    def watch(text: str, move: str) -> None:
        if text.startswith("INSERT INTO jobs "):
            seen.append(text)

    sql.watchers.append(watch)
    try:
        yield seen
    finally:
        sql.watchers.remove(watch)


def test_after_a_server_restart_the_next_read_and_the_next_write_succeed(
    store: Store, make: Factory, pg_cluster: pg.Cluster, postgres: None
) -> None:
    make.worker(devices=1)
    job = make.submit()
    pg_cluster.restart()
    assert store.views.job(job.id).id == job.id  # the read after the restart
    pg_cluster.restart()
    second = make.submit()  # the write after the restart
    assert {j.id for j in store.views.list_jobs()} == {second.id, job.id}
    assert [a.job_id for a in store.queue.run_pass().assigned] == [job.id]


def test_a_dropped_connection_is_replaced_before_the_next_operation(
    store: Store, make: Factory, postgres: None
) -> None:
    make.worker(devices=1)
    job = make.submit()
    _drop_connection(store)
    assert store.views.job(job.id).id == job.id
    _drop_connection(store)
    second = make.submit()
    assert {j.id for j in store.views.list_jobs()} == {second.id, job.id}


def test_an_operation_whose_connection_drops_before_its_commit_runs_once_more(
    store: Store, make: Factory, inserts: list[str], postgres: None
) -> None:
    make.worker(devices=1)
    dropped: list[int] = []

    def drop_once(text: str, move: str) -> None:
        if text.startswith("INSERT INTO jobs ") and not dropped:
            dropped.append(1)
            _drop_connection(store)  # the insert is then sent on a dead connection

    sql.watchers.append(drop_once)
    try:
        job = make.submit()
    finally:
        sql.watchers.remove(drop_once)
    assert len(inserts) == 2  # the first went with the connection, unwritten
    assert [j.id for j in store.views.list_jobs()] == [job.id]


def test_the_pass_after_a_submit_runs_again_whole_when_its_connection_drops_midway(
    store: Store, make: Factory, postgres: None
) -> None:
    make.worker(devices=1)
    job = make.submit()  # no pass yet: the one after it is the test's
    dropped: list[int] = []

    def drop_once(text: str, move: str) -> None:
        if text.startswith("INSERT INTO leases ") and not dropped:
            dropped.append(1)
            _drop_connection(store)  # mid-pass, under the pass's lock

    sql.watchers.append(drop_once)
    try:
        placed = store.queue.schedule_after(job)
    finally:
        sql.watchers.remove(drop_once)
    assert dropped and [a.job_id for a in placed.assigned] == [job.id]
    assert store.views.job(job.id).state == "assigned"


def test_a_connection_dropped_at_the_commit_is_unavailable_and_not_run_again(
    store: Store, make: Factory, inserts: list[str], postgres: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    make.worker(devices=1)
    commit = sql.Db.commit

    def dropping(db: sql.Db) -> None:
        _drop_connection(store)
        commit(db)

    monkeypatch.setattr(sql.Db, "commit", dropping)
    with pytest.raises(errors.StoreUnavailable) as failed:
        make.submit()
    assert not isinstance(failed.value, errors.ConnectionDropped)
    assert failed.value.code == "store_error"
    assert len(inserts) == 1  # whether it committed is unknown: never run twice
    monkeypatch.undo()
    assert store.views.list_jobs() == []  # (here it had not: the server never saw the COMMIT)


def _whole(logs: DatabaseLogStore, job_id: str) -> bytes:
    snap = logs.snapshot(job_id)
    try:
        return b"".join(iter(snap.read, b""))
    finally:
        snap.close()


def test_after_a_server_restart_the_next_log_read_and_append_succeed(
    database: str, store: Store, pg_cluster: pg.Cluster, postgres: None
) -> None:
    logs = DatabaseLogStore(database)  # job output on PostgreSQL (EXT-PG-4)
    try:
        logs.append("j1", b"before\n")
        pg_cluster.restart()
        assert _whole(logs, "j1") == b"before\n"
        pg_cluster.restart()
        logs.append("j1", b"after\n")
        assert _whole(logs, "j1") == b"before\nafter\n"
    finally:
        logs.close()


def test_an_idle_connection_is_found_dropped_without_a_statement(pg_cluster: pg.Cluster) -> None:
    conn: Any = engine.connect_postgres(pg_cluster.url())
    try:
        assert not engine.dropped(conn)
        with psycopg.connect(pg_cluster.url(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s, 5000)", (conn.info.backend_pid,))
        assert engine.dropped(conn)
    finally:
        conn.close()


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
            assert store.views.list_jobs() == []
    finally:
        for store in stores:
            store.close()
