"""Retries in the store (EXT-RETRY-1, EXT-RETRY-2), on SQLite and PostgreSQL: an attempt that ends
as the job's rule says sends it back to the queue as the same job, whichever way it ended (a
report, a sweep, a registration's reap), and a late word of an earlier attempt changes nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from resource_controller import errors
from resource_controller.clock import FakeClock
from resource_controller.core.expiry import SweepRules
from resource_controller.store.facade import Store

from .dbview import Raw, invariant_violations, wid

if TYPE_CHECKING:
    from conftest import Factory


def _ok(_job: Any) -> None:
    """Ownership checks passed."""


def _report(store: Store, job_id: str, state: str, code: int | None = None) -> None:
    store.reports.status(job_id, _ok, state, code, "")


def test_a_failed_attempt_queues_again_as_the_same_job_keeping_its_place(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    # EXT-RETRY-1
    (d0,) = make.worker(devices=1)
    job = make.start(selector="", retries=2, retry_on="failed", priority=3)
    first_epoch = job.lease_epoch
    clock.advance(7)
    _report(store, job.id, "failed", 3)
    again = store.views.job(job.id)
    # Back in the queue (the device was free, so the report's pass placed it again at once).
    assert again.attempt == 2 and again.state == "assigned" and again.exit_code is None
    assert again.queued_at == job.queued_at and again.priority == 3
    assert again.lease_epoch > first_epoch  # a new lease
    (past,) = store.views.attempts(job.id)
    assert (past.attempt, past.state, past.exit_code, past.device_ids) == (1, "failed", 3, d0)
    assert past.started_at == job.started_at and past.ended_at == store.now()
    store.reports.take_work(wid())
    _report(store, job.id, "succeeded", 0)
    assert store.views.job(job.id).state == "succeeded"
    assert len(store.views.attempts(job.id)) == 1
    assert invariant_violations(raw) == []


def test_the_retries_run_out_and_the_job_ends(store: Store, make: Factory) -> None:
    make.worker(devices=1)
    job = make.start(retries=1, retry_on="failed")
    _report(store, job.id, "failed", 1)
    store.reports.take_work(wid())
    _report(store, job.id, "failed", 1)
    end = store.views.job(job.id)
    assert (end.state, end.attempt, end.exit_code) == ("failed", 2, 1)


@pytest.mark.parametrize(
    ("retry_on", "state", "queued"),
    [("lost", "failed", False), ("failed", "failed", True), ("any", "killed", True)],
)
def test_retry_on_chooses_the_ends_that_retry(
    store: Store, make: Factory, retry_on: str, state: str, queued: bool
) -> None:
    make.worker(devices=1)
    job = make.start(retries=1, retry_on=retry_on)
    _report(store, job.id, state, 1)
    assert (store.views.job(job.id).attempt == 2) is queued


def test_a_persons_kill_never_retries(store: Store, make: Factory) -> None:
    make.worker(devices=1)
    job = make.start(retries=3, retry_on="any")
    store.queue.request_kill(job.id, "killed by alice")
    _report(store, job.id, "killed", -15)
    assert store.views.job(job.id).state == "killed" and store.views.attempts(job.id) == []


def test_a_lost_worker_s_job_queues_again_and_avoids_the_device_it_lost(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    # The sweep writes the silent worker off; its job goes to the other host's device.
    mine, _ = make.worker(devices=2)
    job = make.start(mine, retries=1)  # pinned: a pinned job keeps its device
    loose = make.start(selector="", retries=1)
    (theirs,) = make.worker(host="other", devices=1)
    for _ in range(11):  # 330 s of silence from box; other keeps beating
        clock.advance(30)
        store.reports.heartbeat(wid("other"), [])
    result = store.devices.sweep(SweepRules())
    assert set(result.jobs_requeued) == {job.id, loose.id} and result.jobs_lost == []
    pinned, moved = store.views.job(job.id), store.views.job(loose.id)
    assert (pinned.state, pinned.device_id, pinned.attempt) == ("queued", mine, 2)
    assert moved.state == "queued" and moved.avoid_device_ids == (loose.device_id,)
    store.queue.run_pass()
    assert store.views.job(loose.id).device_id == theirs  # the lost device is not grantable
    (past,) = store.views.attempts(loose.id)
    assert past.state == "lost" and past.kill_reason
    assert invariant_violations(raw) == []


def test_a_device_that_failed_the_job_is_tried_last(store: Store, make: Factory) -> None:
    d0, d1 = make.worker(devices=2)
    job = make.start(selector="", retries=1, retry_on="failed")
    failed_on = job.device_id
    _report(store, job.id, "failed", 1)
    again = store.views.job(job.id)
    assert again.state == "assigned" and again.device_id == ({d0, d1} - {failed_on}).pop()


def test_a_reregistration_reaps_the_job_into_the_queue(store: Store, make: Factory) -> None:
    make.worker(devices=1)
    job = make.start(retries=1)
    reg = store.devices.register("box", "boot-1", [("gpu0", 0)])
    assert reg.reaped == [job.id] and reg.requeued == [job.id]
    assert store.views.job(job.id).state == "queued"


def test_a_late_report_of_an_earlier_attempt_is_refused_by_its_epoch(
    store: Store, make: Factory
) -> None:
    # EXT-RETRY-2: the check the controller passes to ``status`` compares epochs.
    make.worker(devices=1)
    job = make.start(retries=1, retry_on="failed")
    old_epoch = job.lease_epoch
    _report(store, job.id, "failed", 1)
    store.reports.take_work(wid())
    current = store.views.job(job.id)

    def check(j: Any) -> None:
        if old_epoch != j.lease_epoch:
            raise errors.StaleLease("stale")

    with pytest.raises(errors.StaleLease):
        store.reports.status(job.id, check, "succeeded", 0, "")
    assert store.views.job(job.id).state == current.state == "running"


def test_rc_usage_counts_every_attempt_s_time(
    store: Store, make: Factory, clock: FakeClock
) -> None:
    # EXT-RETRY-1 with EXT-ACCT-2: each attempt's lease adds its held time as it ends.
    make.worker(devices=1)
    job = make.start(retries=1, retry_on="failed", submitter="alice")
    clock.advance(600)
    _report(store, job.id, "failed", 1)
    store.reports.take_work(wid())
    clock.advance(300)
    _report(store, job.id, "succeeded", 0)
    (group,) = store.views.usage("submitter", 86400).groups
    assert group.key == "alice" and group.figures.held_seconds == 900


def test_a_no_requeue_victim_whose_worker_is_lost_ends_lost(
    store: Store, make: Factory, raw: Raw, clock: FakeClock
) -> None:
    # EXT-PREEMPT-2: only the victim's own stop ends it ``killed``; a sweep can only lose it.
    make.worker(devices=1)
    job = make.start(preemptible=True, no_requeue=True)
    raw.write("UPDATE jobs SET preempted_by = 'j-big', kill_requested = 1 WHERE id = ?", job.id)
    clock.advance(330)
    result = store.devices.sweep(SweepRules())
    assert result.jobs_lost == [job.id]
    end = store.views.job(job.id)
    assert (end.state, end.kill_reason) == ("lost", "worker lost")
    assert invariant_violations(raw) == []


def test_a_no_requeue_victim_stopped_by_its_worker_ends_killed(
    store: Store, make: Factory, raw: Raw
) -> None:
    make.worker(devices=1)
    job = make.start(preemptible=True, no_requeue=True)
    raw.write("UPDATE jobs SET preempted_by = 'j-big', kill_requested = 1 WHERE id = ?", job.id)
    _report(store, job.id, "killed", -15)
    end = store.views.job(job.id)
    assert (end.state, end.kill_reason) == ("killed", "preempted by j-big")
