"""Two stores on one database, as two controllers are (EXT-PG-2, EXT-PG-7): what each
writes at the same moment as the other still makes one consistent history."""

from __future__ import annotations

import threading

from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob
from resource_controller.store.records import JobRecord

from .dbview import Raw, invariant_violations

PER_STORE = 40


def test_submits_at_once_through_two_stores_each_get_their_own_place(
    store: Store, other_store: Store, raw: Raw
) -> None:
    store.devices.register("box", "boot-1", [("gpu0", 0), ("gpu1", 0)])
    made: list[JobRecord] = []
    keyed: list[str] = []
    start = threading.Barrier(2)

    def submit(s: Store, name: str) -> None:
        start.wait()
        for n in range(PER_STORE):
            made.append(s.queue.enqueue(NewJob(command=["true"], submitter=name)))
            # The same key through both stores: one job, whichever inserts first.
            keyed.append(s.queue.enqueue(NewJob(["true"], name, idempotency_key=f"k{n}")).id)
            s.queue.run_pass()

    pairs = ((store, "a"), (other_store, "b"))
    threads = [threading.Thread(target=submit, args=pair) for pair in pairs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    seqs = [r["seq"] for r in raw.rows("SELECT seq FROM jobs")]
    assert len(seqs) == 2 * PER_STORE + PER_STORE and len(set(seqs)) == len(seqs)
    assert len(set(keyed)) == PER_STORE  # each key's two submits answered with one job
    assert len({j.id for j in made}) == 2 * PER_STORE
    assert invariant_violations(raw) == []


JOBS = 120


def test_grants_through_one_store_and_releases_through_the_other_never_fail(
    store: Store, other_store: Store, raw: Raw
) -> None:
    """One controller's pass grants while another's reports release (and place, in their
    own commits): both touch the devices and the same submitter's held-device count, in
    one order on both sides, and a transaction that still loses a race to the other is
    run again, never a failure."""
    reg = store.devices.register("box", "boot-1", [(f"gpu{i}", 0) for i in range(4)])
    for _ in range(JOBS):
        store.queue.enqueue(NewJob(command=["true"], submitter="same"))
    failures: list[BaseException] = []
    done = threading.Event()

    def grant() -> None:
        try:
            while not done.is_set():
                store.queue.run_pass()
        except BaseException as exc:  # the test's verdict, not a crash of the thread
            failures.append(exc)
            done.set()

    def release() -> None:
        try:
            ended = 0
            while ended < JOBS and not done.is_set():
                handed, _ = other_store.reports.take_work(reg.worker_id)
                for job in handed:
                    other_store.reports.status(job.id, lambda _job: None, "succeeded", 0)
                    ended += 1
        except BaseException as exc:
            failures.append(exc)
        finally:
            done.set()

    threads = [threading.Thread(target=grant), threading.Thread(target=release)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        done.set()
    assert failures == []
    states = [r["state"] for r in raw.rows("SELECT state FROM jobs")]
    assert states == ["succeeded"] * JOBS
    assert invariant_violations(raw) == []
