"""Leases: a device changes hands only in ``assign``, re-checking every grant condition against
committed rows (ARCHITECTURE.md "The grant rule"); the unique index referees; no epoch is reused."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from resource_controller import crashpoints, errors
from resource_controller.core import mig, scheduling, share
from resource_controller.core.passloop import Placement
from resource_controller.core.states import DeviceState, JobState
from resource_controller.core.transitions import DEVICE, JOB, Op
from resource_controller.store import moves, queries, sql, usage
from resource_controller.store.records import (
    DeviceRecord,
    JobRecord,
    LeaseRecord,
    join_ids,
)

log = logging.getLogger(__name__)

NO_RUNTIME_TTL = 5 * 60  #: lease TTL for a job without a runtime
RUNTIME_MARGIN = 10 * 60  #: margin over a job's runtime: the worker's watchdog fires first
RENEWAL = 15 * 60  #: a heartbeat naming the job renews its lease to now + this

EPOCH_COUNTER = "lease_epoch"
#: A lease row; the partial unique index refuses a second live one.
_INSERT = (
    f"INSERT INTO leases ({', '.join(LeaseRecord._fields)})"
    f" VALUES ({sql.marks(len(LeaseRecord._fields))})"
)


def deadline(now: int, runtime: int) -> int:
    """The grant-time ``expires_at`` for a job with effective runtime ``runtime``."""
    return now + (runtime + RUNTIME_MARGIN if runtime > 0 else NO_RUNTIME_TTL)


def grant(conn: sql.Db, now: int, job: JobRecord, device_id: str, runtime: int) -> LeaseRecord:
    """Insert the live lease for ``job`` on ``device_id``; the unique index is the referee."""
    lease = LeaseRecord(
        id=str(uuid.uuid4()),
        device_id=device_id,
        holder=job.submitter,
        job_id=job.id,
        acquired_at=now,
        expires_at=deadline(now, runtime),
        released_at=None,
        kind=job.kind,
        reason=job.reason,
        epoch=queries.next_counter(conn, EPOCH_COUNTER),
    )
    try:
        conn.execute(_INSERT, lease)
    except conn.integrity_errors as exc:
        raise errors.LiveLeaseConflict(
            f"device {device_id} already has a live lease; refusing a second one"
        ) from exc
    return lease


def release_for_job(
    conn: sql.Db,
    now: int,
    job_id: str,
    util: float | None = None,
    first: Sequence[usage.Held] = (),
) -> list[str]:
    """Release ``job_id``'s live leases; their devices. The rollup counts the job once."""
    released = queries.release_leases(conn, now, job_id) if job_id else []
    usage.account(conn, now, [*first, *released], util)
    return sorted(h.device_id for h in released)


#: The device row at hand shares its GPU with another device of its host that holds a
#: live lease: ``gpu0`` and ``gpu0.mig1`` (``core.mig.overlap``, in SQL). The devices of
#: one worker are read first (``devices_worker``), then each one's live lease by the
#: partial unique index, so a grant costs a look at its own host only.
_OVERLAP_HELD = (
    "EXISTS (SELECT 1 FROM devices s WHERE s.worker_id = devices.worker_id"
    " AND s.id <> devices.id"
    f" AND (substr(s.name, 1, length(devices.name) + {len(mig.SEPARATOR)})"
    f" = devices.name || '{mig.SEPARATOR}'"
    f" OR substr(devices.name, 1, length(s.name) + {len(mig.SEPARATOR)})"
    f" = s.name || '{mig.SEPARATOR}')"
    " AND EXISTS (SELECT 1 FROM leases l WHERE l.device_id = s.id AND l.released_at IS NULL))"
)

#: The devices a grant may flip: ``ready`` (the move's own condition), and neither
#: draining, nor labelled in MIG conflict, nor sharing a GPU with a held device.
_GRANTABLE = (
    " AND draining = 0"
    # The effective label: a detected value overlays a declared one (``fleet.effective``).
    " AND coalesce((SELECT c.value FROM device_labels c WHERE c.device_id = devices.id"
    f" AND c.key = '{mig.CONFLICT}' ORDER BY c.source DESC LIMIT 1), '') = ''"
    " AND NOT " + _OVERLAP_HELD
)

#: The job a grant may move: ``queued`` (the move's own condition) and waiting for no
#: other job; with a submitter limit, the devices its name holds leave room for it.
_PLACEABLE = "id = ? AND after_open = 0"
_UNDER_LIMIT = " AND coalesce((SELECT devices FROM share_held WHERE share_name = ?), 0) + ? <= ?"


class _NotQueued(Exception):
    """Rolls back an assignment whose job left the queue after its device was flipped."""


class _NotReady(Exception):
    """Rolls back a several-device assignment when one of its devices was not ``ready``."""


def assign(
    conn: sql.Db,
    now: int,
    job: JobRecord,
    devices: DeviceRecord | Sequence[DeviceRecord],
    limits: share.SubmitterLimits = share.NO_LIMITS,
) -> Placement:
    """Give ``devices`` to queued ``job``, re-checking both here (``_GRANTABLE``, ``_PLACEABLE``),
    so a stale view never hands out a wrong device; all or nothing, in ID order (the last epoch
    is the job's)."""
    group = sorted([devices] if isinstance(devices, DeviceRecord) else devices, key=lambda d: d.id)
    ids = [d.id for d in group]
    if mig.overlapping(d.name for d in group):
        return Placement.NOT_READY  # one job, one GPU twice: never
    flipped = moves.move(
        conn,
        DEVICE,
        Op.ASSIGN,
        queries.id_in(len(ids)) + _GRANTABLE,
        ids,
        state=DeviceState.BUSY,
    )
    if flipped != len(ids):
        if flipped == 0:
            return Placement.NOT_READY  # nothing written
        raise _NotReady(job.id)  # rolls the partial flip back with the transaction
    runtime = scheduling.gang_runtime(
        job.max_runtime_seconds, (d.max_runtime_seconds for d in group)
    )
    where, params = _PLACEABLE, list[object]([job.id])
    limit = limits.of(job.share)
    if limit is not None:
        where += _UNDER_LIMIT
        params += [job.share, len(ids), limit]
    moved = moves.move(
        conn,
        JOB,
        Op.ASSIGN,
        where,
        params,
        state=JobState.ASSIGNED,
        device_id=ids[0],
        device_ids=join_ids(ids) if len(ids) > 1 else "",
        worker_id=group[0].worker_id,
        max_runtime_seconds=runtime,
    )
    if moved != 1:
        raise _NotQueued(job.id)  # rolls the device flips back with the transaction
    for device_id in ids:
        grant(conn, now, job, device_id, runtime)
    queries.update_reservations(conn, now, ids)
    crashpoints.hit("grant", ".before_commit")
    return Placement.PLACED


def try_assign(
    transaction: Callable[[], AbstractContextManager[sql.Db]],
    now: int,
    job: JobRecord,
    devices: DeviceRecord | Sequence[DeviceRecord],
    limits: share.SubmitterLimits = share.NO_LIMITS,
) -> Placement:
    """``assign`` in a transaction of its own, rolled back whole unless it placed."""
    try:
        with transaction() as tx:
            return assign(tx, now, job, devices, limits)
    except _NotQueued:
        return Placement.GONE
    except _NotReady:
        return Placement.NOT_READY
