"""The scheduling pass with priority aging (EXT-FAIR-1): a low-priority job behind a
steady stream of higher ones gets the device once it has waited long enough."""

from __future__ import annotations

from pathlib import Path

from resource_controller.clock import FakeClock
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob
from support import store_helpers


def run_stream(tmp_path: Path, aging: int) -> tuple[int | None, int]:
    """One device; each minute the running job ends and a new priority-5 job arrives.
    Returns the minute the priority -5 job started (None: never, within 60) and how
    many stream jobs ran before it."""
    clock = FakeClock()
    store = Store(tmp_path / f"rc-{aging}.db", clock, priority_aging=aging)
    try:
        store.devices.register("box", "b", [("gpu0", 0)])

        def submit(priority: int) -> str:
            job = store.queue.enqueue(NewJob(command=["x"], submitter="a", priority=priority))
            return job.id

        running = submit(5)
        store.queue.run_pass()
        low = submit(-5)
        submit(5)
        ran = 1
        for minute in range(1, 61):
            clock.advance(60)
            store_helpers.release(store, running, "succeeded", 0)
            submit(5)
            (placed,) = store.queue.run_pass().assigned
            if placed.job_id == low:
                return minute, ran
            running = placed.job_id
            ran += 1
        return None, ran
    finally:
        store.close()


def test_without_aging_the_low_job_starves(tmp_path: Path) -> None:
    assert run_stream(tmp_path, 0)[0] is None


def test_with_aging_the_low_job_gets_through(tmp_path: Path) -> None:
    # One step per minute, for every queued job: the stream job waiting since the
    # previous minute stands at 6, so the low job (queued first) wins once it is at 6
    # too, after 11 minutes.
    minute, ran = run_stream(tmp_path, 60)
    assert minute == 11
    assert ran == 11
