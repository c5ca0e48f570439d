"""A fair share between people in the store (EXT-SHARE-1, EXT-SHARE-2), on SQLite and
PostgreSQL: the devices each name holds as the triggers keep them, limits in the pass,
and jobs that wait for other jobs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from resource_controller import errors
from resource_controller.clock import FakeClock
from resource_controller.core import waiting
from resource_controller.core.expiry import SweepRules
from resource_controller.core.share import SubmitterLimits
from resource_controller.store import engine
from resource_controller.store.facade import Store
from support import store_helpers

from .dbview import Raw

if TYPE_CHECKING:
    from conftest import Factory


def held_by_leases(raw: Raw) -> dict[str, int]:
    """The devices each name holds, counted afresh from the live leases: what
    ``share_held`` must always equal."""
    rows = raw.rows(
        "SELECT coalesce(nullif(jobs.share_name, ''), leases.holder) AS who, count(*) AS n"
        " FROM leases LEFT JOIN jobs ON jobs.id = leases.job_id"
        " WHERE leases.released_at IS NULL GROUP BY 1"
    )
    return {r["who"]: r["n"] for r in rows}


def finish(store: Store, job_id: str, state: str = "succeeded") -> None:
    store_helpers.release(store, job_id, state, 0 if state == "succeeded" else 1)


# ---- EXT-SHARE-1: devices held per name ----------------------------------------------------


def test_held_devices_follow_every_grant_and_release(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    devs = make.worker(devices=4)
    a = make.start(device=devs[0], submitter="alice")
    gang = make.submit(submitter="bob", count=2)
    hold = make.submit(submitter="alice", kind="hold", max_runtime_seconds=60, reason="r")
    store.queue.run_pass()
    assert store.views.held_by_share() == held_by_leases(raw) == {"alice": 2, "bob": 2}
    finish(store, a.id)
    assert store.views.held_by_share() == held_by_leases(raw) == {"alice": 1, "bob": 2}
    # A kill finalised at the controller releases the leases too (STORE-092).
    store.devices.set_state(store.views.job(gang.id).device_id, "unknown")
    store.queue.request_kill(gang.id, "killed by bob", finalize_disconnected=True)
    assert store.views.held_by_share() == held_by_leases(raw) == {"alice": 1}
    # A lease that expires (STORE-103) leaves the count.
    clock.advance(3600)
    store.devices.sweep(SweepRules(grace=10**9, unhealthy_after=10**9))
    assert store.views.job(hold.id).state == "lost"
    assert store.views.held_by_share() == held_by_leases(raw) == {}


def test_a_job_less_lease_counts_under_its_holder(store: Store, make: Factory, raw: Raw) -> None:
    devs = make.worker(devices=1)
    lease = raw.insert_jobless_lease(devs[0], 0, 99)
    assert store.views.held_by_share() == {"nobody": 1}
    raw.write("DELETE FROM leases WHERE id = ?", lease)
    assert store.views.held_by_share() == {}


# ---- EXT-SHARE-1: limits in the pass --------------------------------------------------------


def test_a_submitter_at_its_limit_queues_and_others_are_placed(
    store: Store, make: Factory, raw: Raw
) -> None:
    make.worker(devices=4)
    store.limits = SubmitterLimits(default=2)
    mine = [make.submit(submitter="alice") for _ in range(3)]
    theirs = make.submit(submitter="bob")
    placed = {a.job_id for a in store.queue.run_pass().assigned}
    assert placed == {mine[0].id, mine[1].id, theirs.id}
    assert store.views.job(mine[2].id).state == "queued"
    # It claims nothing: the fourth device stays free for anyone but alice.
    assert raw.rows("SELECT * FROM reservations") == []
    assert store.queue.waiting_for(store.views.job(mine[2].id)) == [
        waiting.Blocker(submitter_limit=2, submitter="alice")
    ]
    later = make.submit(submitter="carol")
    assert [a.job_id for a in store.queue.run_pass().assigned] == [later.id]
    finish(store, mine[0].id)
    assert [a.job_id for a in store.queue.run_pass().assigned] == [mine[2].id]


def test_a_pinned_job_at_its_limit_does_not_reserve_its_device(
    store: Store, make: Factory, raw: Raw
) -> None:
    devs = make.worker(devices=2)
    store.limits = SubmitterLimits(names={"alice": 1})
    make.start(device=devs[0], submitter="alice")
    blocked = make.submit(device=devs[1], submitter="alice")
    behind = make.submit(device=devs[1], submitter="bob")
    assert [a.job_id for a in store.queue.run_pass().assigned] == [behind.id]
    assert store.views.job(blocked.id).state == "queued"
    assert raw.rows("SELECT * FROM reservations") == []


def test_holds_and_gangs_count_each_device(store: Store, make: Factory) -> None:
    make.worker(devices=4)
    store.limits = SubmitterLimits(default=3)
    make.submit(submitter="alice", kind="hold", max_runtime_seconds=60, reason="profiling")
    gang = make.submit(submitter="alice", count=2)
    over = make.submit(submitter="alice", count=1)
    store.queue.run_pass()
    assert store.views.job(gang.id).state == "assigned"
    assert store.views.job(over.id).state == "queued"
    assert store.views.held_by_share() == {"alice": 3}


def test_raising_a_limit_places_the_job_at_the_next_pass(store: Store, make: Factory) -> None:
    make.worker(devices=2)
    store.limits = SubmitterLimits(default=1)
    first, second = make.submit(), make.submit()
    store.queue.run_pass()
    assert store.views.job(second.id).state == "queued"
    store.limits = SubmitterLimits(default=2)
    assert [a.job_id for a in store.queue.run_pass().assigned] == [second.id]
    assert store.views.job(first.id).state == "assigned"


def test_a_limit_counts_under_the_share_name(store: Store, make: Factory) -> None:
    # A named token's jobs count under its name, whatever suffix each records (EXT-WHO).
    make.worker(devices=3)
    store.limits = SubmitterLimits(names={"alice": 1})
    a1 = make.submit(submitter="alice@laptop", share_name="alice")
    a2 = make.submit(submitter="alice@server", share_name="alice")
    free = make.submit(submitter="alice@elsewhere")  # no token name: its own name
    placed = {a.job_id for a in store.queue.run_pass().assigned}
    assert placed == {a1.id, free.id} and store.views.job(a2.id).state == "queued"


# ---- EXT-SHARE-2: jobs that wait for jobs ----------------------------------------------------


def test_a_job_waits_until_every_named_job_succeeded(store: Store, make: Factory) -> None:
    devs = make.worker(devices=2)
    a = make.start(device=devs[0])
    b = make.start(device=devs[1], submitter="bob")  # another submitter's job: allowed
    c = make.submit(after=(a.id, b.id))
    assert store.views.job(c.id).after_open == 2
    assert store.queue.run_pass().assigned == []
    assert [w.after for w in store.queue.waiting_for(store.views.job(c.id))] == [a.id, b.id]
    finish(store, a.id)
    assert store.queue.run_pass().assigned == [] and store.views.job(c.id).state == "queued"
    assert [w.after for w in store.queue.waiting_for(store.views.job(c.id))] == [b.id]
    finish(store, b.id)
    assert [x.job_id for x in store.queue.run_pass().assigned] == [c.id]


def test_a_job_whose_dependency_fails_ends_killed_and_so_does_its_chain(
    store: Store, make: Factory
) -> None:
    devs = make.worker(devices=1)
    a = make.start(device=devs[0])
    b = make.submit(after=(a.id,))
    c = make.submit(after=(b.id,))
    anyway = make.submit(after=(b.id,), after_any=True)
    finish(store, a.id, "failed")
    done = store.queue.run_pass()
    assert set(done.ended) == {b.id, c.id}
    assert store.views.job(b.id).state == "killed"
    assert store.views.job(b.id).kill_reason == f"dependency_failed: {a.id}"
    assert store.views.job(c.id).kill_reason == f"dependency_failed: {b.id}"
    assert [x.job_id for x in done.assigned] == [anyway.id]  # any end will do


def test_a_cancelled_dependency_fails_the_job_behind_it(store: Store, make: Factory) -> None:
    devs = make.worker(devices=1)
    make.start(device=devs[0])
    a = make.submit(device=devs[0])  # queued behind the running one
    b = make.submit(after=(a.id,))
    assert store.queue.cancel(a.id, "killed by alice")
    assert store.queue.run_pass().ended == [b.id]
    assert store.views.job(b.id).kill_reason == f"dependency_failed: {a.id}"


def test_a_dependency_already_ended_at_submit(store: Store, make: Factory) -> None:
    devs = make.worker(devices=1)
    ok = make.start(device=devs[0])
    finish(store, ok.id)
    bad = make.start(device=devs[0])
    finish(store, bad.id, "failed")
    free = make.submit(after=(ok.id,))
    assert free.after_open == 0  # met already: nothing to wait for
    failed = make.submit(after=(ok.id, bad.id))
    done = store.queue.run_pass()
    assert done.ended == [failed.id]
    assert store.views.job(failed.id).kill_reason == f"dependency_failed: {bad.id}"
    assert [x.job_id for x in done.assigned] == [free.id]


def test_an_unknown_job_is_refused_by_name(store: Store, make: Factory) -> None:
    make.worker(devices=1)
    a = make.submit()
    with pytest.raises(errors.BadRequest, match="after: no job has the ID 'nope'"):
        make.submit(after=(a.id, "nope"))
    assert [j.id for j in store.views.queued()] == [a.id]  # nothing half-written


def test_a_waiting_job_holds_no_place_in_front_of_others(
    store: Store, make: Factory, raw: Raw
) -> None:
    devs = make.worker(devices=2)
    a = make.start(device=devs[0])
    waiting_job = make.submit(device=devs[1], after=(a.id,), priority=5)
    other = make.submit(device=devs[1])
    assert [x.job_id for x in store.queue.run_pass().assigned] == [other.id]
    assert store.views.job(waiting_job.id).state == "queued"
    assert raw.rows("SELECT * FROM reservations") == []


def test_every_waiting_job_in_the_state_view(store: Store, make: Factory) -> None:
    devs = make.worker(devices=1)
    a = make.start(device=devs[0])
    b = make.submit(after=(a.id,))
    store.limits = SubmitterLimits(default=1)
    c = make.submit()
    _, _, queued, waits = store.views.state_view()
    assert [j.id for j in queued] == [b.id, c.id]
    assert waits[b.id] == [waiting.Blocker(after=a.id)]
    assert waits[c.id] == [waiting.Blocker(submitter_limit=1, submitter="alice")]


def test_migration_0010_goes_down_and_up(tmp_path: Path) -> None:
    from alembic import command

    db = tmp_path / "rc.db"
    store = Store(db, FakeClock())
    store.devices.register("box", "b", [("gpu0", 0)])
    store_helpers.allocate_directly(store, "box:gpu0", "alice")
    store.close()
    eng = engine.create_engine(db)
    with eng.begin() as conn:
        cfg = engine._alembic_config(conn)
        command.downgrade(cfg, "0009")
        command.upgrade(cfg, "head")
    eng.dispose()
    store = Store(db, FakeClock())
    try:
        assert store.views.held_by_share() == {"alice": 1}  # rebuilt from the live leases
    finally:
        store.close()


def test_the_pass_reads_no_job_of_a_name_at_its_limit(
    store: Store, make: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue mostly of one person's jobs, that person at the limit: the walk leaves
    their rows in the database (EXT-SHARE-1)."""
    from resource_controller.store import queries

    devs = make.worker(devices=3)
    store.limits = SubmitterLimits(default=1)
    make.start(device=devs[0], submitter="alice")
    for _ in range(20):
        make.submit(submitter="alice")
    bob = make.submit(submitter="bob")
    read: list[str] = []
    page = queries.queue_page

    def counted(*args: object, **kw: object) -> Sequence[object]:
        rows = page(*args, **kw)  # type: ignore[arg-type]
        read.extend(r.id for r in rows)
        return rows

    monkeypatch.setattr(queries, "queue_page", counted)
    assert [a.job_id for a in store.queue.run_pass().assigned] == [bob.id]
    assert read == [bob.id]


def test_many_jobs_waiting_for_one_end_together(
    store: Store, make: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fan-out is read a chunk of IDs at a time; every waiting job ends in the pass."""
    from resource_controller.store import after

    monkeypatch.setattr(after, "_CHUNK", 7)
    devs = make.worker(devices=1)
    first = make.start(device=devs[0])
    waiting = {make.submit(after=(first.id,)).id for _ in range(30)}
    assert len(after.pending(store.db, sorted(waiting))) == 30
    finish(store, first.id, "failed")
    assert set(store.queue.run_pass().ended) == waiting
