"""Preemption on the database (EXT-PREEMPT-1..4): the pass flags its victims in its own
transaction, the kill rides the worker's poll with its grace, the freed device goes to the job
that waited for it, and two stores deciding at once never choose a victim twice."""

from __future__ import annotations

import threading

from resource_controller.clock import FakeClock
from resource_controller.core import preempt
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob
from resource_controller.store.records import JobRecord, Preempted

from .dbview import Raw, invariant_violations


def running(store: Store, worker_id: str, **kw: object) -> JobRecord:
    job = store.queue.enqueue(NewJob(["sleep", "9"], "scav", preemptible=True, **kw))  # type: ignore[arg-type]
    store.queue.run_pass()
    handed, _ = store.reports.take_work(worker_id)
    assert [j.id for j in handed] == [job.id]
    return store.views.job(job.id)


def one_device(store: Store) -> str:
    return store.devices.register("box", "boot-1", [("gpu0", 0)]).worker_id


def test_a_waiting_job_stops_a_preemptible_one_and_gets_its_device(
    store: Store, clock: FakeClock
) -> None:
    """EXT-PREEMPT-1, EXT-PREEMPT-2: flagged in the pass, the kill with its grace, the attempt
    ends ``preempted`` and the job queues again, and the device goes to the waiting job."""
    store.preemption = preempt.Settings(min_runtime=60)
    worker = one_device(store)
    victim = running(store, worker, preempt_grace_seconds=5)
    clock.advance(61)
    waiting = store.queue.enqueue(NewJob(["true"], "real"))
    done = store.queue.schedule_after(waiting)
    assert done.preempted == [Preempted(victim.id, worker, waiting.id)]
    flagged = store.views.job(victim.id)
    assert flagged.preempted_by == waiting.id and flagged.kill_requested == 1
    blockers = store.queue.waiting_for(store.views.job(waiting.id))
    assert [b.preempting for b in blockers] == [(victim.id,)]
    # Another pass chooses nobody else and keeps the device for the waiting job.
    assert store.queue.run_pass().preempted == []
    handed, kills = store.reports.take_work(worker)
    assert handed == [] and list(kills) == [victim.id]
    assert kills.grace == {victim.id: 5}  # type: ignore[attr-defined]
    # The victim ends as a kill does: its attempt is preempted, the job queues again.
    _, result = store.reports.status(victim.id, lambda _: None, "killed", 143, "cancelled")
    again = store.views.job(victim.id)
    assert again.state == "queued" and again.attempt == 2 and again.preemptions == 1
    assert again.queued_at == victim.queued_at and again.preempted_by == ""
    assert result is not None and [a.job_id for a in result.assigned] == [waiting.id]
    # The waiting job done, the victim runs again.
    store.reports.take_work(worker)
    _, result = store.reports.status(waiting.id, lambda _: None, "succeeded", 0)
    assert result is not None and [a.job_id for a in result.assigned] == [victim.id]


def test_min_runtime_off_and_no_requeue(store: Store, clock: FakeClock) -> None:
    """EXT-PREEMPT-1 (first ``preempt_min_runtime``), EXT-PREEMPT-3 (off fleet-wide),
    EXT-PREEMPT-2 (``--no-requeue`` ends ``killed``, preempted by JOB)."""
    store.preemption = preempt.Settings(min_runtime=60)
    worker = one_device(store)
    victim = running(store, worker, no_requeue=True)
    clock.advance(30)
    waiting = store.queue.enqueue(NewJob(["true"], "real"))
    assert store.queue.schedule_after(waiting).preempted == []
    clock.advance(60)
    store.preemption = preempt.OFF
    assert store.queue.run_pass().preempted == []
    store.preemption = preempt.Settings(min_runtime=60)
    assert [p.job_id for p in store.queue.run_pass().preempted] == [victim.id]
    store.reports.take_work(worker)
    store.reports.status(victim.id, lambda _: None, "killed", 143, "cancelled")
    ended = store.views.job(victim.id)
    assert ended.state == "killed" and ended.kill_reason == f"preempted by {waiting.id}"
    assert store.views.job(waiting.id).state == "assigned"


def test_a_person_kill_carries_no_grace(store: Store) -> None:
    worker = one_device(store)
    victim = running(store, worker)
    store.queue.request_kill(victim.id, "killed by ann")
    _, kills = store.reports.take_work(worker)
    assert list(kills) == [victim.id] and kills.grace == {}  # type: ignore[attr-defined]


def test_two_stores_deciding_at_once_never_choose_a_victim_twice(
    store: Store, other_store: Store, clock: FakeClock, raw: Raw
) -> None:
    """EXT-PREEMPT-4: every pass holds the pass lock and flags a victim only while it is
    unflagged, so with two controllers each victim is chosen once, for one job."""
    for s in (store, other_store):
        s.preemption = preempt.Settings(min_runtime=0)
    worker = store.devices.register("box", "boot-1", [(f"gpu{i}", 0) for i in range(4)]).worker_id
    victims = [running(store, worker).id for _ in range(4)]
    clock.advance(10)
    chosen: list[Preempted] = []
    start = threading.Barrier(2)

    def submit(s: Store, name: str) -> None:
        start.wait()
        for _ in range(4):
            job = s.queue.enqueue(NewJob(["true"], name))
            chosen.extend(s.queue.schedule_after(job).preempted)
            chosen.extend(s.queue.run_pass().preempted)

    threads = [threading.Thread(target=submit, args=p) for p in ((store, "a"), (other_store, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(p.job_id for p in chosen) == sorted(victims)
    assert len({p.by for p in chosen}) == 4  # one victim per waiting job
    rows = raw.rows("SELECT id, preempted_by FROM jobs WHERE preemptible = 1")
    assert {r["id"]: r["preempted_by"] for r in rows} == {p.job_id: p.by for p in chosen}
    assert invariant_violations(raw) == []


def test_a_persons_kill_of_a_job_being_preempted_ends_it(store: Store, clock: FakeClock) -> None:
    """A person's kill wins over the preemption under way: the job ends killed, never queued
    again, and the job it made room for waits for the device alone."""
    store.preemption = preempt.Settings(min_runtime=0)
    worker = one_device(store)
    victim = running(store, worker)
    waiting = store.queue.enqueue(NewJob(["true"], "real"))
    assert store.queue.schedule_after(waiting).preempted
    store.queue.request_kill(victim.id, "killed by scav")
    assert store.views.job(victim.id).preempted_by == ""
    store.reports.status(victim.id, lambda _: None, "killed", 143, "cancelled")
    ended = store.views.job(victim.id)
    assert (ended.state, ended.attempt, ended.preemptions) == ("killed", 1, 0)
    assert store.views.job(waiting.id).state == "assigned"
