"""The pass right after a submit is skipped when it could change nothing
(``Store.schedule_after``): on a settled queue, with nothing committed since but the
submit. On SQLite "nothing since" is the file's ``data_version``; on PostgreSQL the
transaction IDs (``Db.quiet_mark``). Another process's commit, or a submit that may
have found an old job by its key on PostgreSQL, makes the pass run."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from resource_controller.store import sql
from resource_controller.store.facade import Store
from resource_controller.store.jobs import NewJob
from support import store_helpers

if TYPE_CHECKING:
    from conftest import Factory

_QUEUE_READ = "ORDER BY jobs.priority DESC"


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(sql, "watchers", [lambda text, move: seen.append(text)])
    return seen


def _passed(store: Store, job_id: str, statements: list[str]) -> bool:
    """Run the pass after ``job_id``'s submit; whether it read the queue."""
    statements.clear()
    assert store.queue.schedule_after(store.views.job(job_id)).assigned == []
    return any(_QUEUE_READ in s for s in statements)


def _settled(store: Store, make: Factory) -> tuple[str, str]:
    """One device, busy; a job waiting for it; a pass that placed nothing. The running
    and the waiting job's IDs."""
    [device] = make.worker(devices=1)
    running = make.start(device=device)
    waiting = make.submit()
    assert store.queue.run_pass().assigned == []
    return running.id, waiting.id


def test_submits_behind_a_settled_queue_run_no_pass(
    store: Store, make: Factory, statements: list[str]
) -> None:
    running, waiting = _settled(store, make)
    for _ in range(3):
        assert not _passed(store, make.submit().id, statements)
    # Nothing was lost by skipping: the first in line is placed when the device frees.
    store_helpers.release(store, running, "succeeded", 0)
    assert [a.job_id for a in store.queue.run_pass().assigned] == [waiting]


def test_another_controllers_commit_makes_the_pass_run(
    store: Store, other_store: Store, make: Factory, statements: list[str]
) -> None:
    _settled(store, make)
    other_store.queue.enqueue(NewJob(command=["x"], submitter="bob"))
    assert _passed(store, make.submit().id, statements)
    # Settled again, nothing else since: skipped.
    assert not _passed(store, make.submit().id, statements)


def test_a_transaction_between_the_pass_and_the_submit_makes_the_pass_run(
    store: Store, make: Factory, statements: list[str]
) -> None:
    running, _ = _settled(store, make)
    store.queue.request_kill(running, "stop")  # this process's own write
    assert _passed(store, make.submit().id, statements)


def test_a_submit_with_an_idempotency_key_passes_on_postgresql(
    store: Store, make: Factory, statements: list[str], backend: str
) -> None:
    _settled(store, make)
    job = make.submit(idempotency_key="k1")
    # On PostgreSQL whether the submit wrote is not known, and the mark cannot tell
    # the submit's commit from another's: the pass runs. SQLite counts others' only.
    assert _passed(store, job.id, statements) == (backend == "postgresql")


def test_the_record_a_submit_returns_is_the_one_stored(store: Store, make: Factory) -> None:
    """The API answers a submit whose pass left the job alone with the record the
    enqueue returned, without reading it back: it must be the stored one."""
    make.worker(devices=2, max_runtime_seconds=3600)
    first = make.submit()
    jobs = [
        first,
        make.submit(device="box:gpu1", env={"A": "1"}, priority=3, max_runtime_seconds=60),
        make.submit(after=(first.id,), reason="r", idle_timeout=5),
        make.submit(device_ids=("box:gpu0", "box:gpu1")),
        make.submit(count=2, cwd="/tmp", share_name="team"),
        make.submit(idempotency_key="k", command=("a", "b")),
    ]
    assert [store.views.job(j.id) for j in jobs] == jobs
