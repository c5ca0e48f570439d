"""Arrays in the store (EXT-ARRAY-1, EXT-ARRAY-3), on SQLite and PostgreSQL: one transaction writes
every task in index order, the ``%N`` cap holds however the passes run (two controllers' at once
too), and ending an array ends each task as a kill would."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest

from resource_controller import errors
from resource_controller.core import arrays
from resource_controller.core.waiting import Blocker
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob

from .dbview import Raw, invariant_violations, wid

if TYPE_CHECKING:
    from conftest import Factory


def _ok(_job: Any) -> None:
    """Ownership checks passed."""


def _submit(store: Store, spec: str, **kw: Any) -> str:
    new = NewJob(command=["sweep"], submitter=kw.pop("submitter", "alice"), **kw)
    return store.arrays.submit(new, arrays.parse(spec)).id


def _active(store: Store, array_id: str) -> int:
    _, tasks = store.arrays.view(array_id)
    return sum(t.state in ("assigned", "running") for t in tasks)


def test_an_array_is_one_job_per_index_in_index_order(store: Store, make: Factory) -> None:
    make.worker(devices=1)
    array_id = _submit(store, "1,4,9,0-2:2", priority=2)
    record, tasks = store.arrays.view(array_id)
    assert (record.spec, record.size, record.max_running) == ("1,4,9,0-2:2", 5, 0)
    assert [t.index for t in tasks] == [0, 1, 2, 4, 9]
    jobs = [store.views.job(t.id) for t in tasks]
    assert [j.seq for j in jobs] == sorted(j.seq for j in jobs)  # queued in index order
    assert all(j.array_id == array_id and j.priority == 2 for j in jobs)
    assert [j.env["RC_ARRAY_INDEX"] for j in jobs] == ["0", "1", "2", "4", "9"]
    assert {j.env["RC_ARRAY_ID"] for j in jobs} == {array_id}
    store.queue.run_pass()
    assert [t.state for t in store.arrays.view(array_id)[1]][:2] == ["assigned", "queued"]


def test_the_cap_keeps_at_most_n_tasks_running(store: Store, make: Factory, raw: Raw) -> None:
    make.worker(devices=4)
    array_id = _submit(store, "0-9%2")
    store.queue.run_pass()
    assert _active(store, array_id) == 2
    # What a held-back task waits for is its array's cap, not a device.
    _, tasks = store.arrays.view(array_id)
    _, _, waits = store.queue.job_view(tasks[5].id)
    assert waits == [Blocker(array_id=array_id, array_limit=2)]
    # A job behind the capped tasks takes the free devices: the cap claims nothing.
    other = make.submit()
    store.queue.run_pass()
    assert store.views.job(other.id).state == "assigned"
    store.reports.take_work(wid())
    for _ in range(5):
        running = [t for t in store.arrays.view(array_id)[1] if t.state == "running"]
        assert len(running) == 2
        store.reports.status(running[0].id, _ok, "succeeded", 0, "")
        store.reports.take_work(wid())
    _, tasks = store.arrays.view(array_id)
    assert [t.state for t in tasks] == ["succeeded"] * 5 + ["running"] * 2 + ["queued"] * 3
    assert invariant_violations(raw) == []


def test_the_cap_holds_with_two_controllers_passing_at_once(
    store: Store, other_store: Store, make: Factory, raw: Raw
) -> None:
    make.worker(devices=8)
    array_id = _submit(store, "0-39%3")
    start = threading.Barrier(2)
    seen: list[int] = []

    def passes(s: Store) -> None:
        start.wait()
        for _ in range(20):
            s.queue.run_pass()
            seen.append(_active(s, array_id))

    threads = [threading.Thread(target=passes, args=(s,)) for s in (store, other_store)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert max(seen) == 3 and _active(store, array_id) == 3
    assert invariant_violations(raw) == []


def test_a_resubmit_with_the_key_answers_with_the_same_array(store: Store, make: Factory) -> None:
    make.worker(devices=1)
    first = _submit(store, "0-3", idempotency_key="sweep-1")
    assert _submit(store, "0-3", idempotency_key="sweep-1") == first
    assert len(store.arrays.view(first)[1]) == 4
    make.submit(idempotency_key="plain")
    with pytest.raises(errors.BadRequest, match="not an array"):
        _submit(store, "0-3", idempotency_key="plain")


def test_an_array_no_device_matches_writes_nothing(store: Store, make: Factory, raw: Raw) -> None:
    make.worker(devices=1)
    with pytest.raises(errors.NoMatchingDevice):
        _submit(store, "0-99", selector="vram>=80G")
    assert raw.rows("SELECT id FROM jobs") == [] and raw.rows("SELECT id FROM arrays") == []


def test_killing_an_array_ends_every_task_not_yet_ended(store: Store, make: Factory) -> None:
    make.worker(devices=2)
    array_id = _submit(store, "0-4")
    store.queue.run_pass()
    store.reports.take_work(wid())
    _, tasks = store.arrays.view(array_id)
    store.reports.status(tasks[0].id, _ok, "succeeded", 0, "")
    store.reports.take_work(wid())  # the freed device took task 2
    ended = store.arrays.kill(array_id, "killed by alice")
    assert sorted(ended.cancelled) == sorted(t.id for t in tasks[3:])
    assert sorted(j for j, _ in ended.flagged) == sorted(t.id for t in tasks[1:3])
    after = {t.id: store.views.job(t.id) for t in tasks}
    assert after[tasks[0].id].state == "succeeded"
    assert all(after[t.id].kill_requested == 1 for t in tasks[1:3])
    assert all(
        (after[t.id].state, after[t.id].kill_reason) == ("killed", "killed by alice")
        for t in tasks[3:]
    )
    with pytest.raises(errors.ArrayNotFound):
        store.arrays.kill("no-such-array", "killed by alice")


def test_ten_thousand_tasks_in_one_submit(store: Store, make: Factory, raw: Raw) -> None:
    make.worker(devices=4)
    array_id = _submit(store, "0-9999%8")
    store.queue.run_pass()
    assert _active(store, array_id) == 4
    assert raw.rows("SELECT count(*) AS n FROM jobs")[0]["n"] == 10_000
    assert len({r["seq"] for r in raw.rows("SELECT seq FROM jobs")}) == 10_000
