""" "Now" is read once per operation (STORE-005): on a clock that gains a second at every
read, every instant one operation writes is still the same instant."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from resource_controller.clock import FakeClock
from resource_controller.core.expiry import SweepRules
from resource_controller.store.facade import Store
from support import store_helpers

from .dbview import Raw, wid

if TYPE_CHECKING:
    from conftest import Factory


class TickingClock(FakeClock):
    """A ``FakeClock`` that gains one second at every read of ``now``."""

    def now(self) -> float:
        self.advance(1)
        return super().now()


@pytest.fixture
def clock() -> FakeClock:
    return TickingClock()


def test_registration_stamps_the_worker_and_its_devices_with_one_instant(
    store: Store, raw: Raw
) -> None:
    # STORE-005: a first registration (rows created) and a second (rows updated).
    for _ in range(2):
        store.devices.register("box", "boot-1", [("gpu0", 0), ("gpu1", 0), ("gpu2", 0)])
        beats = {raw.worker(wid())["last_heartbeat_at"]}
        beats |= {d.last_heartbeat_at for d in store_helpers.devices(store)}
        assert len(beats) == 1, beats


def test_a_submitted_job_was_queued_when_it_was_submitted(make: Factory) -> None:
    # STORE-005
    make.worker(devices=1)
    for device in ("", "box:gpu0"):  # any device, then a pin
        job = make.submit(device=device)
        assert job.queued_at == job.submitted_at


def test_a_grant_deadline_is_counted_from_the_grant_instant(store: Store, make: Factory) -> None:
    # STORE-005 with STORE-052: expires_at - acquired_at is exactly the lease's term.
    d0, d1 = make.worker(devices=2)
    plain = make.submit(device=d0)
    limited = make.submit(device=d1, max_runtime_seconds=60)
    store.queue.run_pass()
    terms = {x.job_id: x.expires_at - x.acquired_at for x in store_helpers.live_leases(store)}
    assert terms == {plain.id: 300, limited.id: 60 + 600}


def test_jobs_one_sweep_loses_all_end_at_one_instant(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    # STORE-005 with STORE-041: finished_at (and each lease's released_at) is the sweep's now.
    jobs = [make.start(d) for d in make.worker(devices=2) + make.worker("other", devices=1)]
    clock.advance(300)
    result = store.devices.sweep(SweepRules())
    assert sorted(result.jobs_lost) == sorted(j.id for j in jobs)
    ended = {store.views.job(j.id).finished_at for j in jobs}
    ended |= {lease["released_at"] for j in jobs for lease in raw.leases_of(j.id)}
    assert len(ended) == 1, ended
