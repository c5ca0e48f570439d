"""Jobs waiting for other jobs: ``job_after`` rows counted in ``after_open``; migration 0010's
trigger notes each end and ``settle`` applies it, so a failed chain ends in one pass."""

from __future__ import annotations

from collections.abc import Sequence

from resource_controller import errors
from resource_controller.core import share, states
from resource_controller.core.states import TERMINAL, JobState
from resource_controller.core.transitions import Op
from resource_controller.store import moves, sql

_TERMINAL = frozenset(s.value for s in TERMINAL)

#: Rows whose job has ended, through the partial index ``job_after_ended``.
_ANY_NOTED = "SELECT 1 FROM job_after WHERE ended != '' LIMIT 1"
_TAKE_NOTED = "DELETE FROM job_after WHERE ended != '' RETURNING job_id, after_id, ended"


def wait(db: sql.Db, job_id: str, after: Sequence[str], after_any: bool) -> int:
    """Write the ``job_after`` rows of a job about to be enqueued; how many it waits for. Rows read
    are locked (PostgreSQL): a concurrent end's trigger could not see the new rows."""
    if not after:
        return 0
    text = f"SELECT id, state FROM jobs WHERE id IN ({sql.marks(len(after))})"
    if db.postgres:
        text += " FOR SHARE"
    found = {str(i): str(s) for i, s in db.execute(text, tuple(after))}
    rows: list[tuple[str, str, str]] = []
    for other in after:
        state = found.get(other)
        if state is None:
            raise errors.BadRequest(f"after: no job has the ID {other[:80]!r}")
        if state not in _TERMINAL:
            rows.append((job_id, other, ""))
        elif not share.dependency_met(state, after_any):
            rows.append((job_id, other, state))
    if rows:
        db.many("INSERT INTO job_after (job_id, after_id, ended) VALUES (?, ?, ?)", rows)
    return len(rows)


def noted(db: sql.Db) -> bool:
    """Some job another waits for has ended since the last ``settle``: one index probe."""
    return db.one(_ANY_NOTED) is not None


def settle(db: sql.Db, now: int) -> list[str]:
    """Apply every noted end, in the caller's transaction; the jobs it ended
    ``dependency_failed``. Rows of a job that is no longer queued are simply dropped."""
    ended: list[str] = []
    while True:
        rows = db.execute(_TAKE_NOTED).fetchall()
        if not rows:
            return ended
        by_job: dict[str, list[tuple[str, str]]] = {}
        for job_id, other, state in rows:
            by_job.setdefault(str(job_id), []).append((str(other), str(state)))
        waiting = _queued(db, list(by_job))
        for job_id, ends in by_job.items():
            if job_id not in waiting:
                continue
            after_any, order = waiting[job_id]
            failed = [other for other, state in ends if not share.dependency_met(state, after_any)]
            if failed:
                # The first of them in its ``after_ids`` (an unknown one last).
                names = order.split(",")
                first = min(failed, key=lambda j: names.index(j) if j in names else len(names))
                if _fail(db, now, job_id, first):
                    ended.append(job_id)
                continue
            db.execute(
                "UPDATE jobs SET after_open = after_open - ? WHERE id = ?", (len(ends), job_id)
            )


def _fail(db: sql.Db, now: int, job_id: str, other: str) -> bool:
    """End a queued job ``killed``, ``dependency_failed: <other>``."""
    reason = states.dependency_failed(other)
    if moves.end_job(db, Op.DEPENDENCY_FAILED, job_id, JobState.KILLED, reason, now) != 1:
        return False
    db.execute("DELETE FROM job_after WHERE job_id = ?", (job_id,))
    db.execute("DELETE FROM reservations WHERE job_id = ?", (job_id,))
    return True


def _queued(db: sql.Db, job_ids: list[str]) -> dict[str, tuple[bool, str]]:
    """Of ``job_ids``, the queued jobs: whether any end will do, and their ``after_ids``."""
    out: dict[str, tuple[bool, str]] = {}
    for at in range(0, len(job_ids), _CHUNK):
        part = job_ids[at : at + _CHUNK]
        rows = db.execute(
            "SELECT id, after_any, after_ids FROM jobs"
            f" WHERE id IN ({sql.marks(len(part))}) AND state = ?",
            (*part, str(JobState.QUEUED)),
        )
        out.update((str(i), (bool(any_end), str(ids))) for i, any_end, ids in rows)
    return out


def pending(db: sql.Db, job_ids: Sequence[str]) -> dict[str, list[str]]:
    """Queued job -> the jobs it waits for that have not ended; jobs waiting for none are absent."""
    out: dict[str, list[str]] = {}
    for at in range(0, len(job_ids), _CHUNK):
        part = job_ids[at : at + _CHUNK]
        rows = db.execute(
            "SELECT job_id, after_id FROM job_after"
            f" WHERE job_id IN ({sql.marks(len(part))}) AND ended = ''",
            tuple(part),
        )
        for job_id, other in rows:
            out.setdefault(str(job_id), []).append(str(other))
    return out


#: IDs per ``IN`` list: far below any database's limit on parameters.
_CHUNK = 500
