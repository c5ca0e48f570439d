"""A grant checks every condition it depends on against committed rows, inside its own
statements, whatever the pass's view of the fleet says (EXT-PG-7, STORE-065): a stale
or rolled-back view can only cost a placement attempt, never make a wrong grant."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from resource_controller import crashpoints
from resource_controller.core import share
from resource_controller.core.passloop import Placement
from resource_controller.store import leases
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob
from resource_controller.store.records import DeviceRecord
from support import store_helpers

from .dbview import Raw, invariant_violations

if TYPE_CHECKING:
    from conftest import Factory


class Injected(Exception):
    """A fault injected at a crash point: the transaction rolls back."""


def test_a_rolled_back_view_never_hands_out_a_device_another_store_drained(
    store: Store, other_store: Store, make: Factory, raw: Raw, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Controller A's report transaction frees X and its pass reads that into A's view of
    the fleet, then the transaction rolls back; controller B drains Y in that window, and
    its change note takes the number A's rolled-back one had. A must neither keep X as
    free nor miss Y's drain: its next pass places nothing."""
    a, b = store, other_store
    x, y = make.worker()
    holder = make.start(device=x)
    waiting = make.submit(device=x)  # so that A's pass reads the fleet

    def fault_at_finish(point: str, phase: str = "") -> None:
        if point + phase == "finish.before_commit":
            raise Injected

    real_rollback = a.db.rollback

    def rollback_then_b_drains() -> None:
        real_rollback()
        a.db.rollback = real_rollback  # type: ignore[method-assign]
        b.devices.drain(y, "ops", "driver upgrade")

    monkeypatch.setattr(crashpoints, "hit", fault_at_finish)
    a.db.rollback = rollback_then_b_drains  # type: ignore[method-assign]
    with pytest.raises(Injected):
        a.reports.status(holder.id, lambda _job: None, "succeeded", 0)
    monkeypatch.undo()

    assert store_helpers.device(b, y).draining == 1  # type: ignore[union-attr]
    late = a.queue.enqueue(NewJob(command=["train"], submitter="bob"))
    a.queue.run_pass()
    assert a.views.job(late.id).state == "queued"  # X still held, Y draining
    assert a.views.job(waiting.id).state == "queued"
    assert raw.live_leases(y) == []
    assert invariant_violations(raw) == []


def _stale(store: Store, device_id: str) -> DeviceRecord:
    """A device's record read now, before the caller's change: the grant must see the
    change in the database, not in this record."""
    record = store_helpers.device(store, device_id)
    assert record is not None
    return record


def _grant(
    store: Store, job_id: str, record: DeviceRecord, **limits: share.SubmitterLimits
) -> Placement:
    return leases.try_assign(store.tx, store.now(), store.views.job(job_id), record, **limits)


def test_a_stale_record_of_a_device_drained_since_is_not_granted(
    store: Store, make: Factory, raw: Raw
) -> None:
    (d0,) = make.worker(devices=1)
    job = make.submit(device=d0)
    record = _stale(store, d0)
    store.devices.drain(d0, "ops", "")
    assert _grant(store, job.id, record) is Placement.NOT_READY
    assert raw.live_leases(d0) == [] and store.views.job(job.id).state == "queued"


def test_a_stale_record_of_a_device_marked_in_mig_conflict_is_not_granted(
    store: Store, make: Factory, raw: Raw
) -> None:
    (d0,) = make.worker(devices=1)
    job = make.submit(device=d0)
    record = _stale(store, d0)
    conflict = {"gpu0": {"mig_conflict": "GPU 0 is in MIG mode"}}
    store.devices.apply_facts("box", ["gpu0"], conflict, None, None, None)
    assert _grant(store, job.id, record) is Placement.NOT_READY
    assert raw.live_leases(d0) == []


def test_a_job_still_waiting_for_another_is_not_granted(
    store: Store, make: Factory, raw: Raw
) -> None:
    d0, d1 = make.worker()
    first = make.start(device=d0)
    later = make.submit(device=d1, after=(first.id,))
    assert _grant(store, later.id, _stale(store, d1)) is Placement.GONE
    assert raw.live_leases(d1) == [] and store.views.job(later.id).state == "queued"


def test_a_job_whose_submitter_reached_its_limit_is_not_granted(
    store: Store, make: Factory, raw: Raw
) -> None:
    d0, d1 = make.worker()
    make.start(device=d0, submitter="alice")
    job = make.submit(device=d1, submitter="alice")
    one_each = share.SubmitterLimits(default=1)
    assert _grant(store, job.id, _stale(store, d1), limits=one_each) is Placement.GONE
    assert raw.live_leases(d1) == []
    other = make.submit(device=d1, submitter="bob")
    assert _grant(store, other.id, _stale(store, d1), limits=one_each) is Placement.PLACED
