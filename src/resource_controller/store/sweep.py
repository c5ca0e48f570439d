"""The reaper's sweep (store.md §13), one transaction in the spec's order. Nothing here writes
``ready``: silence says nothing of a device."""

from __future__ import annotations

from resource_controller.core import expiry
from resource_controller.core.states import (
    ACTIVE,
    REASON_LEASE_EXPIRED,
    REASON_WORKER_LOST,
    DeviceState,
    JobState,
    Quarantine,
)
from resource_controller.core.transitions import Op
from resource_controller.store import attempts, leases, moves, queries, sql
from resource_controller.store.records import SweepResult

_ACTIVE = tuple(s.value for s in ACTIVE)


def sweep(conn: sql.Db, now: int, rules: expiry.SweepRules) -> SweepResult:
    judging = rules.judging(now)  # read once: devices and leases judged consistently
    unknown, unhealthy, reap = _demote(conn, now, rules, judging)
    requeued: list[str] = []
    lost = [] if rules.retain else _reap(conn, now, reap, requeued)
    expired = _expire(conn, now, rules, requeued) if judging else []
    return SweepResult(unknown, unhealthy, lost, expired, judging, requeued)


#: Devices whose worker was last heard by ``?``; ``CROSS JOIN`` walks the quiet workers first.
_QUIET = (
    "SELECT devices.id, devices.state, workers.last_heartbeat_at"
    " FROM workers CROSS JOIN devices"
    " WHERE devices.worker_id = workers.id AND workers.last_heartbeat_at <= ?"
    " ORDER BY devices.id"
)


def _demote(
    conn: sql.Db, now: int, rules: expiry.SweepRules, judging: bool
) -> tuple[list[str], list[str], list[str]]:
    """Apply silence verdicts; returns (unknown, newly unhealthy, reap set)."""
    # Only devices quiet long enough for some verdict, with a second's margin for float rounding.
    heard_before = now - expiry.quiet_floor(rules, judging) + 1
    rows = conn.execute(_QUIET, (heard_before,)).fetchall()
    unknown: list[str] = []
    unhealthy: list[str] = []
    reap: list[str] = []
    for device_id, state, heard_at in rows:
        verdict = expiry.demotion(state, heard_at, now, rules, judging)
        one = (device_id,)
        if verdict is expiry.Demotion.UNKNOWN:
            if moves.set_devices(conn, Op.SWEEP_UNKNOWN, "id = ?", one, DeviceState.UNKNOWN):
                unknown.append(device_id)
        elif verdict is expiry.Demotion.WRITE_OFF:
            # Only a device not already unhealthy: an existing reason is kept.
            out, why = DeviceState.UNHEALTHY, Quarantine.WORKER_LOST
            if moves.set_devices(conn, Op.WRITE_OFF, "id = ?", one, out, why):
                unhealthy.append(device_id)
            reap.append(device_id)
        elif verdict is expiry.Demotion.REAP_ONLY:
            reap.append(device_id)
    return unknown, unhealthy, reap


def _reap(conn: sql.Db, now: int, reap: list[str], requeued: list[str]) -> list[str]:
    """Every active job on a written-off device -> ``lost``, whatever its worker, unless it
    queues again (then in ``requeued``)."""
    if not reap:
        return []
    marks = sql.marks(len(reap))
    # A several-device job is on a device by any of its live leases.
    victims = queries.jobs_where(
        conn,
        f"(jobs.device_id IN ({marks}) OR jobs.id IN"
        f" (SELECT job_id FROM leases WHERE device_id IN ({marks}) AND released_at IS NULL))"
        f" AND jobs.state IN ({sql.marks(len(_ACTIVE))})",
        (*reap, *reap, *_ACTIVE),
        order="jobs.seq",
    )
    lost: list[str] = []
    for job in victims:
        ended = attempts.end(conn, Op.WRITE_OFF, job, JobState.LOST, REASON_WORKER_LOST, now)
        if ended:
            leases.release_for_job(conn, now, job.id)
            (requeued if ended == JobState.QUEUED else lost).append(job.id)
    return lost


def _expire(conn: sql.Db, now: int, rules: expiry.SweepRules, requeued: list[str]) -> list[str]:
    """End every lapsed live lease by its own ID and quarantine its device; a job that queues
    again goes in ``requeued``, not in what it returns."""
    live = conn.all(
        "SELECT id, device_id, job_id, expires_at, kind FROM leases"
        " WHERE released_at IS NULL ORDER BY acquired_at, id"
    )
    reported: list[str] = []
    for lease_id, device_id, job_id, expires_at, kind in live:
        if not expiry.lease_expires(expires_at, kind, now, rules, judging=True):
            continue
        # By the lease's own ID: job_id may be ''.
        ended = queries.release_leases(conn, now, lease_id, by="id")
        if not ended:
            continue  # a sibling of a several-device job whose lease expired first
        # Expiry ends all of a job's leases and proves none empty: every sibling's device goes out
        # too.
        siblings = leases.release_for_job(conn, now, job_id, first=ended)
        quarantined = [device_id, *siblings]
        where, out = queries.id_in(len(quarantined)), DeviceState.UNHEALTHY
        moves.set_devices(conn, Op.EXPIRE, where, quarantined, out, Quarantine.LEASE_EXPIRED)
        if not job_id:
            reported.append(lease_id)
            continue
        job = queries.job(conn, job_id)
        after = attempts.end(conn, Op.EXPIRE, job, JobState.LOST, REASON_LEASE_EXPIRED, now)
        if after:
            (requeued if after == JobState.QUEUED else reported).append(job_id)
    return reported
