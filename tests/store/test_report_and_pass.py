"""A terminal report and the pass it calls for, in one commit (EXT-FAST-1): the device a
job frees is handed to the next job in the transaction that frees it.

Each placement inside is a savepoint, and the pass as a whole is one: a pass that fails
undoes only itself and the report still commits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from resource_controller.store import passes
from resource_controller.store.facade import Store
from resource_controller.store.records import Assigned

from .dbview import Raw, invariant_violations, wid

if TYPE_CHECKING:
    from conftest import Factory


def _ok(_job: Any) -> None:
    """Ownership checks passed."""


def test_the_freed_device_goes_to_the_next_job_in_the_reports_commit(
    store: Store, make: Factory, raw: Raw
) -> None:
    (d0,) = make.worker(devices=1)
    first = make.start(d0)
    second = make.submit(device=d0)
    commits = store.gen
    before, done = store.reports.status(first.id, _ok, "succeeded", 0)
    assert store.gen == commits + 1  # one transaction: the release and the grant
    assert before.id == first.id and done is not None
    assert done.assigned == [Assigned(second.id, wid())]
    assert store.views.job(first.id).state == "succeeded"
    assert store.views.job(second.id).state == "assigned"
    assert [lease["device_id"] for lease in raw.leases_of(second.id)] == [d0]
    assert invariant_violations(raw) == []


def test_a_running_report_runs_no_pass(store: Store, make: Factory) -> None:
    (d0,) = make.worker(devices=1)
    job = make.submit(device=d0)
    store.queue.run_pass()
    _, done = store.reports.status(job.id, _ok, "running")
    assert done is None and store.views.job(job.id).state == "running"


def test_a_failing_pass_is_undone_alone_and_the_report_commits(
    store: Store, make: Factory, raw: Raw, monkeypatch: pytest.MonkeyPatch
) -> None:
    d0, d1 = make.worker(devices=2)
    first = make.start(d0)
    second = make.submit(device=d0)
    third = make.submit(device=d1)
    real = passes.schedule_pass

    def place_then_fail(*args: Any, **kwargs: Any) -> list[Assigned]:
        real(*args, **kwargs)  # places both queued jobs, then the pass breaks
        raise RuntimeError("the pass broke")

    monkeypatch.setattr(passes, "schedule_pass", place_then_fail)
    _, done = store.reports.status(first.id, _ok, "failed", 3)
    assert done is None
    assert store.views.job(first.id).state == "failed" and store.views.job(first.id).exit_code == 3
    # What the pass placed is undone with it: both still queued, no lease, no reservation.
    assert [store.views.job(j.id).state for j in (second, third)] == ["queued", "queued"]
    assert raw.leases_of(second.id) == [] and raw.leases_of(third.id) == []
    assert invariant_violations(raw) == []
    monkeypatch.setattr(passes, "schedule_pass", real)
    # The next pass places them, the caches not fooled by what was undone.
    placed = {a.job_id for a in store.queue.run_pass().assigned}
    assert placed == {second.id, third.id}
    assert invariant_violations(raw) == []


def test_a_refused_report_writes_nothing_and_places_nothing(
    store: Store, make: Factory, raw: Raw
) -> None:
    (d0,) = make.worker(devices=1)
    first = make.start(d0)
    second = make.submit(device=d0)

    def refuse(_job: Any) -> None:
        raise PermissionError("not yours")

    with pytest.raises(PermissionError):
        store.reports.status(first.id, refuse, "succeeded", 0)
    assert (
        store.views.job(first.id).state == "running"
        and store.views.job(second.id).state == "queued"
    )
    # The store's kept pass state was dropped with the transaction: the next report hands on.
    _, done = store.reports.status(first.id, _ok, "succeeded", 0)
    assert done is not None and done.assigned == [Assigned(second.id, wid())]
    assert invariant_violations(raw) == []
