"""Storage (store.md §1, §2.9): the database the controller opens by default, how it is
opened, the indexes that carry rules, and scheduling passes one at a time."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

from resource_controller.cli import serve as serve_cli
from resource_controller.clock import FakeClock
from resource_controller.controller import serve
from resource_controller.controller.deps import Settings
from resource_controller.store import passes, sql
from resource_controller.store.facade import Store
from support import store_helpers

from .dbview import Raw

if TYPE_CHECKING:
    from conftest import Factory


def _pragmas(store: Store) -> tuple[str, int]:
    """The journal mode and busy timeout of the store's own connection."""
    driver = store.db.driver
    mode = driver.execute("PRAGMA journal_mode").fetchone()[0]
    timeout = driver.execute("PRAGMA busy_timeout").fetchone()[0]
    return str(mode), int(timeout)


@pytest.mark.sqlite_only
def test_sqlite_is_opened_in_wal_mode_with_a_five_second_busy_timeout(store: Store) -> None:
    # STORE-001
    assert _pragmas(store) == ("wal", 5000)


def test_the_controller_keeps_its_state_in_rc_db_inside_its_data_directory(
    tmp_path: Path,
) -> None:
    # STORE-001: `rc serve --data` defaults to /var/lib/rc; without --database the store
    # is the SQLite file rc.db in it, in WAL mode with a 5000 ms busy timeout.
    ctx = serve_cli.serve.make_context("serve", [])
    assert ctx.params["data"] == Path("/var/lib/rc")
    svc = serve.open_services(tmp_path / "data", "wtok:worker", Settings(), FakeClock())
    try:
        assert svc.store.database.target == tmp_path / "data" / "rc.db"
        assert (tmp_path / "data" / "rc.db").is_file()
        assert _pragmas(svc.store) == ("wal", 5000)
    finally:
        svc.executor.shutdown(wait=True)
        svc.store.close()


# ======================================================================================
# STORE-003 passes one at a time
# ======================================================================================


class _Overlap:
    """Wraps the pass function the store runs and records how many ran at once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.inside = 0
        self.most = 0
        self.calls = 0
        self._guard = threading.Lock()
        real = passes.schedule_pass

        def counted(*args: Any, **kw: Any) -> Any:
            with self._guard:
                self.inside += 1
                self.calls += 1
                self.most = max(self.most, self.inside)
            try:
                time.sleep(0.05)  # a pass that takes a while: room for another to overlap
                return real(*args, **kw)
            finally:
                with self._guard:
                    self.inside -= 1

        monkeypatch.setattr(passes, "schedule_pass", counted)


def _run_together(calls: list[Callable[[], object]]) -> None:
    """Each call on a thread of its own, all released at once; every one must return."""
    start = threading.Barrier(len(calls))
    failures: list[BaseException] = []

    def run(call: Callable[[], object]) -> None:
        try:
            start.wait(10)
            call()
        except BaseException as exc:  # the test's verdict, not a crash of the thread
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert failures == []


def test_scheduling_passes_of_one_store_never_overlap(
    store: Store, make: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # STORE-003: a submit's pass and the scheduler loop's pass run one at a time.
    make.worker(devices=2)
    for _ in range(6):
        make.submit()
    overlap = _Overlap(monkeypatch)
    _run_together([store.queue.run_pass] * 4)
    assert (overlap.calls, overlap.most) == (4, 1)
    assert len(store_helpers.live_leases(store)) == 2


def test_scheduling_passes_of_two_stores_on_one_database_never_overlap(
    store: Store,
    other_store: Store,
    make: Factory,
    backend: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # STORE-003, EXT-PG-2: two controllers on one PostgreSQL database take turns too.
    if backend != "postgresql":
        pytest.skip("several controllers share a PostgreSQL database")
    make.worker(devices=2)
    for _ in range(6):
        make.submit()
    overlap = _Overlap(monkeypatch)
    _run_together([store.queue.run_pass, other_store.queue.run_pass] * 2)
    assert (overlap.calls, overlap.most) == (4, 1)
    assert len(store_helpers.live_leases(store)) == 2


# ======================================================================================
# STORE-010, STORE-011, STORE-012 indexes
# ======================================================================================


class Index(NamedTuple):
    unique: bool
    table: str
    columns: tuple[str, ...]
    where: str


_CREATE = re.compile(
    r"CREATE (UNIQUE )?INDEX \w+ ON (?:\w+\.)?(\w+)(?: USING \w+)? \((.*?)\)(?: WHERE (.*))?$"
)


def _indexes(raw: Raw) -> dict[str, Index]:
    """The database's own indexes, by name, read from its catalog: each index's
    definition as SQLite stored it or as PostgreSQL prints it, in one shape."""
    if raw.postgres:
        rows = raw.rows(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
        )
    else:
        rows = raw.rows("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql != ''")
    found = {}
    for name, text in rows:
        m = _CREATE.match(text)
        assert m is not None, text
        unique, table, columns, where = m.groups()
        where = (where or "").strip()
        if where.startswith("(") and where.endswith(")"):
            where = where[1:-1]
        found[name] = Index(bool(unique), table, tuple(columns.split(", ")), where)
    return found


def test_the_indexes_that_carry_rules_are_in_the_database(store: Store, raw: Raw) -> None:
    # STORE-010, STORE-011: the partial unique indexes, by the names the spec gives.
    # STORE-012: unique reservations(device_id), the queue's jobs(state, priority DESC,
    # queued_at) (the FIFO tie-break may follow), device_labels(device_id) and
    # device_recoveries(device_id, at).
    found = _indexes(raw)
    assert found["leases_one_live_per_device"] == Index(
        True, "leases", ("device_id",), "released_at IS NULL"
    )
    assert found["jobs_idempotency"] == Index(
        True, "jobs", ("idempotency_key",), "idempotency_key IS NOT NULL"
    )
    shapes = set(found.values())
    assert Index(True, "reservations", ("device_id",), "") in shapes
    assert any(
        i.table == "jobs"
        and i.columns[:3] == ("state", "priority DESC", "queued_at")
        and not i.where
        for i in shapes
    )
    assert any(i[1:] == ("device_labels", ("device_id",), "") for i in shapes)
    assert any(i[1:] == ("device_recoveries", ("device_id", "at"), "") for i in shapes)


def test_the_database_refuses_a_second_job_with_the_same_idempotency_key(
    store: Store, make: Factory, raw: Raw
) -> None:
    # STORE-011: whatever enqueue's own lookup does, the index refuses the second row;
    # jobs without a key (NULL) are not limited.
    make.worker(devices=1)
    keyed = make.submit(idempotency_key="once")
    plain = make.submit()
    assert raw.rows("SELECT idempotency_key FROM jobs WHERE id = ?", plain.id)[0][0] is None

    def copy(job_id: str) -> None:
        """Insert a copy of the job's row under a new ID and seq, in one transaction."""
        (row,) = raw.rows("SELECT * FROM jobs WHERE id = ?", job_id)
        values = dict(zip(row.keys(), row, strict=True))
        values["id"] = f"copy-{len(raw.rows('SELECT id FROM jobs'))}"
        values["seq"] = raw.rows("SELECT max(seq) FROM jobs")[0][0] + 1
        cols = ", ".join(values)
        marks = ", ".join("?" * len(values))
        raw.write(f"INSERT INTO jobs ({cols}) VALUES ({marks})", *values.values())

    with pytest.raises(Exception) as refused:
        copy(keyed.id)
    assert sql.row_error(refused.value), refused.value  # a broken constraint, not an outage
    assert "idempotency" in str(refused.value)
    copy(plain.id)
    copy(plain.id)
    assert raw.count("jobs") == 4
    assert len(raw.rows("SELECT id FROM jobs WHERE idempotency_key = 'once'")) == 1
