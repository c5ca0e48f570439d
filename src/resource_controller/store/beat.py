"""The heartbeat as prebuilt SQL on the driver's connection.

A fleet of 1,250 workers sends 125 heartbeats a second, so this is the controller's
most frequent write. Built through SQLAlchemy Core it was nine statements compiled per
call (3.5 ms of store CPU at 10,000 devices); here each statement is a cached string
and the state moves go through ``moves.move_fast``, as the per-job path does.
"""

from __future__ import annotations

from collections.abc import Sequence

from resource_controller.core.states import ACTIVE, DeviceState, JobState, Quarantine
from resource_controller.core.transitions import DEVICE, Op
from resource_controller.store import leases, moves, queries
from resource_controller.store.records import split_ids

_ACTIVE = tuple(str(s.value) for s in ACTIVE)
_IN_ACTIVE = "state IN (" + ", ".join(f"'{s}'" for s in _ACTIVE) + ")"

_LIVE_LEASE = (
    "EXISTS (SELECT 1 FROM leases WHERE leases.device_id = devices.id"
    " AND leases.released_at IS NULL)"
)
_FLAGGED = "jobs.worker_id = ? AND jobs.state = 'killed' AND jobs.kill_requested = 1"
#: A device behind a killed job whose kill is not yet final (its worker still names it),
#: by the job's device or by any lease of a several-device job.
_FLAGGED_KILLED = (
    f"EXISTS (SELECT 1 FROM jobs WHERE jobs.device_id = devices.id AND {_FLAGGED})"
    " OR EXISTS (SELECT 1 FROM leases, jobs WHERE leases.device_id = devices.id"
    f" AND leases.job_id = jobs.id AND {_FLAGGED})"
)


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def heartbeat(
    conn: queries.Conn,
    now: int,
    worker_id: str,
    running: Sequence[str],
    retain: bool,
    pending: Sequence[str] | None = None,
) -> bool:
    """Record a heartbeat: renew the named jobs' leases, restore devices it proves.

    True when it moved a device's state: only then can the heartbeat have changed what
    a scheduling pass would do, so only then does it need one (a fleet of idle workers
    heartbeating must not run a pass per heartbeat).

    ``pending`` are jobs that finished but whose terminal report still waits in the
    worker's outbox. They count as named in every step: their leases
    are renewed, their devices stay (or return to) ``busy``, a ``worker_lost`` device
    behind one is restored, and a finalised kill's flag stays set. *Why: until the
    report lands, the controller has not recorded what happened on the device, so
    it must neither free it nor let its lease lapse into a quarantine.* Nothing here
    changes a job's state, so a pending job is never treated as running again.
    """
    db = conn
    named = [*running, *(pending or [])]
    if not db.execute(
        "UPDATE workers SET last_heartbeat_at = ? WHERE id = ?", (now, worker_id)
    ).rowcount:
        return False
    mine_ids: list[str] = []
    devices: set[str] = set()
    if named:
        rows = db.execute(
            f"SELECT id, device_id, device_ids FROM jobs WHERE id IN ({_marks(len(named))})"
            f" AND worker_id = ? AND {_IN_ACTIVE}",
            (*named, worker_id),
        ).fetchall()
        for job_id, device_id, device_ids in rows:
            mine_ids.append(job_id)
            devices.update(
                split_ids(device_ids) if device_ids else ([device_id] if device_id else [])
            )
    mine_devices = sorted(devices)
    moved = 0
    if mine_ids:
        db.execute(
            f"UPDATE leases SET expires_at = ? WHERE job_id IN ({_marks(len(mine_ids))})"
            " AND released_at IS NULL",
            (now + leases.RENEWAL, *mine_ids),
        )
        if mine_devices:
            moved += moves.move(
                db,
                DEVICE,
                Op.HEARTBEAT_RESTORE,
                f"worker_id = ? AND id IN ({_marks(len(mine_devices))}) AND quarantine_reason = ?",
                (worker_id, *mine_devices, str(Quarantine.WORKER_LOST)),
                state=DeviceState.BUSY,
                quarantine_reason="",
                quarantine_detail="",
                last_heartbeat_at=now,
            )
    # A killed job's flag stops once its worker no longer names it: the process is gone.
    unflag = (
        "UPDATE jobs SET kill_requested = 0 WHERE worker_id = ? AND state = ?"
        " AND kill_requested = 1"
    )
    if named:
        unflag += f" AND id NOT IN ({_marks(len(named))})"
    db.execute(unflag, (worker_id, str(JobState.KILLED), *named))
    if not retain:
        moved += moves.move(
            db,
            DEVICE,
            Op.HEARTBEAT_BUSY,
            f"worker_id = ? AND {_LIVE_LEASE}",
            (worker_id,),
            state=DeviceState.BUSY,
        )
    elif mine_devices:
        moved += moves.move(
            db,
            DEVICE,
            Op.HEARTBEAT_BUSY,
            f"worker_id = ? AND {_LIVE_LEASE} AND id IN ({_marks(len(mine_devices))})",
            (worker_id, *mine_devices),
            state=DeviceState.BUSY,
        )
    moved += moves.move(
        db,
        DEVICE,
        Op.HEARTBEAT_READY,
        f"worker_id = ? AND NOT {_LIVE_LEASE} AND NOT ({_FLAGGED_KILLED})",
        (worker_id, worker_id, worker_id),
        state=DeviceState.READY,
    )
    db.execute("UPDATE devices SET last_heartbeat_at = ? WHERE worker_id = ?", (now, worker_id))
    return moved > 0
