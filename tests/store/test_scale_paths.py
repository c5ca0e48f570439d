"""What keeps a large fleet cheap: a pass on an empty queue reads no device, a routine
heartbeat says it changed nothing (so it kicks no pass), and a worker's devices are
found through an index rather than a scan of the fleet.

Time only moves through the injected ``FakeClock``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resource_controller.clock import FakeClock
from resource_controller.core import states
from resource_controller.core.expiry import GRACE, SweepRules
from resource_controller.store import queries, sql
from resource_controller.store.facade import Store
from resource_controller.store.records import Assigned, JobRecord
from support import store_helpers

from .dbview import Raw, state_of, wid

if TYPE_CHECKING:
    from conftest import Factory


def test_a_routine_heartbeat_moves_no_device(store: Store, make: Factory) -> None:
    make.worker()
    assert store.reports.heartbeat(wid(), []) is False
    job = make.start()
    assert store.reports.heartbeat(wid(), [job.id]) is False


def test_a_heartbeat_after_silence_reports_the_devices_it_moved(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    [dev, _] = make.worker()
    clock.advance(GRACE + 1)
    assert store.devices.sweep(SweepRules(hold_off_until=None)).devices_unknown
    assert state_of(store, dev)[0] == "unknown"
    assert store.reports.heartbeat(wid(), []) is True
    assert state_of(store, dev)[0] == "ready"
    assert store.reports.heartbeat(wid(), []) is False


def test_an_unknown_worker_heartbeat_moves_nothing(store: Store, make: Factory) -> None:
    make.worker()
    assert store.reports.heartbeat(wid("nobody"), []) is False


def test_a_pass_on_an_empty_queue_clears_reservations_left_behind(
    store: Store, make: Factory, raw: Raw
) -> None:
    [dev, _] = make.worker()
    make.start(device=dev)  # dev is busy
    waiting = make.submit(device=dev)
    assert store.queue.run_pass().assigned == []
    assert [r["job_id"] for r in raw.rows("SELECT job_id FROM reservations")] == [waiting.id]
    # Stop the queue's only job behind the store's back, as a crash between the cancel
    # and the next pass would leave it: the row outlives its job.
    raw.write("UPDATE jobs SET state = 'killed' WHERE id = ?", waiting.id)
    assert store.queue.run_pass().assigned == []
    assert raw.rows("SELECT * FROM reservations") == []


def test_a_pass_on_an_empty_queue_places_nothing_and_a_queued_job_is_still_placed(
    store: Store, make: Factory
) -> None:
    [dev, _] = make.worker()
    assert store.queue.run_pass().assigned == []
    job = make.submit(device=dev)
    assert [a.job_id for a in store.queue.run_pass().assigned] == [job.id]
    assert store.views.job(job.id).state == states.JobState.ASSIGNED


@pytest.mark.sqlite_only
def test_a_workers_devices_are_found_through_an_index(
    store: Store, make: Factory, raw: Raw
) -> None:
    make.worker()
    names = {r["name"] for r in raw.rows("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "devices_worker" in names
    plan = raw.rows(
        "EXPLAIN QUERY PLAN UPDATE devices SET last_heartbeat_at = 1 WHERE worker_id = ?", wid()
    )
    details = " ".join(r["detail"] for r in plan)
    assert "devices_worker" in details and "SCAN devices" not in details, details


def test_records_read_by_position_equal_records_read_by_name(store: Store, make: Factory) -> None:
    """``queries`` builds job and device records from their columns in field order; every
    field must land where a read by column name puts it."""
    from resource_controller.store import queries

    devs = make.worker(devices=3)
    make.start(device=devs[0])
    make.submit(selector="", env={"A": "1"}, priority=2, max_runtime_seconds=60, reason="why")
    make.submit(count=2)
    make.submit(device_ids=(devs[1], devs[2]))
    by_name = store_helpers.jobs_by_name(store)
    devices_by_name = store_helpers.devices_by_name(store)
    with store.tx() as c:
        by_position = queries.jobs_where(c, order="jobs.seq ASC")
        devices_by_position = queries.all_devices(c)
    assert len(by_name) == 4 and by_position == by_name
    assert {len(j.device_ids) for j in by_name} == {0, 2}
    assert devices_by_position == devices_by_name and len(devices_by_name) == 3


def test_a_pass_decodes_only_the_jobs_it_places(
    store: Store, make: Factory, raw: Raw, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long pinned queue on a busy fleet is walked on its scheduling columns: the
    command and environment of a job are decoded only when one of its choices is tried."""
    [busy, free] = make.worker()
    make.start(device=busy)
    waiting = [make.submit(device=busy, env={"N": str(i)}) for i in range(20)]
    placed = make.submit(device=free)
    decoded: list[str] = []
    real = queries.job_record

    def counted(row: Any, *rest: Any) -> JobRecord:
        decoded.append(row[0])
        return real(row, *rest)

    monkeypatch.setattr(queries, "job_record", counted)
    assert store.queue.run_pass().assigned == [Assigned(placed.id, wid())]
    assert decoded == [placed.id]
    # The head of the pinned queue still holds its device's reservation (STORE-062).
    rows = raw.rows("SELECT job_id, device_id FROM reservations")
    assert [(r["job_id"], r["device_id"]) for r in rows] == [(waiting[0].id, busy)]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    selector=st.sampled_from(["", "vram>=40G"]),
    pins=st.sampled_from(["", "box:gpu0", "box:gpu0,box:gpu1"]),
    count=st.integers(1, 2),
    priority=st.integers(-3, 3),
    runtime=st.integers(0, 900),
)
def test_the_pass_reads_a_row_as_the_record_does(
    store: Store, selector: str, pins: str, count: int, priority: int, runtime: int
) -> None:
    """``queries.snap`` builds from the raw row the snapshot ``JobRecord.snap`` would."""
    record = JobRecord(
        id="j1",
        seq=7,
        selector=selector if not pins else "",
        command=["x"],
        cwd="/",
        env={"A": "1"},
        submitter="alice",
        idempotency_key=None,
        state="queued",
        device_id=pins.split(",")[0],
        worker_id="",
        exit_code=None,
        kill_reason="",
        submitted_at=5,
        started_at=None,
        finished_at=None,
        priority=priority,
        max_runtime_seconds=runtime,
        idle_timeout=0,
        queued_at=6,
        kill_requested=0,
        kill_delivered_at=0,
        kind="job",
        reason="",
        stdio="",
        device_count=count,
        device_ids=tuple(pins.split(",")) if "," in pins else (),
    )
    columns = record.columns()
    plain = int(bool(record.device_id) and not selector and not pins.count(",") and count == 1)
    computed = {queries.PLAIN_PIN: plain, queries.SHARE: record.share}  # EXT-SHARE-1
    row = [
        computed[c] if c in computed else columns[c.removeprefix("jobs.")]
        for c in queries.QUEUE_COLS
    ]
    assert queries.snap(queries.queue_row(row)) == record.snap()


def test_the_plain_sql_reads_equal_the_records_read_by_name(store: Store, make: Factory) -> None:
    """The whole-fleet reads (``fast``: devices, active jobs; ``views.devices``) build
    records with ``_make`` from columns in field order: each equals the record
    built by column name, and the state view's devices, which take each
    holder's command from the active jobs, equal the devices read on their own."""

    from resource_controller.store import views

    devs = make.worker(devices=4)
    make.start(device=devs[0], env={"A": "1"})
    make.start(device=devs[1], command=("sh", "-c", "é"))
    make.submit(device=devs[0])
    by_name = {j.id: j for j in store_helpers.jobs_by_name(store)}
    devices_by_name = store_helpers.devices_by_name(store)
    with store.tx() as c:
        assert queries.all_devices(c) == devices_by_name
        active = views._active(c)
        alone = views.device_snapshots(c)
        with_commands = views.device_snapshots(c, commands={j.id: j.command for j in active})
    assert [j.id for j in active] == sorted(
        (j.id for j in by_name.values() if j.state in states.ACTIVE),
        key=lambda i: (by_name[i].submitted_at, by_name[i].seq),
        reverse=True,
    )
    assert len(active) == 2
    for j in active:  # active jobs carry their lease epoch (EXT-EPOCH-2)
        assert j.lease_epoch > 0
        assert j == by_name[j.id]._replace(lease_epoch=j.lease_epoch)
    assert with_commands == alone
    assert [s.command for s in alone if s.lease] == [["train"], ["sh", "-c", "é"]]
    assert [s.device for s in alone] == devices_by_name


def test_a_record_built_from_a_row_is_the_record_built_by_name_and_a_short_row_is_refused() -> None:
    from resource_controller.store.records import LeaseRecord

    row = ("l1", "box:gpu0", "alice", "j1", 10, 20, None, "job", "", 3)
    built = LeaseRecord._make(row)
    assert built == LeaseRecord(*row) and hash(built) == hash(LeaseRecord(*row))
    assert built.epoch == 3 and built.released_at is None
    with pytest.raises(TypeError):
        LeaseRecord._make(row[:-1])  # a short row is an error, never a half record


def _reservation_rows(raw: Raw) -> dict[str, str]:
    return {r["device_id"]: r["job_id"] for r in raw.rows("SELECT * FROM reservations")}


def _each_device_busy_and_reserved(store: Store, make: Factory, raw: Raw, n: int) -> dict[str, str]:
    """``n`` devices, each running a job and reserved by one pinned to it: device -> the
    waiting job, as a pass wrote the reservation rows."""
    devs = make.worker(devices=n)
    for dev in devs:
        make.start(device=dev)
    waiting = {dev: make.submit(device=dev).id for dev in devs}
    store.queue.run_pass()
    assert _reservation_rows(raw) == waiting
    return waiting


@pytest.mark.sqlite_only
def test_a_pass_with_nothing_changed_reads_no_reservation_row(
    store: Store, make: Factory, raw: Raw
) -> None:
    waiting = _each_device_busy_and_reserved(store, make, raw, 3)
    statements: list[str] = []
    store.db.driver.set_trace_callback(statements.append)
    try:
        assert store.queue.run_pass().assigned == []
    finally:
        store.db.driver.set_trace_callback(None)
    reads = [s for s in statements if "FROM reservations" in s and "count(*)" not in s]
    assert reads == [] and any("count(*) FROM reservations" in s for s in statements)
    assert _reservation_rows(raw) == waiting


def test_the_kept_reservations_see_every_writer(store: Store, make: Factory, raw: Raw) -> None:
    d0, d1, d2 = make.worker(devices=3)
    holders = {d: make.start(device=d) for d in (d0, d1, d2)}
    first = {d: make.submit(device=d).id for d in (d0, d1, d2)}
    store.queue.run_pass()
    assert _reservation_rows(raw) == first
    # Another connection swaps a row for one of its own (the count stays): the pass
    # sees the file changed, reads the rows, and puts back what it plans.
    raw.write("UPDATE reservations SET job_id = 'stranger' WHERE device_id = ?", d1)
    store.queue.run_pass()
    assert _reservation_rows(raw) == first
    # An in-process delete (the job cancelled): the next job for d2 reserves it.
    store.queue.cancel(first[d2], "done")
    second = make.submit(device=d2).id
    store.queue.run_pass()
    assert _reservation_rows(raw) == {d0: first[d0], d1: first[d1], d2: second}
    # An assignment deletes its device's row; the pass after it leaves the rest.
    store_helpers.release(store, holders[d0].id, "succeeded", 0)
    placed = {a.job_id for a in store.queue.run_pass().assigned}
    assert placed == {first[d0]}
    assert _reservation_rows(raw) == {d1: first[d1], d2: second}
    store.queue.run_pass()
    assert _reservation_rows(raw) == {d1: first[d1], d2: second}
    # A row deleted through the store's own connection (no writer does that to a row
    # whose job still waits, but nothing else tells the pass): the count does.
    with store.tx() as db:
        db.execute("DELETE FROM reservations WHERE device_id = ?", (d1,))
    store.queue.run_pass()
    assert _reservation_rows(raw) == {d1: first[d1], d2: second}


def test_a_pass_writes_only_the_reservation_rows_that_changed(
    store: Store, make: Factory, raw: Raw, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each statement is a round trip to a database server: a pass that moves one
    reservation writes that row in one statement, not every row again."""
    first = _each_device_busy_and_reserved(store, make, raw, 4)
    devs = list(first)
    store.queue.cancel(first[devs[1]], "done")  # deletes its row
    second = make.submit(device=devs[1]).id
    statements: list[str] = []
    monkeypatch.setattr(sql, "watchers", [lambda text, move: statements.append(text)])
    assert store.queue.run_pass().assigned == []
    writes = [s for s in statements if "reservations" in s and not s.startswith("SELECT")]
    assert len(writes) == 1 and writes[0].startswith("INSERT")
    assert _reservation_rows(raw) == {**first, devs[1]: second}
    # Two rows go (their jobs cancelled, none waits behind them): one statement.
    for dev in devs[2:]:
        store.queue.cancel(first[dev], "done")
    statements.clear()
    store.queue.run_pass()
    assert _reservation_rows(raw) == {devs[0]: first[devs[0]], devs[1]: second}
    assert not [s for s in statements if "reservations" in s and not s.startswith("SELECT")]
