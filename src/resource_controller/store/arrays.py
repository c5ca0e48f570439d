"""Job arrays (EXT-ARRAY-1, -3): an array and its tasks written in one transaction, read back
with their states, and ended together."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from resource_controller import errors
from resource_controller.core.arrays import ArraySpec
from resource_controller.core.states import JobState
from resource_controller.core.transitions import JOB, Op
from resource_controller.store import jobs, moves, races, sql
from resource_controller.store.base import Core
from resource_controller.store.jobs import NewJob, Tasks


@dataclass(frozen=True)
class ArrayRecord:
    """An ``arrays`` row."""

    id: str
    spec: str
    size: int
    max_running: int
    submitter: str
    submitted_at: int


@dataclass(frozen=True)
class TaskRecord:
    """What an array's view shows of one task."""

    id: str
    index: int
    state: str
    exit_code: int | None
    device_id: str
    worker_id: str


@dataclass(frozen=True)
class ArrayKill:
    """What ending an array did: tasks cancelled in the queue, and active ones flagged for their
    workers."""

    cancelled: list[str]
    flagged: list[tuple[str, str]]  #: (job ID, worker ID)


_ARRAY_COLS = "id, spec, size, max_running, submitter, submitted_at"
#: ``array_id != ''`` in each read lets the partial index ``jobs_array`` serve it.
_TASKS = (
    "SELECT id, array_index, state, exit_code, device_id, worker_id FROM jobs"
    " WHERE array_id = ? AND array_id != '' ORDER BY array_index"
)


class Arrays:
    """The arrays' operations, each in the core's one transaction context."""

    def __init__(self, core: Core) -> None:
        self._core = core

    @races.again
    def submit(self, req: NewJob, spec: ArraySpec) -> ArrayRecord:
        """The array and every task ``queued`` in one transaction, or the array that has the key."""
        core = self._core
        with core.tx("submit") as c:
            now = core.now()
            array_id = str(uuid.uuid4())
            tasks = Tasks(array_id, spec.indexes)
            first = jobs.enqueue(c, now, req, lambda: core.fleet.read(c)[1], tasks)
            if first.array_id != array_id:  # the key's job
                if not first.array_id:
                    raise errors.BadRequest(
                        f"idempotency_key {req.idempotency_key!r} names job {first.id}, not an array"
                    )
                return _array(c, first.array_id)
            record = ArrayRecord(
                array_id, spec.text, len(spec.indexes), spec.max_running, req.submitter, now
            )
            c.execute(
                f"INSERT INTO arrays ({_ARRAY_COLS}) VALUES (?, ?, ?, ?, ?, ?)",
                (record.id, record.spec, record.size, record.max_running, req.submitter, now),
            )
        core.settled.forget()
        return record

    @races.reconnecting
    def record(self, array_id: str) -> ArrayRecord:
        """The array's row alone (who owns it); ``ArrayNotFound`` when unknown."""
        with self._core.read() as c:
            return _array(c, array_id)

    @races.reconnecting
    def view(self, array_id: str) -> tuple[ArrayRecord, list[TaskRecord]]:
        """The array and its tasks in index order; ``ArrayNotFound`` when unknown."""
        with self._core.read() as c:
            record = _array(c, array_id)
            return record, [TaskRecord(*row) for row in c.all(_TASKS, (array_id,))]

    @races.again
    def kill(self, array_id: str, reason: str) -> ArrayKill:
        """EXT-ARRAY-3: every task not yet ended ends as a kill would end it."""
        core = self._core
        with core.tx("kill") as c:
            _array(c, array_id)
            cancelled = moves.move_returning(
                c,
                JOB,
                Op.CANCEL_QUEUED,
                "array_id = ? AND array_id != ''",
                (array_id,),
                "id",
                state=JobState.KILLED,
                kill_reason=reason,
                finished_at=core.now(),
            )
            if cancelled:
                c.execute(
                    "DELETE FROM reservations WHERE job_id IN"
                    " (SELECT id FROM jobs WHERE array_id = ? AND array_id != '' AND state = 'killed')",
                    (array_id,),
                )
            flagged = c.all(
                # As a person's kill of each: one under way for a preemption ends too.
                "UPDATE jobs SET kill_requested = 1, kill_delivered_at = 0, preempted_by = ''"
                " WHERE array_id = ? AND array_id != '' AND state IN ('assigned', 'running')"
                " AND (kill_requested = 0 OR preempted_by != '')"
                " RETURNING id, worker_id",
                (array_id,),
            )
        return ArrayKill([str(j) for (j,) in cancelled], [(str(j), str(w)) for j, w in flagged])


def _array(conn: sql.Db, array_id: str) -> ArrayRecord:
    row = conn.one(f"SELECT {_ARRAY_COLS} FROM arrays WHERE id = ?", (array_id,))
    if row is None:
        raise errors.ArrayNotFound(f"no array has the ID {array_id[:80]!r}")
    return ArrayRecord(*row)
